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
    sizes on this CPU. Its notebook part runs a copy of the notebook with every code cell doubled (--notebook), so that
    one kernel run serves the dry run, the smoke run and the re-run test of test_end_to_end.py; test_tools.py reads
    the rest."""
    import nbformat
    from nbloader import NOTEBOOK

    out, folder = tmp_path_factory.mktemp("gpu_dry_run"), tmp_path_factory.mktemp("doubled")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells = [twin for cell in nb.cells for twin in ([cell, nbformat.v4.new_code_cell(cell.source)]
                                                      if cell.cell_type == "code" else [cell])]
    nbformat.write(nb, folder / "transformer.ipynb")
    done = subprocess.run([sys.executable, "tests/tools/gpu_run.py", str(out), "--dry-run", "--budget-s", "3000",
                           "--notebook", str(folder / "transformer.ipynb")],
                          cwd=ROOT, capture_output=True, text=True, timeout=3300, check=False)
    return out, done
