"""Execute the code cells of transformer.ipynb into a module, the way a reader runs them top to bottom.

The notebook is the single source of the code: nothing is copied into .py files. Cells whose first line
is the marker comment `# [slow]` (training, decoding the test set, plots of a trained model) are skipped,
so importing the notebook costs seconds. IPython-only lines (`%pip`, `!cmd`) are dropped.
"""

from __future__ import annotations

import os
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parent.parent / "transformer.ipynb"
SLOW_MARKER = "# [slow]"


def code_cells(path: Path = NOTEBOOK, include_slow: bool = False, until: str | None = None) -> list[str]:
    """The sources of the notebook's code cells in order, without IPython-only lines; with `until` (a heading such as
    "## 3."), only those above the first markdown cell that starts with it."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if until is not None and cell.cell_type == "markdown" and cell.source.startswith(until):
            return cells
        if cell.cell_type != "code":
            continue
        source = cell.source
        if not include_slow and source.lstrip().startswith(SLOW_MARKER):
            continue
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        cells.append("\n".join(lines))
    if until is not None:
        raise ValueError(f"{path.name} has no markdown cell starting with {until!r}")
    return cells


def load_notebook(name: str = "transformer_nb", path: Path = NOTEBOOK, include_slow: bool = False,
                  until: str | None = None) -> types.ModuleType:
    """Run the cells (with `until`, those of the sections above that heading) in one module registered in
    sys.modules (so dataclasses and pickling work)."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    for index, source in enumerate(code_cells(path, include_slow, until)):
        code = compile(source, f"{path.name}:code cell {index}", "exec")
        exec(code, module.__dict__)  # noqa: S102 - executing the notebook is the point
    return module


def _set_environment(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextmanager
def notebook_environment(preset: str, work_dir: str | Path, data_dir: str | Path | None):
    """TRANSFORMER_PRESET / _WORK_DIR / _DATA_DIR set (data_dir None: unset) and the repository root as working
    directory, as a user running the notebook would have them; everything restored on exit."""
    env = {"TRANSFORMER_PRESET": preset, "TRANSFORMER_WORK_DIR": str(work_dir),
           "TRANSFORMER_DATA_DIR": None if data_dir is None else str(Path(data_dir).resolve())}
    saved, cwd = {key: os.environ.get(key) for key in env}, os.getcwd()
    try:
        _set_environment(env)
        os.chdir(NOTEBOOK.parent)
        yield
    finally:
        os.chdir(cwd)
        _set_environment(saved)
