"""The Triton dequantize against the spec's ``MXFP8Tensor.dequantize()`` rounded to bf16, bit for bit."""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from tests.support.backends import kernel_device, triton_op
from tests.support.cases import adversarial_matrix


@pytest.fixture
def dequantize():
    return triton_op("dequantize", "dequantize_mxfp8")


def assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    mismatch = got.view(torch.int16).cpu() != want.view(torch.int16).cpu()
    assert int(mismatch.sum()) == 0, f"{int(mismatch.sum())} mismatches, first at {mismatch.nonzero()[:5].tolist()}"


@pytest.mark.parametrize("axis", ["rowwise", "columnwise"])
@pytest.mark.parametrize("splits", [None, [0, 37, 64, 1, 90]], ids=["ungrouped", "grouped"])
@pytest.mark.parametrize("element_format", list(ElementFormat), ids=lambda f: f.value)
def test_dequantize_matches_spec(dequantize, axis, splits, element_format):
    device = kernel_device()
    rows = sum(splits) if splits else 150
    x = (torch.randn(rows, 96, device=device) * torch.logspace(-3, 3, 96, device=device)).bfloat16()
    split_sizes = torch.tensor(splits, device=device) if splits else None
    q = getattr(quantize_mxfp8_ref(x, rowwise=axis == "rowwise", columnwise=axis == "columnwise", swizzle=False,
                                   split_sizes=split_sizes, element_format=element_format), axis)
    assert_bitwise_equal(dequantize(q), q.dequantize().to(torch.bfloat16))


@pytest.mark.parametrize("element_format", list(ElementFormat), ids=lambda f: f.value)
def test_dequantize_adversarial_blocks(dequantize, element_format):
    """NaN (0x7F), saturated and 2**-127 scales, subnormal results: the same bits as the spec."""
    x = adversarial_matrix(element_format, ScaleMode.RCEIL, rows=64).to(kernel_device())
    for axis in ("rowwise", "columnwise"):
        q = getattr(quantize_mxfp8_ref(x, rowwise=True, columnwise=True, swizzle=False, element_format=element_format),
                    axis)
        assert_bitwise_equal(dequantize(q), q.dequantize().to(torch.bfloat16))


def test_dequantize_rejects_swizzled(dequantize):
    q = quantize_mxfp8_ref(torch.zeros(32, 32, device=kernel_device()), rowwise=True, swizzle=True).rowwise
    with pytest.raises(TypeError, match="compact scales"):
        dequantize(q)
