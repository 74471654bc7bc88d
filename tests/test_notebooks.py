"""Every notebook in notebooks/ runs top to bottom without error (they teach the API, so they must track it),
and is committed with its outputs (a reader on GitHub sees the tables and plots without running it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


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
    assert NOTEBOOKS, f"no notebooks found in {REPO_ROOT / 'notebooks'}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    # Notebook, with the interpreter check in front
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, _check_cell())

    # Kernel: this interpreter, the repo importable, figures off-screen
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    km = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisInterpreter())

    # Run; nbclient raises CellExecutionError with the failing cell's traceback
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(REPO_ROOT)}})
    client.execute(env=env)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_committed_with_outputs(path: Path):
    # The file as committed, not executed here: outputs present, at least one plot, no error
    nb = nbformat.read(path, as_version=4)
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert outputs, f"{path.name} has no outputs: execute it and save it with its outputs"
    assert any("image/png" in out.get("data", {}) for out in outputs), f"{path.name} has no image/png output"
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, f"{path.name} was saved with an error output: {errors[0].ename}: {errors[0].evalue}"
