"""Shared fixtures: the notebook imported once per session on the smoke preset, run from the repository root; and the
fixtures that several test files use."""

from __future__ import annotations

import matplotlib
import pytest
from helpers import SLICE, train_tiny

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
