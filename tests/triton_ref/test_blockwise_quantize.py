"""The Triton FP8 blockwise quantize (token operands both ways in one pass, weight tiles) against
the spec's reference, bit for bit: both element formats, both scale kinds, bf16 and fp32 inputs,
expert groups of 0, 1, 127, 128 and 129 tokens, the recipe's edge values, invalid split sizes."""

from __future__ import annotations

import math

import pytest
import torch

from gmlp.fp8_blockwise.reference import (
    quantize_fp8_blockwise_ref,
    quantize_weights_fp8_blockwise_ref,
)
from gmlp.mxfp8.spec import ElementFormat
from tests.support.backends import kernel_device, triton_op
from tests.support.cases import parametrize_quick

SPLITS = {"ungrouped": None, "edges": [0, 1, 127, 128, 129, 0], "all-on-one": [0, 257, 0], "empty": [0, 0]}


@pytest.fixture
def quantize():
    return triton_op("blockwise_quantize", "quantize_fp8_blockwise")


def _edge_values(rows: int, cols: int) -> torch.Tensor:
    """Random values over many binades, with rows and columns of the recipe's edge cases: an
    all-zero block, +-Inf, NaN, the bf16 maximum, values small enough that 448 / amax overflows,
    and a power-of-two boundary."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(rows, cols, generator=generator) * torch.exp2(torch.randint(-30, 30, (rows, 1), generator=generator)
                                                                  .float())
    if rows < 15:  # no room for the edge rows (an empty operand)
        return x
    x[3, :128] = 0
    x[5, 7], x[6, 130], x[9, 3] = math.inf, -math.inf, math.nan
    x[10, :128] = math.nan
    x[11, 140] = torch.finfo(torch.bfloat16).max
    x[12, 128:] = 1e-38
    x[13:, 200] = 2.0**-133  # a column of bf16 subnormals
    x[14, 5] = 448.0 * 2**3
    return x


def _assert_same(got, want) -> None:
    for axis in ("rowwise", "columnwise"):
        a, b = getattr(got, axis), getattr(want, axis)
        assert (a is None) == (b is None), axis
        if a is None:
            continue
        assert torch.equal(a.data.view(torch.uint8).cpu(), b.data.view(torch.uint8)), f"{axis} data"
        assert torch.equal(a.scale_inv.view(torch.int32).cpu(), b.scale_inv.view(torch.int32)), f"{axis} scales"


@parametrize_quick("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@parametrize_quick("element_format", list(ElementFormat), ids=lambda f: f.value)
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_token_operands_match_the_spec(quantize, splits, element_format, power_of_two):
    rows = 150 if splits is None else sum(splits)
    x = _edge_values(rows, 256)
    for dtype in (torch.bfloat16, torch.float32):
        source = x.to(dtype)
        split_sizes = None if splits is None else torch.tensor(splits)
        want = quantize_fp8_blockwise_ref(source, columnwise=True, split_sizes=split_sizes,
                                          element_format=element_format, power_of_two=power_of_two)
        device = kernel_device()
        got = quantize(source.to(device), columnwise=True, element_format=element_format, power_of_two=power_of_two,
                       split_sizes=None if split_sizes is None else split_sizes.to(device))
        _assert_same(got, want)


def test_each_orientation_alone(quantize):
    x = _edge_values(200, 256).bfloat16()
    want = quantize_fp8_blockwise_ref(x, columnwise=True, split_sizes=torch.tensor([73, 127]))
    device = kernel_device()
    for rowwise, columnwise in ((True, False), (False, True)):
        got = quantize(x.to(device), rowwise=rowwise, columnwise=columnwise,
                       split_sizes=torch.tensor([73, 127], device=device))
        _assert_same(got, type(want)(want.rowwise if rowwise else None, want.columnwise if columnwise else None))


@parametrize_quick("blocks_per_program", [1, 2, 4])
def test_every_tiling_gives_the_same_bytes(quantize, blocks_per_program):
    """Three 128-column blocks: programs of 2 blocks leave one of 1, of 4 one program of 3; the
    experts' tiles end in either 64-row half."""
    from gmlp.triton_ref.blockwise_quantize import BlockwiseQuantizeConfig

    x = _edge_values(300, 384).bfloat16()
    splits = torch.tensor([40, 72, 188])
    want = quantize_fp8_blockwise_ref(x, columnwise=True, split_sizes=splits)
    device = kernel_device()
    got = quantize(x.to(device), columnwise=True, split_sizes=splits.to(device),
                   config=BlockwiseQuantizeConfig(blocks_per_program=blocks_per_program))
    _assert_same(got, want)


def test_invalid_split_sizes_poison_every_scale(quantize):
    device = kernel_device()
    x = torch.randn(64, 128, device=device).bfloat16()
    split_sizes = torch.tensor([10, 20], device=device)  # sums to 30, not 64
    if device.type == "cpu":  # checked eagerly where that costs no host sync
        with pytest.raises(ValueError, match="sum to x's row count 64"):
            quantize(x, columnwise=True, split_sizes=split_sizes)
        return
    got = quantize(x, columnwise=True, split_sizes=split_sizes)
    assert got.rowwise.scale_inv.isnan().all() and got.columnwise.scale_inv.isnan().all()


@pytest.mark.parametrize("transposed", [False, True], ids=["tiles", "transposed"])
@parametrize_quick("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@parametrize_quick("element_format", list(ElementFormat), ids=lambda f: f.value)
def test_weight_tiles_match_the_spec(element_format, power_of_two, transposed):
    """Bit for bit the spec's tiles; transposed, the spec's tiles transposed (an (E, N, K) stack
    of N != K, so that a transposed index into the wrong expert or tile shows)."""
    quantize_weights = triton_op("blockwise_weights", "quantize_weights_fp8_blockwise")
    w = _edge_values(768, 256).reshape(2, 384, 256)
    for dtype in (torch.bfloat16, torch.float32):
        want = quantize_weights_fp8_blockwise_ref(w.to(dtype), element_format=element_format,
                                                  power_of_two=power_of_two, transposed=transposed)
        got = quantize_weights(w.to(dtype).to(kernel_device()), element_format=element_format,
                               power_of_two=power_of_two, transposed=transposed)
        assert got.data.shape == want.data.shape == ((2, 256, 384) if transposed else (2, 384, 256))
        assert torch.equal(got.data.view(torch.uint8).cpu(), want.data.view(torch.uint8))
        assert torch.equal(got.scale_inv.view(torch.int32).cpu(), want.scale_inv.view(torch.int32))


def _assert_same_tiles(got, want) -> None:
    """Bit for bit: the fp8 bytes and the fp32 scales' bits."""
    assert got.data.shape == want.data.shape and got.scale_inv.shape == want.scale_inv.shape
    assert torch.equal(got.data.view(torch.uint8).cpu(), want.data.view(torch.uint8).cpu())
    assert torch.equal(got.scale_inv.view(torch.int32).cpu(), want.scale_inv.view(torch.int32).cpu())


@parametrize_quick("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@parametrize_quick("shape", [(2, 384, 256), (256, 384)], ids=["stack", "matrix"])
def test_both_orientations_from_one_read_are_the_two_calls(shape, power_of_two):
    """``both_orientations``: W's tiles and W^T's from one launch, each bit for bit the separate
    call's (and the spec's), for a stack (E, N, K) of N != K and a single matrix, bf16 and fp32."""
    quantize_weights = triton_op("blockwise_weights", "quantize_weights_fp8_blockwise")
    w = _edge_values(math.prod(shape[:-1]), shape[-1]).reshape(shape)
    for dtype in (torch.bfloat16, torch.float32):
        source = w.to(dtype).to(kernel_device())
        pair = quantize_weights(source, power_of_two=power_of_two, both_orientations=True)
        _assert_same_tiles(pair.tiles, quantize_weights(source, power_of_two=power_of_two))
        _assert_same_tiles(pair.transposed, quantize_weights(source, power_of_two=power_of_two, transposed=True))
        want = quantize_weights_fp8_blockwise_ref(w.to(dtype), power_of_two=power_of_two, both_orientations=True)
        _assert_same_tiles(pair.tiles, want.tiles)
        _assert_same_tiles(pair.transposed, want.transposed)


def test_both_orientations_argument_errors():
    quantize_weights = triton_op("blockwise_weights", "quantize_weights_fp8_blockwise")
    w = torch.zeros(128, 256, dtype=torch.bfloat16, device=kernel_device())
    with pytest.raises(ValueError, match="transposed and both_orientations exclude each other"):
        quantize_weights(w, transposed=True, both_orientations=True)
    with pytest.raises(TypeError, match="both_orientations must be a bool, got 'yes'"):
        quantize_weights(w, both_orientations="yes")
    with pytest.raises(ValueError, match=r"\(N, K\) must be multiples of 128"):
        quantize_weights(torch.zeros(2, 256, 100, dtype=torch.bfloat16, device=kernel_device()), both_orientations=True)
    empty = quantize_weights(torch.zeros(0, 128, 256, dtype=torch.bfloat16, device=kernel_device()),
                             both_orientations=True)
    assert empty.tiles.data.shape == (0, 128, 256) and empty.transposed.data.shape == (0, 256, 128)
