"""The Triton grouped weight gradient against its twin (ragged contraction over tokens).

Tolerance: fp32 accumulation in another order moves each result by at most
T_g * 2**-24 * sum_t |a_t b_t| <= T * 2**-24 * max(|A|^T |B|); the results are fp32 (no rounding
step of a narrower format).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.contract.reference import grouped_wgrad_ref
from gmlp.debug.compare import gemm_delta
from tests.support.backends import SMALL_WGRAD, kernel_device, triton_op


@pytest.fixture
def grouped_wgrad():
    return triton_op("wgrad", "grouped_wgrad")


@pytest.mark.parametrize("splits", [[0, 37, 64, 1, 90], [129], [0, 0, 5]], ids=str)
def test_wgrad_matches_reference(grouped_wgrad, splits):
    device = kernel_device()
    split_sizes = torch.tensor(splits, device=device)
    tokens, m, n = sum(splits), 64, 96
    a = torch.randn(tokens, m, device=device).bfloat16()
    b = torch.randn(tokens, n, device=device).bfloat16()
    want = grouped_wgrad_ref(a, b, split_sizes)
    got = grouped_wgrad(a, b, split_sizes, tiling=SMALL_WGRAD)
    delta = gemm_delta((a.float().abs().t() @ b.float().abs()).max().item(), max(tokens, 1))
    assert got.shape == want.shape == (len(splits), m, n)
    assert bool(((got - want).abs() <= delta + 1e-30).all())
    # accumulation into an existing fp32 buffer (main_grad)
    main_grad = torch.ones_like(want)
    grouped_wgrad(a, b, split_sizes, out=main_grad, tiling=SMALL_WGRAD)
    assert bool(((main_grad - 1 - want).abs() <= delta + 2.0**-23).all())
    # the other launch order computes every tile the same way; bf16 output is the fp32 result rounded once
    other_order = dataclasses.replace(SMALL_WGRAD, n_fastest=not SMALL_WGRAD.n_fastest)
    assert torch.equal(grouped_wgrad(a, b, split_sizes, tiling=other_order), got)
    assert torch.equal(grouped_wgrad(a, b, split_sizes, out_dtype=torch.bfloat16, tiling=SMALL_WGRAD), got.bfloat16())


@pytest.mark.parametrize("split_rows", [32, 48, 0], ids=["on-a-tile-edge", "inside-a-tile", "all-in-the-second"])
def test_rows_split_over_two_outputs_keep_their_bits(grouped_wgrad, split_rows):
    """dW1's gate and up rows written as two gradients (``split_rows``) are bit for bit the rows of
    the single result, fresh or added into a pair of fp32 buffers, a tile straddling the seam too."""
    device = kernel_device()
    split_sizes = torch.tensor([37, 0, 90], device=device)
    a = torch.randn(127, 64, device=device).bfloat16()
    b = torch.randn(127, 40, device=device).bfloat16()
    whole = grouped_wgrad(a, b, split_sizes, tiling=SMALL_WGRAD)
    first, second = grouped_wgrad(a, b, split_sizes, split_rows=split_rows, tiling=SMALL_WGRAD)
    assert torch.equal(first, whole[:, :split_rows]) and torch.equal(second, whole[:, split_rows:])
    assert first.is_contiguous() and second.is_contiguous()
    ref_whole, ref_parts = grouped_wgrad_ref(a, b, split_sizes), grouped_wgrad_ref(a, b, split_sizes, split_rows=split_rows)
    assert torch.equal(ref_parts[0], ref_whole[:, :split_rows]) and torch.equal(ref_parts[1], ref_whole[:, split_rows:])
    main_grads = (torch.ones_like(first), torch.full_like(second, 2.0))
    grouped_wgrad(a, b, split_sizes, out=main_grads, split_rows=split_rows, tiling=SMALL_WGRAD)
    assert torch.equal(main_grads[0], whole[:, :split_rows] + 1) and torch.equal(main_grads[1], whole[:, split_rows:] + 2)


def test_split_outputs_are_checked(grouped_wgrad):
    device = kernel_device()
    a, b, split_sizes = (torch.zeros(4, 64, device=device).bfloat16(), torch.zeros(4, 8, device=device).bfloat16(),
                         torch.tensor([4], device=device))
    with pytest.raises(ValueError, match=r"split_rows must be in \[0, 64\]"):
        grouped_wgrad(a, b, split_sizes, split_rows=65)
    with pytest.raises(ValueError, match="out must be a pair of tensors exactly when split_rows is given"):
        grouped_wgrad(a, b, split_sizes, out=torch.zeros(1, 64, 8, device=device), split_rows=32)
    with pytest.raises(ValueError, match=r"contiguous fp32 \(1, 32, 8\) and \(1, 32, 8\) tensors, got .*\(1, 30, 8\)"):
        grouped_wgrad(a, b, split_sizes, out=(torch.zeros(1, 32, 8, device=device), torch.zeros(1, 30, 8, device=device)),
                      split_rows=32)
