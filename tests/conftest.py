"""Test configuration: seeds, Triton's interpreter on CPU-only machines, threads per xdist worker, device markers, and the
notebook runs marked ``slow``."""

from __future__ import annotations

import importlib
import os
import pkgutil

import pytest
import torch

# On a machine without a GPU the Triton kernels run in Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A ``triton.jit`` function takes the interpreter setting of the moment its module is imported:
# every kernel module is imported now, so that none is first imported inside a test that pretends
# a GPU with TRITON_INTERPRET=0 (the dispatch tests), which would leave compiled-mode kernels for
# the interpreted tests after it in the same worker ("0 active drivers").
import gmlp.triton_ref  # noqa: E402  (after the setting above)

for _module in pkgutil.iter_modules(gmlp.triton_ref.__path__):
    importlib.import_module(f"gmlp.triton_ref.{_module.name}")

# Under pytest-xdist the workers share the cores: each takes its share of intra-op threads (and
# hands it on to the processes it starts), instead of every worker using them all (on 2 cores,
# 2 workers: 545 s for the suite against 720 s with torch's default threads).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Tests simulate devices and packages that a cached layer plan would outlive."""
    from gmlp.dispatch.plan_cache import clear_plan_cache

    clear_plan_cache()
    yield
    clear_plan_cache()


def _executes_a_notebook(item) -> bool:
    """tests/test_notebooks.py's tests that run a notebook (through its ``_executed``, or ``_figure``
    which calls it): 80-100 s together on two cores, so they are ``slow``."""
    if item.path.name != "test_notebooks.py":
        return False
    return bool({"_executed", "_figure"} & set(item.function.__code__.co_names))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if _executes_a_notebook(item):
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on an H100 or H200 (see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
