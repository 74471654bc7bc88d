"""Test configuration: seeds, Triton's interpreter on CPU-only machines, device markers, and the
notebook runs marked ``slow``."""

from __future__ import annotations

import os

import pytest
import torch

# On a machine without a GPU the Triton kernels run in Triton's interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the H200 (see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
