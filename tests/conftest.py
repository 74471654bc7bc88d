"""Test configuration: seeds, Triton's interpreter on CPU-only machines, and device markers."""

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
    from gmlp.layer_config import clear_plan_cache

    clear_plan_cache()
    yield
    clear_plan_cache()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; run on the H200 (see README)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
