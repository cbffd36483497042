"""The whole notebook, top to bottom, as a user runs it: `TRANSFORMER_PRESET=smoke`, no data folder named
(so it must find the Multi30k slice kept in tests/data), a fresh work folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "transformer.ipynb"
BLEU_LINE = re.compile(r"BLEU = +(\d+\.\d+) on \d+ test sentences \(cased, detokenized references\)")


def execute(nb: nbformat.NotebookNode, work: Path, monkeypatch) -> nbformat.NotebookNode:
    """Run the notebook in a real kernel from the repository root with the smoke preset."""
    monkeypatch.setenv("TRANSFORMER_PRESET", "smoke")
    monkeypatch.setenv("TRANSFORMER_WORK_DIR", str(work))
    monkeypatch.delenv("TRANSFORMER_DATA_DIR", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    return nb


def text_of(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def test_committed_notebook_is_clean():
    """No outputs, execution counts or Colab/widget metadata in the committed file."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not {"colab", "widgets", "accelerator"} & set(nb.metadata)


def test_whole_notebook_runs_on_smoke_preset(tmp_path, monkeypatch):
    nb = execute(nbformat.read(NOTEBOOK, as_version=4), tmp_path, monkeypatch)
    output = "\n".join(text_of(c) for c in nb.cells if c.cell_type == "code")
    assert "data_dir: tests/data/multi30k" in output  # the slice kept in the repository, found without help
    assert "TqdmWarning" not in output  # stderr streams count too
    assert "matches nn.MultiheadAttention on copied weights: causal yes" in output
    failed = re.findall(r"^.*: no(?: \(| \||$).*$", output, flags=re.MULTILINE)  # a check ends in a yes/no verdict
    assert not failed, failed
    history = json.loads((tmp_path / "history.json").read_text())
    assert history["train_loss"][-1] < history["train_loss"][0] - 1.0, "training loss did not fall"
    assert history["val_loss"][-1] < history["val_loss"][0], "validation loss did not fall"
    scores = [float(s) for s in BLEU_LINE.findall(output)]
    assert len(scores) == 6, output[-3000:]  # last, final-stretch and epoch-end averages; greedy and beam
    assert all(s > 1.0 for s in scores), scores
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in output
    assert re.search(r"keeping the (last|final-stretch average of 3|epoch-end average of 3) weights for what follows "
                     r"\(greedy BLEU on 200 validation", output)
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results["bleu"].values()) == sorted(scores)
    assert results["preset"] == "smoke" and results["test_sentences"] == 200


def test_every_cell_run_twice_changes_nothing(tmp_path, monkeypatch):
    """Re-running any cell (the training cell included) leaves no duplicated state: each cell is executed
    twice in a row, and the second run of the evaluation cell prints the same scores as the first."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    doubled = []
    for cell in nb.cells:
        doubled.append(cell)
        if cell.cell_type == "code":
            doubled.append(nbformat.v4.new_code_cell(cell.source))
    nb.cells = doubled
    execute(nb, tmp_path, monkeypatch)
    bleu_runs = [c for c in nb.cells if c.cell_type == "code" and BLEU_LINE.search(text_of(c))]
    assert len(bleu_runs) == 2
    assert BLEU_LINE.findall(text_of(bleu_runs[0])) == BLEU_LINE.findall(text_of(bleu_runs[1]))
    train_runs = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("# [slow] trains")]
    assert "resumed from" in text_of(train_runs[1]) and "epoch   1:" not in text_of(train_runs[1])
