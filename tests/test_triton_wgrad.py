"""The Triton grouped weight gradient against its twin (ragged contraction over tokens).

Tolerance: fp32 accumulation in another order moves each result by at most
T_g * 2**-24 * sum_t |a_t b_t| <= T * 2**-24 * max(|A|^T |B|); the results are fp32 (no rounding
step of a narrower format).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gmlp.mlp_ref import grouped_wgrad_ref
from tests.backends import SMALL_WGRAD, kernel_device, triton_op


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
    delta = max(tokens, 1) * 2.0**-24 * (a.float().abs().t() @ b.float().abs()).max().item()
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
