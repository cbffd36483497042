"""What the tools under tests/tools (and tests/exercises.py) share, each done once: the repository's paths, the commit a
run is made from, JSON and notebooks written whole, waiting for a device, the notebook's code cells found by what
they do, section 1's `cfg = make_config()` line given settings, and the notebook run two ways: its cells in this
process (slow cells skipped), or the whole notebook in a Jupyter kernel (nbclient).

Import it as `common` from a tool (tests/tools is on sys.path there) or as `tools.common` from tests/.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/tools/common.py: the repository root
TESTS = ROOT / "tests"
TOOLS = TESTS / "tools"
NOTEBOOK = ROOT / "transformer.ipynb"
SLOW_MARKER = "# [slow]"  # the first line of a cell that pytest's loader skips (tests/nbloader.py)
CONFIG_LINE = re.compile(r"^cfg = make_config\(\)(?P<comment>\s*#.*)?$", re.MULTILINE)

if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))  # nbloader.py


def current_commit(dirty_paths: tuple[str, ...] = ()) -> str | None:
    """$GPU_RUN_COMMIT (a device gets the files without .git), else git's HEAD; with dirty_paths, " (with uncommitted
    changes)" appended when git sees one of them changed."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    commit = os.environ.get("GPU_RUN_COMMIT") or git("rev-parse", "HEAD") or None
    if commit and dirty_paths and git("status", "--porcelain", "--", *dirty_paths):
        commit += " (with uncommitted changes)"
    return commit


def write_text(path: Path, text: str) -> None:
    """`text` into `path` whole: a temporary file, then a rename (a run killed meanwhile leaves the last version)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, data, indent: int | None = 1) -> None:
    """`data` as JSON into `path` whole (write_text)."""
    write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def write_notebook(nb, path: Path) -> None:
    """An nbformat notebook into `path` whole, in nbformat's own style (the repository's)."""
    import nbformat

    write_text(path, nbformat.writes(nb))


def sync(device=None) -> None:
    """Wait for the GPU's queued work (a no-op on a CPU): before reading a clock."""
    import torch

    if (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------------------------------
# the notebook's cells, found by what they do


def _syntax_tree(source: str) -> ast.AST:
    """The cell's syntax tree, IPython-only lines dropped; an empty module for a cell that does not parse."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        return ast.parse(code)
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def _called_names(source: str) -> set[str]:
    """The plain names the cell calls (`train(...)`, not `model.train()`)."""
    tree = _syntax_tree(source)
    return {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def _assigned_names(source: str) -> set[str]:
    """The plain names the cell assigns."""
    tree = _syntax_tree(source)
    return {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
            for target in ast.walk(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            if isinstance(target, ast.Name)}


def is_slow(cell) -> bool:
    return cell.cell_type == "code" and cell.source.lstrip().startswith(SLOW_MARKER)


def cells_calling(nb, name: str, slow: bool | None = True) -> list[int]:
    """Indices of the code cells that call the function `name` at their top level or inside (slow=True: only `# [slow]`
    cells, the ones that run the lesson's functions; None: any). Raises LookupError, naming what was looked for,
    when there is none: a tool that relies on a cell must not go on without it."""
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (slow is None or is_slow(c) == slow)
             and name in _called_names(c.source)]
    if not found:
        kind = {True: "`# [slow]` ", False: "fast ", None: ""}[slow]
        raise LookupError(f"no {kind}code cell of the notebook calls {name}(): the notebook changed, update "
                          f"tests/tools/common.py's callers")
    return found


def cells_assigning(nb, name: str) -> list[int]:
    """Indices of the code cells that assign `name` (LookupError when none does)."""
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and name in _assigned_names(c.source)]
    if not found:
        raise LookupError(f"no code cell of the notebook assigns {name}: the notebook changed")
    return found


def training_cell(nb) -> int:
    """The `# [slow]` cell that runs section 8's train()."""
    return cells_calling(nb, "train")[0]


def evaluation_cell(nb) -> int:
    """The first `# [slow]` cell after the training cell that calls evaluate(): section 11's evaluation (the sweep's
    cell, later, may call it again)."""
    after = [i for i in cells_calling(nb, "evaluate") if i > training_cell(nb)]
    if not after:
        raise LookupError("no `# [slow]` cell after the training cell calls evaluate(): the notebook changed")
    return after[0]


def with_settings(nb, settings: dict):
    """The notebook (changed in place, and returned) with section 1's line `cfg = make_config()` made
    `cfg = make_config(**settings)`, so that everything the cells make follows the settings. The line must occur
    exactly once in the code cells (ValueError otherwise)."""
    hits = [(i, m) for i, c in enumerate(nb.cells) if c.cell_type == "code" for m in CONFIG_LINE.finditer(c.source)]
    if len(hits) != 1:
        raise ValueError(f"the line `cfg = make_config()` occurs {len(hits)} times in the notebook's code cells, not "
                         "once: the notebook changed, update tests/tools/common.py")
    i, match = hits[0]
    line = f"cfg = make_config(**{settings!r})" + (match["comment"] or "")
    nb.cells[i].source = nb.cells[i].source[: match.start()] + line + nb.cells[i].source[match.end():]
    return nb


def read_notebook(path: Path = NOTEBOOK):
    import nbformat

    return nbformat.read(path, as_version=4)


def stream_text(nb) -> str:
    """What the code cells of an executed notebook printed (stdout and stderr)."""
    return "\n".join("".join(o.get("text", "") for o in c.get("outputs", []) if o.output_type == "stream")
                     for c in nb.cells if c.cell_type == "code")


# ---------------------------------------------------------------------------------------------------------------------
# the notebook run: in this process, or in a kernel


def free_module_name() -> str:
    """A module name no loaded module has: this file is imported twice in the suite (as `common` by the tools and as
    `tools.common` by the tests), so a counter of its own would repeat names."""
    return next(name for n in itertools.count(1) if (name := f"transformer_nb_{n}") not in sys.modules)


def load_notebook_module(preset: str, data_dir: str | Path | None, work_dir: str | Path, path: Path | None = None):
    """The notebook's definitions for `preset` (its cells run in this process, `# [slow]` cells skipped), its output
    swallowed (shown only if loading fails); `path`: another copy of the notebook (one with settings of its own).
    Each load has a module name of its own: the test suite's copy keeps its name in sys.modules (model_code looks
    the model's names up there)."""
    import matplotlib

    matplotlib.use("Agg")
    from nbloader import load_notebook, notebook_environment

    log = io.StringIO()
    try:
        with notebook_environment(preset, work_dir, data_dir or None), contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            module = load_notebook(free_module_name(), path=Path(path or NOTEBOOK))
    except BaseException:
        print(log.getvalue()[-5000:], file=sys.stderr)
        raise
    import matplotlib.pyplot as plt

    plt.close("all")
    return module


@contextlib.contextmanager
def environment(values: dict[str, str | None]):
    """os.environ with `values` set (None: unset), restored on exit."""
    def apply(mapping: dict) -> None:
        for key, value in mapping.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    saved = {key: os.environ.get(key) for key in values}
    apply(values)
    try:
        yield
    finally:
        apply(saved)


def execute_notebook(nb, env: dict[str, str | None], cwd: str | Path = ROOT, save_to: Path | None = None,
                     timeout: int | None = None):
    """Run the whole notebook `nb` (an nbformat notebook, changed in place and returned) in a python3 Jupyter kernel
    started with `env` added to this process's environment (TRANSFORMER_PRESET, _WORK_DIR, _DATA_DIR, ...) and `cwd`
    as its working directory. With save_to, the executed notebook is written there whole after every cell, so that a
    run cut short keeps what it did. A failing cell raises nbclient's CellExecutionError (the notebook up to it is
    saved); a dead kernel, DeadKernelError."""
    from nbclient import NotebookClient

    def save(**_) -> None:
        if save_to is not None:
            write_notebook(nb, save_to)

    with environment({"MPLBACKEND": "Agg", **env}):
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}}, on_cell_executed=save)
        try:
            client.execute()
        finally:
            save()
    return nb


def notebook_env(preset: str, work_dir: str | Path, data_dir: str | Path | None = None, **more: str | None) -> dict:
    """The environment a notebook run gets: the preset, the work folder, the data folder (None: the preset's own
    data, or the repository's slice for smoke), no progress bars; `more` added."""
    return {"TRANSFORMER_PRESET": preset, "TRANSFORMER_WORK_DIR": str(work_dir), "TRANSFORMER_PROGRESS": "0",
            "TRANSFORMER_DATA_DIR": str(Path(data_dir).resolve()) if data_dir else None, **more}


def newest(folder: Path, name: str) -> Path | None:
    """The most recently written file called `name` under `folder` (a run's results.json lies in its run subfolder of
    the work folder), or None."""
    found = [p for p in Path(folder).rglob(name) if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def keep_run_files(work: Path, out: Path) -> None:
    """Copy the training run's results.json and history.json into `out`: the notebook writes them into the run's
    subfolder of the work folder (<work>/<preset>-<hash>/run-<hash>/), the newest if several (exercises.py's runs,
    gpu_run.py's notebook part)."""
    out.mkdir(parents=True, exist_ok=True)
    for file in ("results.json", "history.json"):
        if (found := newest(work, file)) is not None:
            (out / file).write_bytes(found.read_bytes())
