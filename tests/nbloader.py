"""Execute the code cells of transformer.ipynb into a module, the way a reader runs them top to bottom.

The notebook is the single source of the code: nothing is copied into .py files. Cells whose first line
is the marker comment `# [slow]` (training, decoding the test set, plots of a trained model) are skipped,
so importing the notebook costs seconds. IPython-only lines (`%pip`, `!cmd`) are dropped.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parent.parent / "transformer.ipynb"
SLOW_MARKER = "# [slow]"


def code_cells(path: Path = NOTEBOOK, include_slow: bool = False) -> list[str]:
    """The sources of the notebook's code cells in order, without IPython-only lines."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        if not include_slow and source.lstrip().startswith(SLOW_MARKER):
            continue
        lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
        cells.append("\n".join(lines))
    return cells


def load_notebook(name: str = "transformer_nb", path: Path = NOTEBOOK, include_slow: bool = False) -> types.ModuleType:
    """Run the cells in one module registered in sys.modules (so dataclasses and pickling work)."""
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    for index, source in enumerate(code_cells(path, include_slow)):
        code = compile(source, f"{path.name}:code cell {index}", "exec")
        exec(code, module.__dict__)  # noqa: S102 - executing the notebook is the point
    return module
