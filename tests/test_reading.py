"""What a reader sees, counted from the notebook file the way Colab shows it (issue 22).

A code cell whose first line is `# @title ...` and whose cell metadata holds `"cellView": "form"` shows in Colab
as one titled line, its code folded behind *Show code*: it counts as one line. Markdown prose is counted in words,
without table rows and fenced code. "Before the model" runs to the heading of section 5.
"""

from __future__ import annotations

import base64
import json
import re

import nbformat
import pytest
from helpers import NOTEBOOK, ROOT

MODEL_HEADING = re.compile(r"^## 5\. ", re.MULTILINE)


def prose_words(markdown: str) -> int:
    """Words of prose: table rows (lines starting with '|') and fenced code blocks left out."""
    kept, fenced = [], False
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and not line.lstrip().startswith("|"):
            kept.append(line)
    return len(" ".join(kept).split())


def is_folded(cell) -> bool:
    return (cell.cell_type == "code" and cell.metadata.get("cellView") == "form"
            and cell.source.lstrip().startswith("# @title "))


def screen_lines(cell) -> int:
    """Lines of code Colab shows: 1 for a folded form cell (its title), else every line."""
    return 1 if is_folded(cell) else len(cell.source.splitlines())


@pytest.fixture(scope="module")
def cells():
    return nbformat.read(NOTEBOOK, as_version=4).cells


def before_model(cells):
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown" and MODEL_HEADING.search(cell.source):
            return cells[:index]
    raise AssertionError("no '## 5. ' heading: where does the model section start?")


def test_counting_rules_on_a_tiny_example():
    markdown = "# Title\n\nTwo words.\n\n| a | b |\n| --- | --- |\n\n```\ncode here\n```\nend"
    assert prose_words(markdown) == 5  # '#', 'Title', 'Two', 'words.', 'end'
    folded = nbformat.v4.new_code_cell("# @title Why it exists\nx = 1\ny = 2", metadata={"cellView": "form"})
    plain = nbformat.v4.new_code_cell("# @title Not folded: no metadata\nx = 1")
    assert (screen_lines(folded), screen_lines(plain)) == (1, 2)


def test_the_road_to_the_model_is_short(cells):
    road = before_model(cells)
    words = sum(prose_words(c.source) for c in road if c.cell_type == "markdown")
    lines = sum(screen_lines(c) for c in road if c.cell_type == "code")
    assert words <= 700, f"{words} words of prose before the model section (at most 700)"
    assert lines <= 120, f"{lines} lines of code on screen before the model section (at most 120)"


def test_title_and_table_of_differences_are_short(cells):
    title, table = cells[0], cells[1]
    assert title.cell_type == table.cell_type == "markdown" and "| the paper" in table.source
    words = prose_words(title.source) + prose_words(table.source)
    assert words <= 250, f"title cell and table cell: {words} words besides the table (at most 250)"


def test_prose_is_short_everywhere(cells):
    sizes = {i: prose_words(c.source) for i, c in enumerate(cells) if c.cell_type == "markdown"}
    assert sum(sizes.values()) <= 4500, f"{sum(sizes.values())} words of prose in all (at most 4,500)"
    long = {i: n for i, n in sizes.items() if n > 250}
    assert not long, f"markdown cells over 250 words (cell index: words): {long}"


BARE_SECTION_SIGN = re.compile("(?<!paper )\u00a7\\s*[\\d.]*")  # the section sign, not preceded by "paper "


def test_no_bare_section_sign(cells):
    """'paper §3.2' for the paper, 'section 5.3' for the notebook: a section sign alone is ambiguous. Every cell,
    code included, the files under tests/ and README.md."""
    bare = [(f"cell {i}", m.group(0)) for i, c in enumerate(cells) for m in BARE_SECTION_SIGN.finditer(c.source)]
    for path in [ROOT / "README.md", *sorted((ROOT / "tests").rglob("*.py"))]:
        bare += [(path.name, m.group(0)) for m in BARE_SECTION_SIGN.finditer(path.read_text(encoding="utf-8"))]
    assert not bare, f"a section sign without 'paper' (where, text): {bare[:10]}"


def test_folded_cells_are_marked_both_ways(cells):
    """A `# @title` line without the form metadata would not fold in Colab, and the reverse shows an empty title."""
    for index, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        titled = cell.source.lstrip().startswith("# @title ")
        form = cell.metadata.get("cellView") == "form"
        assert titled == form, f"code cell {index}: '# @title' and cellView 'form' must come together"
        if form:
            assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, f"code cell {index}: not folded in Jupyter"


def test_every_code_cell_is_under_70_lines(cells):
    """A cell a reader can take in: 5-40 lines for the concepts, and no machinery cell past 70 either."""
    long = {i: len(c.source.splitlines()) for i, c in enumerate(cells) if c.cell_type == "code"
            and len(c.source.splitlines()) >= 70}
    assert not long, f"code cells of 70 lines or more (cell index: lines): {long}"


def test_the_notebook_file_is_valid_for_its_format():
    """Cell ids in a file of nbformat 4.4 made every `jupyter execute` print "Notebook JSON is invalid" first."""
    nbformat.validate(json.loads(NOTEBOOK.read_text(encoding="utf-8")))


def test_the_architecture_figure_is_attached_where_the_model_section_opens(cells):
    """Section 5 opens with paper Figure 1 as built here, an image attached to the markdown (drawn by
    tests/tools/draw_architecture.py): it shows in Colab and on GitHub without running a cell."""
    opening = next(c for c in cells if c.cell_type == "markdown" and MODEL_HEADING.search(c.source))
    png = base64.b64decode(opening.get("attachments", {}).get("architecture.png", {}).get("image/png", ""))
    assert "(attachment:architecture.png)" in opening.source and png.startswith(b"\x89PNG\r\n\x1a\n")


def test_the_notebook_is_at_most_1650_code_lines_and_450_folded(cells):
    """Issue 43's size: non-blank lines of all code cells, and of the folded ones (the machinery behind the lesson)."""
    def lines(cell):
        return sum(1 for line in cell.source.splitlines() if line.strip())

    code = [c for c in cells if c.cell_type == "code"]
    total, folded = sum(map(lines, code)), sum(lines(c) for c in code if is_folded(c))
    assert total <= 1650 and folded <= 450, f"{total} code lines ({folded} folded): at most 1,650 (450 folded)"


def test_the_model_comes_soon_after_few_folded_cells(cells):
    """Issue 43: at most 6 folded cells before section 5 (13 before it), and the model's first code by cell 20 (31)."""
    road = before_model(cells)
    folded = [i for i, c in enumerate(road) if is_folded(c)]
    assert len(folded) <= 6, f"{len(folded)} folded cells before the model section (at most 6): cells {folded}"
    first = next(i for i, c in enumerate(cells) if i >= len(road) and c.cell_type == "code")
    assert first <= 20, f"the model's first code is cell {first} (at most 20)"


def test_no_bookkeeping_call_in_a_lesson_cell(cells):
    """Records of what was made and checks that a cell ran live behind the set-up cell (its IPython hooks), never as a
    call in a visible cell."""
    calls = re.compile(r"\b(?:made|built|check_built)\(")
    found = {i: calls.findall(c.source) for i, c in enumerate(cells) if c.cell_type == "code" and not is_folded(c)}
    found = {i: f for i, f in found.items() if f}
    assert not found, f"bookkeeping calls in visible cells (index: calls): {found}"


def test_readme_is_a_front_page_of_at_most_1800_words():
    text = re.sub(r"```.*?```", "", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.DOTALL)
    assert len(text.split()) <= 1800, f"README.md has {len(text.split())} words besides its fenced code"
