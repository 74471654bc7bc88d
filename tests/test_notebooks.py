"""Every notebook in notebooks/ runs top to bottom without error (they teach the API, so they must track it),
and is committed with its outputs (a reader on GitHub sees the tables and plots without running it); a few cells
and figures, run here, show what they are there to show."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from gmlp.dispatch.sites import SITES

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300

# Figures the tests look at: after the code cell whose source holds the key, a probe cell prints the
# legend entries and texts of `fig` (the notebooks' name for the figure a cell draws) as JSON
FIGURES = {"03_debugging.ipynb": "row_error", "04_hopper_kernels.ipynb": "open(DECODE_JSON)"}
FIGURE_PROBE = """\
import json as _json, matplotlib.colors as _colors
def _style(handle):  # what tells one legend entry from another: colour, marker, hatch
    line = hasattr(handle, "get_marker")
    return [_colors.to_hex(handle.get_color() if line else handle.get_facecolor()),
            handle.get_marker() if line else None, None if line else handle.get_hatch()]
_legends = [legend for legend in (*fig.legends, *(ax.get_legend() for ax in fig.axes)) if legend]
print(_json.dumps(dict(
    legend=[[text.get_text(), _style(handle)] for legend in _legends
            for text, handle in zip(legend.get_texts(), legend.legend_handles)],
    texts=[text.get_text() for ax in fig.axes for text in ax.texts])))
"""


class _ThisInterpreter(KernelSpecManager):
    """Every kernel name resolves to ipykernel on the interpreter running pytest.

    An installed "python3" spec may point at another Python (a user-level spec, another venv);
    building the spec here makes the kernel this venv's, and writes nothing outside the repo.
    """

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python 3 ({sys.executable})",
            language="python",
            resource_dir=str(REPO_ROOT),
        )


def _check_cell() -> nbformat.NotebookNode:
    """A first cell that fails if the kernel is not this interpreter or imports another gmlp."""
    return nbformat.v4.new_code_cell(
        "import sys, gmlp\n"
        f"assert sys.prefix == {sys.prefix!r}, f'kernel runs {{sys.executable}}, not {sys.executable}'\n"
        f"assert gmlp.__file__.startswith({str(REPO_ROOT)!r}), f'imported {{gmlp.__file__}}, not the working tree'\n"
    )


def test_notebooks_exist():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@functools.cache
def _executed(path: Path) -> nbformat.NotebookNode:
    """The notebook run top to bottom (once per session), with the interpreter check in front and
    the figure probe after its FIGURES cell."""
    nb = nbformat.read(path, as_version=4)
    key = FIGURES.get(path.name)
    probed = [i for i, cell in enumerate(nb.cells) if key and cell.cell_type == "code" and key in cell.source]
    assert len(probed) == (1 if key else 0), f"{path.name}: {len(probed)} cells hold {key!r}"
    for i in probed:
        nb.cells.insert(i + 1, nbformat.v4.new_code_cell(FIGURE_PROBE))
    nb.cells.insert(0, _check_cell())

    # Kernel: this interpreter, the repo importable, figures off-screen
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisInterpreter())

    # Run; nbclient raises CellExecutionError with the failing cell's traceback
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(REPO_ROOT)}})
    client.execute(env=env)
    return nb


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(out.text for out in cell.outputs if out.output_type == "stream" and out.name == "stdout")


def _figure(name: str) -> dict:
    """The probe's description of the figure of the notebook's FIGURES cell."""
    cells = _executed(NOTEBOOK_DIR / name).cells
    (i,) = [i for i, cell in enumerate(cells) if cell.source == FIGURE_PROBE]
    return json.loads(_stdout(cells[i]))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    _executed(path)


def test_forced_backend_cell_shows_every_site_on_torch():
    # 03's GMLP_BACKEND cell: a table of site, default path, forced path, then a FallbackError
    (cell,) = [cell for cell in _executed(NOTEBOOK_DIR / "03_debugging.ipynb").cells
               if cell.cell_type == "code" and "GMLP_BACKEND" in cell.source]
    text = _stdout(cell)
    table = {columns[0]: columns[1:] for columns in (re.split(r"\s{2,}", line.strip()) for line in text.splitlines())
             if columns[0] in SITES}
    assert set(table) == {name for name, site in SITES.items() if not site.bias_only and site.sm100 is not True}, text
    assert all(columns[-1] == "torch" for columns in table.values()), text
    assert "FallbackError: GMLP_BACKEND=" in text, text


def test_debugging_plot_labels_exact_zeros():
    # 03's per-row error plot, on a log axis: rows with no difference are drawn at a floor that says so
    figure = _figure("03_debugging.ipynb")
    labels = [label for label, _ in figure["legend"]] + figure["texts"]
    assert any("exact zero" in label for label in labels), labels


def test_configuration_chart_legend_is_readable():
    # 04's chart of every SM90 configuration: a short legend, no two entries drawn alike
    legend = _figure("04_hopper_kernels.ipynb")["legend"]
    styles = [tuple(style) for _, style in legend]
    assert 0 < len(legend) <= 8, legend
    assert len(set(styles)) == len(styles), legend


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_committed_with_outputs(path: Path):
    # The file as committed, not executed here: outputs present, at least one plot, no error
    nb = nbformat.read(path, as_version=4)
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert outputs, f"{path.name} has no outputs: execute it and save it with its outputs"
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{path.name} has no image/png output"
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, f"{path.name} was saved with an error output: {errors[0].ename}: {errors[0].evalue}"
