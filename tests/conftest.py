"""Shared fixtures: the notebook imported once per session on the smoke preset, run from the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "data" / "multi30k"


@pytest.fixture(scope="session")
def nb(tmp_path_factory):
    """The notebook's definitions (slow cells skipped), built with TRANSFORMER_PRESET=smoke."""
    from nbloader import load_notebook

    work = tmp_path_factory.mktemp("work")
    env = {"TRANSFORMER_PRESET": "smoke", "TRANSFORMER_WORK_DIR": str(work), "TRANSFORMER_DATA_DIR": str(SLICE)}
    saved = {key: os.environ.get(key) for key in env}
    cwd = os.getcwd()
    os.environ.update(env)
    os.chdir(ROOT)
    try:
        module = load_notebook()
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    import matplotlib.pyplot as plt

    plt.close("all")
    return module
