"""Helpers of the FP8 blockwise tests."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.debug.compare import FP8_WGMMA_BLOCK_ERROR
from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor
from tests.support.sm90 import on_sm90

# The token kernels' GPU splits: empty experts and starts off a 4-row (16-byte scale) boundary
# (the scale boxes round down), one expert, 128-aligned starts, fewer tokens than a tile
KERNEL_SPLITS = [[0, 1, 127, 128, 129, 0], [300], [64, 0, 200, 36], [5, 0, 46]]
KERNEL_SPLIT_IDS = ["edges", "one", "mixed", "few"]
# The pipelined promotion's GPU splits: the kernel splits and one with more work items than CTAs
# (the slots' phases carried from item to item), and contraction lengths of 1, 3, 4 and 16 k-tiles
# (odd and even counts, more than the ring's slots)
PIPELINED_SPLITS = KERNEL_SPLITS + [[1, 2050, 1001]]
PIPELINED_SPLIT_IDS = KERNEL_SPLIT_IDS + ["many-items"]
PIPELINED_K = [128, 384, 512, 2048]


def pipelined_gpu_cases(k_name: str):
    """The pipelined promotion's GPU test cases (on an sm_90 GPU): ``PIPELINED_SPLITS`` x the
    contraction lengths ``PIPELINED_K`` (the test's argument ``k_name``) x clusters of 1 and 2."""
    marks = (pytest.mark.gpu, pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU (H100/H200)"),
             pytest.mark.parametrize("splits", PIPELINED_SPLITS, ids=PIPELINED_SPLIT_IDS),
             pytest.mark.parametrize(k_name, PIPELINED_K), pytest.mark.parametrize("cluster", [1, 2]))

    def mark(test):
        for decorator in reversed(marks):
            test = decorator(test)
        return test
    return mark


def on_device(q: FP8BlockwiseTensor, device: torch.device | str) -> FP8BlockwiseTensor:
    """``q`` with its data, scales and split sizes on ``device`` (the references run on the CPU)."""
    return dataclasses.replace(q, data=q.data.to(device), scale_inv=q.scale_inv.to(device),
                               split_sizes=None if q.split_sizes is None else q.split_sizes.to(device))


def summation_error(k: int, on_gpu: bool) -> float:
    """Relative bound (to the sum of |products|) of an FP8 blockwise GEMM's summation error over
    k values: fp32 sums (k * 2**-24), plus on a GPU each 128-block's fp8 ``wgmma`` chain
    (``FP8_WGMMA_BLOCK_ERROR``)."""
    return k * 2.0**-24 + (FP8_WGMMA_BLOCK_ERROR if on_gpu else 0.0)


def exact_operands(splits: list[int], k: int, n: int, token_format, device: str = "cuda"):
    """(Q_row token operand (T, k) in ``token_format``, E4M3 weight tiles (E, n, k), split sizes)
    whose grouped GEMM sums are exact in fp32 and in the fp8 wgmma's accumulation: small integer
    elements (|q| <= 3) and power-of-two scales (from the global RNG, in this order: the token
    scales, the token data, the weight data, the weight scales)."""
    from gmlp.fp8_blockwise.layout import padded
    from gmlp.fp8_blockwise.tensor import BlockShape
    from gmlp.mxfp8.spec import ElementFormat

    tokens, experts = sum(splits), len(splits)
    split_sizes = torch.tensor(splits, device=device)

    def power_of_two(shape):
        return 2.0 ** torch.randint(-4, 3, shape, device=device).float()

    scales = torch.ones(k // 128, padded(tokens), device=device)
    scales[:, :tokens] = power_of_two((k // 128, tokens))
    rows = FP8BlockwiseTensor(torch.randint(-3, 4, (tokens, k), device=device).to(token_format.torch_dtype), scales,
                              BlockShape.ROWWISE, token_format, True, split_sizes)
    tiles = FP8BlockwiseTensor(torch.randint(-3, 4, (experts, n, k), device=device).to(torch.float8_e4m3fn),
                               power_of_two((experts, n // 128, k // 128)), BlockShape.TILE, ElementFormat.E4M3, True)
    return rows, tiles, split_sizes
