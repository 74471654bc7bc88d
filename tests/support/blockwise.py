"""Helpers of the FP8 blockwise tests."""

from __future__ import annotations

import dataclasses

import torch

from gmlp.debug.compare import FP8_WGMMA_BLOCK_ERROR
from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor


def on_device(q: FP8BlockwiseTensor, device: torch.device | str) -> FP8BlockwiseTensor:
    """``q`` with its data, scales and split sizes on ``device`` (the references run on the CPU)."""
    return dataclasses.replace(q, data=q.data.to(device), scale_inv=q.scale_inv.to(device),
                               split_sizes=None if q.split_sizes is None else q.split_sizes.to(device))


def summation_error(k: int, on_gpu: bool) -> float:
    """Relative bound (to the sum of |products|) of an FP8 blockwise GEMM's summation error over
    k values: fp32 sums (k * 2**-24), plus on a GPU each 128-block's fp8 ``wgmma`` chain
    (``FP8_WGMMA_BLOCK_ERROR``)."""
    return k * 2.0**-24 + (FP8_WGMMA_BLOCK_ERROR if on_gpu else 0.0)
