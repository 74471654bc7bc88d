"""The Triton quantize-dequantize against the spec (``quantize_mxfp8_ref`` then ``dequantize()`` in
bf16), bit for bit: every element format and scale mode, both orientations, expert groups of 0, 1,
31, 32, 33 and 129 rows, adversarial blocks, strided rows, fp32 inputs, invalid split sizes."""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.reference import quantize_dequantize_mxfp8_ref, quantize_mxfp8_ref
from gmlp.mxfp8.routing import device_groups
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from tests.support.backends import kernel_device, triton_op
from tests.support.cases import adversarial_matrix, parametrize_quick

AXES = ("rowwise", "columnwise")


@pytest.fixture
def qdq():
    return triton_op("quantize_dequantize", "quantize_dequantize_mxfp8")


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, what
    mismatch = got.view(torch.int16).cpu() != want.view(torch.int16).cpu()
    assert int(mismatch.sum()) == 0, f"{what}: {int(mismatch.sum())} mismatches, first at {mismatch.nonzero()[:5].tolist()}"


def _check(qdq, x: torch.Tensor, **kwargs) -> None:
    """Each orientation alone and both in one call equal the spec's values."""
    want = quantize_dequantize_mxfp8_ref(x, rowwise=True, columnwise=True, **kwargs)
    both = qdq(x, rowwise=True, columnwise=True, **kwargs)
    for axis in AXES:
        alone = qdq(x, rowwise=axis == "rowwise", columnwise=axis == "columnwise", **kwargs)
        assert getattr(alone, "columnwise" if axis == "rowwise" else "rowwise") is None
        assert_same_bits(getattr(alone, axis), getattr(want, axis), f"{axis} alone")
        assert_same_bits(getattr(both, axis), getattr(want, axis), f"{axis} of both")


@pytest.mark.parametrize("splits", [None, [0, 37, 64, 1, 90], [129, 0, 31, 33, 32]], ids=["ungrouped", "grouped",
                                                                                        "block-edges"])
@parametrize_quick("scale_mode", list(ScaleMode), ids=lambda m: m.value)
@parametrize_quick("element_format", list(ElementFormat), ids=lambda f: f.value)
def test_values_match_the_spec(qdq, splits, scale_mode, element_format):
    device = kernel_device()
    rows = sum(splits) if splits else 150
    x = (torch.randn(rows, 160, device=device) * torch.logspace(-3, 3, 160, device=device)).bfloat16()
    split_sizes = torch.tensor(splits, device=device) if splits else None
    _check(qdq, x, split_sizes=split_sizes, element_format=element_format, scale_mode=scale_mode)


@parametrize_quick("scale_mode", list(ScaleMode), ids=lambda m: m.value)
@parametrize_quick("element_format", list(ElementFormat), ids=lambda f: f.value)
def test_adversarial_blocks(qdq, element_format, scale_mode):
    """NaN and Inf inputs, saturating and 2**-127 scales, all-zero blocks, results below bf16's
    smallest subnormal: the same bits as quantize then dequantize."""
    x = adversarial_matrix(element_format, scale_mode, rows=64).to(kernel_device())
    for dtype in (torch.bfloat16, torch.float32):
        _check(qdq, x.to(dtype), element_format=element_format, scale_mode=scale_mode)


def test_equals_the_quantize_followed_by_the_dequantize(qdq):
    """The values are those the layer would otherwise make in two passes (the Triton dequantize
    of the quantize's fp8 tensor), the columnwise ones back in the source's orientation."""
    dequantize = triton_op("dequantize", "dequantize_mxfp8")
    device = kernel_device()
    x = torch.randn(200, 96, device=device).bfloat16()
    split_sizes = torch.tensor([100, 0, 60, 40], device=device)
    q = quantize_mxfp8_ref(x, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes)
    values = qdq(x, rowwise=True, columnwise=True, split_sizes=split_sizes)
    assert_same_bits(values.rowwise, dequantize(q.rowwise), "rowwise")
    assert_same_bits(values.columnwise, dequantize(q.columnwise), "columnwise")


def test_strided_rows_are_read_in_place(qdq):
    """W1's gate rows in the interleaved layout: a view whose rows are 2H apart."""
    device = kernel_device()
    w = torch.randn(4, 2 * 64, 96, device=device).bfloat16()  # (E, 2F, H), gate and up rows alternating
    gate = w.view(4 * 64, 2 * 96)[:, :96]  # rows 0, 2, 4, ... of the (E * 2F, H) stack
    assert gate.stride() == (2 * 96, 1)
    _check(qdq, gate)


def test_no_rows(qdq):
    values = qdq(torch.zeros(0, 64, device=kernel_device()).bfloat16(), rowwise=True, columnwise=True,
                 split_sizes=torch.zeros(3, dtype=torch.int64, device=kernel_device()))
    assert values.rowwise.shape == values.columnwise.shape == (0, 64)


def test_invalid_split_sizes_give_nan(qdq):
    """Split sizes that do not sum to T: a ValueError where checking them is free (CPU tensors),
    else every value NaN (no host sync), as they poison the quantize's scales."""
    device = kernel_device()
    x = torch.randn(64, 32, device=device).bfloat16()
    split_sizes = torch.tensor([40, 40], device=device)
    if device.type == "cpu":
        with pytest.raises(ValueError, match=r"split_sizes must sum to x's row count 64, got sum=80"):
            qdq(x, split_sizes=split_sizes)
        return
    values = qdq(x, rowwise=True, columnwise=True, split_sizes=split_sizes, groups=device_groups(split_sizes, 64))
    assert values.rowwise.isnan().all() and values.columnwise.isnan().all()


def test_bad_arguments_name_the_argument(qdq):
    device = kernel_device()
    with pytest.raises(ValueError, match="K must be a multiple of 32, got K=48"):
        qdq(torch.zeros(4, 48, device=device))
    with pytest.raises(ValueError, match="at least one of rowwise, columnwise"):
        qdq(torch.zeros(4, 32, device=device), rowwise=False)
    with pytest.raises(TypeError, match="x must be bfloat16 or float32"):
        qdq(torch.zeros(4, 32, device=device, dtype=torch.float16))
