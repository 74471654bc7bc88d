"""The kernel paths a test can run here, each with the reason when it cannot."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from gmlp.dispatch.paths import Path, system_reason
from gmlp.dispatch.quantize import launcher
from gmlp.mxfp8.tensor import MXFP8Tensor
from gmlp.triton_ref.tuning import GemmTiling, WgradTiling


def kernel_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def quantize_launcher(path: Path):
    """The quantize launcher of ``path``, or pytest.skip with the dispatcher's reason."""
    reason = system_reason(path, kernel_device())
    if reason is not None:
        pytest.skip(f"{path.value} cannot run here: {reason}")
    return launcher(path, kernel_device())


def triton_op(module: str, name: str):
    """A Triton launcher (gmlp.triton_ref.<module>.<name>), or pytest.skip with the reason."""
    reason = system_reason(Path.TRITON, kernel_device())
    if reason is not None:
        pytest.skip(f"triton cannot run here: {reason}")
    return getattr(importlib.import_module(f"gmlp.triton_ref.{module}"), name)


KERNEL_PATHS = [Path.TRITON, Path.CUTEDSL]


# Small tiles, so that the tiny interpreted shapes span several tiles of the Triton GEMMs (warps
# and stages matter only when compiled).
SMALL_GEMM = GemmTiling(block_n=32, block_k=32, num_warps=4, num_stages=3)
SMALL_WGRAD = WgradTiling(block_m=32, block_n=32, block_t=32, num_warps=4, num_stages=3)


def assert_outputs_bitwise_equal(first, second) -> None:
    """Every tensor field of two kernel outputs (dataclasses of tensors, MXFP8Tensors or None) is
    bitwise equal: data, scales and values."""
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(second, field.name)
        assert (a is None) == (b is None), field.name
        if isinstance(a, MXFP8Tensor):
            assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)), field.name
            assert torch.equal(a.scales, b.scales), field.name
        elif a is not None:
            assert torch.equal(a, b), field.name


def twice_without_sync(run):
    """(first, second) results of ``run()``: the first call compiles and may synchronize; the
    second runs under ``torch.cuda.set_sync_debug_mode("error")``, so any host sync in it fails."""
    first = run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return first, second
