"""The spec (gmlp.mxfp8.spec, gmlp.mxfp8.scale_layout) against independent float64 / loop implementations."""

from __future__ import annotations

import math

import pytest
import torch

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.spec import (
    NAN_BYTE,
    ElementFormat,
    ScaleMode,
    cast_to_element,
    e8m0_from_amax,
    e8m0_to_float,
    nan_ignoring_amax,
    quantize_multiplier,
)
from tests.support.cases import adversarial_blocks, fp8_values


def _rceil_by_log2(amax: float, element_format: ElementFormat) -> int:
    """RCEIL from exact float64 arithmetic on v = fp32(amax * fp32(1/max))."""
    reciprocal = torch.tensor(1.0 / element_format.max_normal, dtype=torch.float32)
    v = (torch.tensor(amax, dtype=torch.float32) * reciprocal).item()
    if math.isinf(v):
        return 254
    if v <= 2.0**-127:
        return 0
    return min(254, math.ceil(math.log2(v)) + 127)


def _floor_by_log2(amax: float, element_format: ElementFormat) -> int:
    if amax == 0:
        return 0
    if math.isinf(amax):
        return 254
    return max(0, min(254, math.floor(math.log2(amax)) - element_format.emax + 127))


@pytest.mark.parametrize("element_format", list(ElementFormat))
def test_scale_matches_log2_definition(element_format):
    amaxes = [0.0, 2.0**-149, 2.0**-127, 448 * 2.0**-127, 1e-30, 0.1, 1.0, 448.0, 449.0, 57344.0, 3.0e38, math.inf]
    amaxes += [2.0**k * f for k in range(-140, 128, 7) for f in (1.0, 1 + 2**-23, 1 - 2**-24, 1.5)]
    amax = torch.tensor(amaxes, dtype=torch.float32)
    rceil = e8m0_from_amax(amax, element_format, ScaleMode.RCEIL)
    floor = e8m0_from_amax(amax, element_format, ScaleMode.FLOOR)
    for i, a in enumerate(amax.tolist()):
        assert rceil[i].item() == _rceil_by_log2(a, element_format), f"RCEIL {a=}"
        assert floor[i].item() == _floor_by_log2(a, element_format), f"FLOOR {a=}"


def test_all_256_e8m0_bytes_round_trip():
    e = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    value = e8m0_to_float(e).double()
    multiplier = quantize_multiplier(e).double()
    for byte in range(255):
        assert value[byte].item() == 2.0 ** (byte - 127)
        assert multiplier[byte].item() == 2.0 ** (127 - byte)
    assert math.isnan(value[255].item()) and math.isnan(multiplier[255].item())
    assert e8m0_from_amax(torch.tensor([math.nan]), ElementFormat.E4M3, ScaleMode.RCEIL).item() == 255


@pytest.mark.parametrize("element_format", list(ElementFormat))
def test_cast_rounds_half_even_and_saturates(element_format):
    values = fp8_values(element_format).double()
    low, high = values[:-1], values[1:]
    midpoint = (low + high) / 2
    result = cast_to_element(midpoint.float(), element_format).float().double()
    low_even = (torch.arange(values.numel() - 1) % 2) == 0  # codes alternate even/odd mantissa
    assert torch.equal(result, torch.where(low_even, low, high))
    top = element_format.max_normal
    beyond = torch.tensor([top * 1.01, top * 4, math.inf, -math.inf, -top * 2])
    assert cast_to_element(beyond, element_format).float().tolist() == [top, top, top, -top, -top]
    nan_bytes = cast_to_element(torch.tensor([math.nan, -math.nan]), element_format).view(torch.uint8)
    assert nan_bytes.tolist() == [NAN_BYTE, NAN_BYTE]
    zeros = cast_to_element(torch.tensor([0.0, -0.0]), element_format).view(torch.uint8)
    assert zeros.tolist() == [0x00, 0x80]


def test_adversarial_blocks_cover_every_scale_branch():
    scales = set()
    for block in adversarial_blocks(ElementFormat.E4M3, ScaleMode.RCEIL):
        scales.add(e8m0_from_amax(nan_ignoring_amax(block)[None], ElementFormat.E4M3, ScaleMode.RCEIL).item())
    assert {0, 254, 127}.issubset(scales)


@pytest.mark.parametrize("rows,cols", [(1, 1), (128, 4), (130, 5), (300, 9), (7, 64)])
def test_swizzle_matches_index_formula(rows, cols):
    scales = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    flat = scale_layout.swizzle(scales)
    assert flat.numel() == scale_layout.swizzled_size(rows, cols)
    expected = torch.zeros_like(flat)
    for i in range(rows):
        for j in range(cols):
            expected[scale_layout.swizzled_index(i, j, cols)] = scales[i, j]
    assert torch.equal(flat, expected)
    assert torch.equal(scale_layout.unswizzle(flat, rows, cols), scales)


@pytest.mark.parametrize("splits", [[0, 37, 200, 63, 0], [300], [1, 31, 33, 1, 0, 105, 129]])
def test_grouped_layouts_match_plain_loops(splits):
    total, cols = sum(splits), 3
    split_sizes = torch.tensor(splits)
    rowwise = torch.randint(1, 255, (total, cols), dtype=torch.uint8)
    flat = scale_layout.swizzle_rowwise_grouped(rowwise, split_sizes)
    assert flat.numel() == scale_layout.max_row_tiles(total, len(splits)) * 128 * 4
    expected = torch.zeros_like(flat)
    row, tile = 0, 0
    for m in splits:
        for r in range(m):
            for j in range(cols):
                expected[tile * 512 + scale_layout.swizzled_index(r, j, cols)] = rowwise[row + r, j]
        row, tile = row + m, tile + -(-m // 128)
    assert torch.equal(flat, expected)
    assert torch.equal(scale_layout.unswizzle_rowwise_grouped(flat, split_sizes, cols), rowwise)

    k = 40
    n_blocks = scale_layout.max_column_blocks(total, len(splits))
    columnwise = torch.zeros(k, n_blocks, dtype=torch.uint8)
    used = sum(-(-m // 32) for m in splits)
    columnwise[:, :used] = torch.randint(1, 255, (k, used), dtype=torch.uint8)
    flat = scale_layout.swizzle_columnwise_grouped(columnwise, split_sizes, total)
    expected = torch.zeros_like(flat)
    block, tile = 0, 0
    for m in splits:
        blocks, tiles = -(-m // 32), -(-m // 128)
        for i in range(k):
            for j in range(blocks):
                index = 128 * 4 * tile + ((i // 128) * tiles + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
                expected[index] = columnwise[i, block + j]
        block, tile = block + blocks, tile + tiles
    assert torch.equal(flat, expected)
    assert torch.equal(scale_layout.unswizzle_columnwise_grouped(flat, split_sizes, k, total), columnwise)
