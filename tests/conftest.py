"""Shared fixtures: the notebook imported once per session on the smoke preset, run from the repository root; and the
fixtures that several test files use."""

from __future__ import annotations

import subprocess
import sys

import matplotlib
import pytest
from helpers import ROOT, SLICE, train_tiny

matplotlib.use("Agg")


@pytest.fixture(scope="session")
def nb(tmp_path_factory):
    """The notebook's definitions (slow cells skipped), built with TRANSFORMER_PRESET=smoke."""
    from nbloader import load_notebook, notebook_environment

    with notebook_environment("smoke", tmp_path_factory.mktemp("work"), SLICE):
        module = load_notebook()
    import matplotlib.pyplot as plt

    plt.close("all")
    return module


@pytest.fixture(scope="module")
def fp32_run(nb, tmp_path_factory):
    """The tiny model trained STEPS steps in fp32 on the GPU's path (helpers.train_tiny): the reference of the
    autocast steps (test_08_training.py) and a model to decode (test_10_decoding.py)."""
    return train_tiny(nb, tmp_path_factory.mktemp("fp32"), None)


@pytest.fixture(scope="session")
def gpu_dry_run(tmp_path_factory):
    """(OUT folder, finished process) of `python3 tests/tools/gpu_run.py OUT --dry-run`: the GPU command at smoke
    sizes on this CPU. Its notebook part runs a copy of the notebook in which the cells that must survive a re-run,
    section 8's training cell and section 11's evaluation cell (found by what they call: tools/common.py), are each
    followed by a copy of themselves marked `"re_run": true` in its metadata; so one kernel run serves the dry run,
    the smoke run and the re-run test of test_end_to_end.py. No such cell found: an error, not a silent pass."""
    import nbformat
    from tools import common

    out, folder = tmp_path_factory.mktemp("gpu_dry_run"), tmp_path_factory.mktemp("doubled")
    nb = common.read_notebook()
    doubled = {common.training_cell(nb), common.evaluation_cell(nb)}  # LookupError: the notebook changed
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        if i in doubled:
            twin = nbformat.v4.new_code_cell(cell.source, metadata={"re_run": True})
            twin.pop("id", None)  # cell ids are not part of the notebook's format version (4.4)
            cells.append(twin)
    nb.cells = cells
    nbformat.write(nb, folder / "transformer.ipynb")
    done = subprocess.run([sys.executable, "tests/tools/gpu_run.py", str(out), "--dry-run", "--budget-s", "3000",
                           "--notebook", str(folder / "transformer.ipynb")],
                          cwd=ROOT, capture_output=True, text=True, timeout=3300, check=False)
    return out, done
