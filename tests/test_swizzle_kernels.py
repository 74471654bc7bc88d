"""The Triton swizzle / unswizzle kernels against the spec's layouts, bit for bit."""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.reference import quantize_mxfp8_ref
from tests.backends import kernel_device, triton_op
from tests.cases import SPLIT_CASES


@pytest.fixture
def swizzle_kernels():
    return triton_op("swizzle", "swizzle_scales"), triton_op("swizzle", "unswizzle_scales")


@pytest.mark.parametrize("split_case", list(SPLIT_CASES), ids=str)
@pytest.mark.parametrize("k", [32, 96, 160, 512])
def test_swizzle_round_trip(swizzle_kernels, split_case, k):
    swizzle_scales, unswizzle_scales = swizzle_kernels
    splits = SPLIT_CASES[split_case]
    device = kernel_device()
    split_sizes = None if splits is None else torch.tensor(splits, device=device)
    x = torch.randn(300, k, device=device)
    compact = quantize_mxfp8_ref(x, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes)
    swizzled = quantize_mxfp8_ref(x, rowwise=True, columnwise=True, swizzle=True, split_sizes=split_sizes)
    for axis in ("rowwise", "columnwise"):
        want_swizzled, want_compact = getattr(swizzled, axis), getattr(compact, axis)
        got = swizzle_scales(want_compact)
        assert got.swizzled and torch.equal(got.scales, want_swizzled.scales), axis
        back = unswizzle_scales(want_swizzled)
        assert not back.swizzled and torch.equal(back.scales, want_compact.scales), axis


def test_swizzle_refuses_wrong_direction(swizzle_kernels):
    swizzle_scales, unswizzle_scales = swizzle_kernels
    q = quantize_mxfp8_ref(torch.randn(64, 64, device=kernel_device()), swizzle=True)
    with pytest.raises(ValueError, match="already swizzled"):
        swizzle_scales(q.rowwise)
    with pytest.raises(ValueError, match="already compact"):
        unswizzle_scales(quantize_mxfp8_ref(torch.randn(64, 64, device=kernel_device()), swizzle=False).rowwise)
