"""The FP8 blockwise spec (gmlp.fp8_blockwise.spec) against an independent scalar formulation
(numpy float32 arithmetic and exact powers of two) and on the edge cases of the recipe."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gmlp.fp8_blockwise.spec import BLOCK, quantize_blocks, scale_from_amax, scale_inverse
from gmlp.mxfp8.spec import NAN_BYTE, ElementFormat

FORMATS = [ElementFormat.E4M3, ElementFormat.E5M2]
BF16_MAX = torch.finfo(torch.bfloat16).max


def _scale_by_scalars(amax: float, element_format: ElementFormat, power_of_two: bool, input_max: float) -> float:
    """s from numpy float32 scalars: IEEE division (0 for an infinite amax), then the largest power
    of two at or below."""
    if amax == 0 or math.isnan(amax):
        return 1.0
    with np.errstate(over="ignore"):
        s = np.float32(element_format.max_normal) / np.float32(amax)
    if math.isinf(s):
        s = np.float32(input_max)
    if power_of_two and s > 0:
        return 2.0 ** math.floor(math.log2(float(s)))  # s is a normal fp32 here: log2 of it is exact enough
    return float(s)


def _amaxes() -> list[float]:
    generator = np.random.default_rng(0)
    exponents = generator.uniform(-140, 127, 2000)
    values = (2.0 ** exponents * generator.uniform(1, 2, exponents.size)).astype(np.float32)
    values = values[np.isfinite(values)].tolist()
    edges = [0.0, math.inf, math.nan, 448.0, 57344.0, 1.0, float(BF16_MAX), float(np.finfo(np.float32).max),
             float(np.finfo(np.float32).tiny), 1e-45, 448 / float(np.finfo(np.float32).max)]
    return values + edges + [448.0 * 2.0**k for k in range(-130, 120, 7)]


@pytest.mark.parametrize("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("element_format", FORMATS, ids=lambda f: f.value)
def test_scales_match_the_scalar_formulation(element_format, input_dtype, power_of_two):
    amaxes = _amaxes()
    got = scale_from_amax(torch.tensor(amaxes, dtype=torch.float32), element_format, power_of_two, input_dtype)
    input_max = float(torch.finfo(input_dtype).max)
    want = [_scale_by_scalars(float(np.float32(a)), element_format, power_of_two, input_max) for a in amaxes]
    assert got.tolist() == want


def test_scale_inverse_is_the_correctly_rounded_reciprocal_and_keeps_subnormals():
    s = torch.tensor([1.0, 3.0, 448 / 3.0, 2.0**127, float(BF16_MAX), 2.0**-120, 0.0], dtype=torch.float32)
    got = scale_inverse(s)
    with np.errstate(divide="ignore"):  # 1 / 0 = inf, the inverse of an infinite block's s
        want = [float(np.float32(1) / np.float32(v)) for v in s.tolist()]
    assert got.tolist() == want
    assert got[3].item() == 2.0**-127 and got[4].item() > 0  # subnormal fp32 results are not flushed


def _one_block(values, dtype=torch.bfloat16) -> torch.Tensor:
    block = torch.zeros(BLOCK, dtype=dtype)
    block[: len(values)] = torch.tensor(values, dtype=dtype)
    return block


def _quantize(block: torch.Tensor, element_format=ElementFormat.E4M3, power_of_two=True):
    data, scale_inv = quantize_blocks(block[None], element_format, power_of_two)
    return data[0], scale_inv[0].item()


@pytest.mark.parametrize("power_of_two", [True, False])
def test_an_all_zero_block_has_zero_elements_and_unit_scale(power_of_two):
    data, scale_inv = _quantize(torch.zeros(BLOCK, dtype=torch.bfloat16), power_of_two=power_of_two)
    assert scale_inv == 1.0 and not data.view(torch.uint8).any()


@pytest.mark.parametrize("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@pytest.mark.parametrize("element_format", FORMATS, ids=lambda f: f.value)
def test_a_block_with_inf_dequantizes_to_nan(element_format, power_of_two):
    """TransformerEngine's Python reference, not its kernel (which saturates the Inf to a finite
    block): s = 0, so the Inf elements are NaN, the others signed zeros, and scale_inv = Inf."""
    data, scale_inv = _quantize(_one_block([math.inf, -math.inf, 3.0, -1000.0]), element_format, power_of_two)
    assert scale_inv == math.inf
    assert data.view(torch.uint8)[:4].tolist() == [NAN_BYTE, NAN_BYTE, 0x00, 0x80]
    assert not data.view(torch.uint8)[4:].any()
    assert bool((data.float() * scale_inv).isnan().all())  # the whole block dequantizes to NaN


def test_nan_elements_do_not_set_the_scale_and_stay_nan():
    data, scale_inv = _quantize(_one_block([math.nan, 2.0, -math.nan, 1.0]))
    assert scale_inv == 2.0**-7  # s = 2**floor(log2(448 / 2)) = 128
    assert data.view(torch.uint8)[[0, 2]].tolist() == [NAN_BYTE, NAN_BYTE]
    assert data[[1, 3]].float().tolist() == [256.0, 128.0]
    data, scale_inv = _quantize(torch.full((BLOCK,), math.nan, dtype=torch.bfloat16))
    assert scale_inv == 1.0 and data.view(torch.uint8).tolist() == [NAN_BYTE] * BLOCK


def test_amax_at_the_bf16_maximum():
    block = _one_block([BF16_MAX, -1.0])
    data, scale_inv = _quantize(block)
    assert scale_inv == 2.0**120 and data[0].item() == 256.0  # 255 * (1 + 2**-8) rounds up to 256
    data, scale_inv = _quantize(block, power_of_two=False)
    assert data[0].item() == 448.0 and scale_inv == float(np.float32(1) / (np.float32(448) / np.float32(BF16_MAX)))


@pytest.mark.parametrize("power_of_two", [True, False])
def test_a_tiny_amax_takes_the_input_maximum_as_its_scale(power_of_two):
    """448 / amax overflows fp32 below amax = 448 / FLT_MAX (bf16 subnormals included): s is the
    largest bf16, 2**127 as a power of two, whose inverse is the fp32 subnormal 2**-127."""
    for amax in (1e-38, 2.0**-133):  # a normal and a subnormal bf16
        data, scale_inv = _quantize(_one_block([amax]), power_of_two=power_of_two)
        s = 2.0**127 if power_of_two else float(BF16_MAX)
        assert scale_inv == float(np.float32(1) / np.float32(s)) and 0 < scale_inv < 2.0**-126
        assert data[0].item() == float(torch.tensor(float(torch.tensor(amax, dtype=torch.bfloat16)) * s)
                                        .to(torch.float8_e4m3fn))


@pytest.mark.parametrize("k", [-20, -3, 0, 5, 30])
def test_the_power_of_two_boundary(k):
    """amax = 448 * 2**k is exactly representable: s = 2**-k and q(amax) = 448; at the next bf16
    value up, s halves and q(amax) = 448.0 * (1 + 2**-7) / 2 rounds to 224."""
    amax = 448.0 * 2.0**k
    data, scale_inv = _quantize(_one_block([amax]))
    assert scale_inv == 2.0**k and data[0].item() == 448.0
    above = torch.nextafter(torch.tensor(amax, dtype=torch.bfloat16), torch.tensor(math.inf, dtype=torch.bfloat16))
    data, scale_inv = _quantize(_one_block([above.item()]))
    assert scale_inv == 2.0 ** (k + 1) and data[0].item() == 224.0


def test_quantized_values_round_to_nearest_even_of_the_scaled_product():
    torch.manual_seed(0)
    blocks = (torch.randn(64, BLOCK) * torch.logspace(-30, 30, 64)[:, None]).bfloat16()
    for power_of_two in (True, False):
        data, scale_inv = quantize_blocks(blocks, ElementFormat.E4M3, power_of_two)
        s = scale_from_amax(blocks.float().abs().amax(-1), ElementFormat.E4M3, power_of_two, torch.bfloat16)
        assert torch.equal(data.view(torch.uint8), (blocks.float() * s[:, None]).to(torch.float8_e4m3fn).view(
            torch.uint8))  # no element exceeds 448 here: the plain cast is the saturating one
        assert torch.equal(scale_inv, 1 / s)
        assert data.float().abs().amax(-1).le(448).all()


def test_a_block_is_any_length():
    """A 128 x 128 weight tile is a block of 16384 values (its amax over all of them)."""
    tile = torch.randn(2, BLOCK * BLOCK).bfloat16()
    tile[1, 9999] = 1000.0
    data, scale_inv = quantize_blocks(tile, ElementFormat.E4M3, True)
    assert data.shape == tile.shape and scale_inv.tolist()[1] == 4.0  # s = 2**floor(log2(0.448)) = 0.25
