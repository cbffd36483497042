"""Section 13, results: the published run under results/cpu. README quotes its scores exactly, and it is what the
notebook wrote.

The run is `TRANSFORMER_PRESET=cpu TRANSFORMER_PROGRESS=0 jupyter execute` of the notebook at the commit named in
results/cpu/README.md; its results.json and history.json are the files the notebook wrote into its work folder.
"""

from __future__ import annotations

import json
import re

import nbformat
from helpers import ROOT

RUN = ROOT / "results" / "cpu"
ROW = re.compile(r"^\| `cpu` \| (?P<weights>[^|]+?) \| (?P<method>[^|]+?) \| (?P<bleu>\d+\.\d\d) \|", re.MULTILINE)


def test_readme_quotes_the_published_cpu_scores_exactly():
    results = json.loads((RUN / "results.json").read_text())
    readme = (ROOT / "README.md").read_text()
    quoted = {f"{m['weights']}, {m['method']}": float(m["bleu"]) for m in ROW.finditer(readme)}
    assert quoted, "README has no rows of the cpu results table"
    assert quoted == results["bleu"]
    assert results["preset"] == "cpu" and results["test_sentences"] == 1000
    chosen = results["chosen_on_validation"]  # section 11's sweep chose it; its test scores are rows of the table
    assert f"{results['kept']}, {chosen}" in quoted and "`chosen_on_validation`" in readme


def test_published_notebook_holds_the_same_scores_and_its_figures():
    nb = nbformat.read(RUN / "transformer.ipynb", as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    results = json.loads((RUN / "results.json").read_text())
    for score in results["bleu"].values():
        assert f"BLEU = {score:5.2f}" in text
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert images >= 10, images
    assert text.count("\r") < 50, "progress bars were recorded: run with TRANSFORMER_PROGRESS=0"
    history = json.loads((RUN / "history.json").read_text())
    assert history["epoch_step"] and len(history["val_nll"]) == len(history["epoch_step"])
