"""Shared fixtures: the notebook imported once per session on the smoke preset, run from the repository root."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "multi30k"


@pytest.fixture(scope="session")
def nb(tmp_path_factory):
    """The notebook's definitions (slow cells skipped), built with TRANSFORMER_PRESET=smoke."""
    from nbloader import load_notebook, notebook_environment

    with notebook_environment("smoke", tmp_path_factory.mktemp("work"), SLICE):
        module = load_notebook()
    import matplotlib.pyplot as plt

    plt.close("all")
    return module
