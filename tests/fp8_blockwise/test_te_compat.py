"""The FP8 blockwise spec against TransformerEngine's own quantize kernel (``Float8BlockQuantizer``,
the quantizer of its ``Float8BlockScaling`` recipe), on a GPU where TransformerEngine is installed:
bit for bit on finite blocks (1 x 128 and 128 x 128, E4M3 and E5M2, power-of-two and fp32 scales,
NaN elements included), and the one documented difference, a block holding an Inf (TE's kernel
saturates it to a finite block; the spec, as TE's Python reference, makes it a NaN block)."""

from __future__ import annotations

import math

import pytest
import torch

from gmlp.fp8_blockwise.spec import BLOCK, quantize_blocks
from gmlp.mxfp8.spec import ElementFormat

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROWS, COLS = 256, 512


def _te():
    """TransformerEngine's torch extension and quantizer class (skip where it is not installed)."""
    pytest.importorskip("transformer_engine.pytorch", reason="TransformerEngine is not installed")
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

    return tex, Float8BlockQuantizer


def _te_quantize(x: torch.Tensor, element_format: ElementFormat, power_of_two: bool, tile: bool):
    """TE's rowwise quantization of x (M, K): fp8 bytes (M, K) and scale_inv, (M, K/128) for 1 x 128
    blocks or (M/128, K/128) for 128 x 128 tiles (its GEMM-ready scale buffers, padding cut)."""
    tex, quantizer_class = _te()
    dtype = tex.DType.kFloat8E4M3 if element_format is ElementFormat.E4M3 else tex.DType.kFloat8E5M2
    quantizer = quantizer_class(fp8_dtype=dtype, rowwise=True, columnwise=False, amax_epsilon=0.0,
                                force_pow_2_scales=power_of_two, block_scaling_dim=2 if tile else 1)
    q = quantizer(x)
    rows, cols = x.shape
    scale_inv = q._rowwise_scale_inv
    if tile:  # (ceil(M/128), pad4(ceil(K/128)))
        scale_inv = scale_inv[: rows // BLOCK, : cols // BLOCK]
    else:  # (ceil(K/128), pad4(M)): MN-major
        scale_inv = scale_inv[: cols // BLOCK, :rows].t()
    return q._rowwise_data.view(torch.uint8), scale_inv.float()


def _spec_quantize(x: torch.Tensor, element_format: ElementFormat, power_of_two: bool, tile: bool):
    """The spec's quantization of x (M, K) in the same shapes as ``_te_quantize``'s."""
    rows, cols = x.shape
    if tile:
        blocks = x.view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).permute(0, 2, 1, 3).reshape(
            rows // BLOCK, cols // BLOCK, BLOCK * BLOCK)
        data, scale_inv = quantize_blocks(blocks, element_format, power_of_two)
        data = data.view(rows // BLOCK, cols // BLOCK, BLOCK, BLOCK).permute(0, 2, 1, 3).reshape(rows, cols)
    else:
        data, scale_inv = quantize_blocks(x.view(rows, cols // BLOCK, BLOCK), element_format, power_of_two)
        data = data.view(rows, cols)
    return data.view(torch.uint8), scale_inv


def _finite_operand(dtype: torch.dtype) -> torch.Tensor:
    """Rows of any magnitude, with an all-zero block, a NaN-holding block, the dtype's largest
    value, tiny values and powers of two at the format boundaries."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, COLS, generator=generator) * 2.0 ** torch.randint(-30, 30, (ROWS, 1), generator=generator)
    x[0, :BLOCK] = 0.0
    x[1, 3], x[2, 200] = math.nan, -math.nan
    x[3, 7] = torch.finfo(dtype).max
    x[4, :BLOCK] = 1e-38
    x[5, 5], x[6, 6] = 448.0 * 2.0**-20, 57344.0 * 2.0**10
    return x.to("cuda", dtype)


@pytest.mark.parametrize("tile", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("power_of_two", [True, False], ids=["pow2", "fp32-scales"])
@pytest.mark.parametrize("element_format", [ElementFormat.E4M3, ElementFormat.E5M2], ids=lambda f: f.value)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_finite_blocks_are_te_kernels_bits(dtype, element_format, power_of_two, tile):
    x = _finite_operand(dtype)
    te_data, te_scale_inv = _te_quantize(x, element_format, power_of_two, tile)
    data, scale_inv = _spec_quantize(x, element_format, power_of_two, tile)
    assert torch.equal(data, te_data)
    assert torch.equal(scale_inv.view(torch.int32), te_scale_inv.view(torch.int32))


@pytest.mark.parametrize("tile", [False, True], ids=["1x128", "128x128"])
def test_a_block_holding_an_inf_is_where_the_spec_leaves_te_kernel(tile):
    """TE's kernel: scale_inv 1 and the Inf saturated (a finite block). The spec: scale_inv Inf,
    the block NaN where it held an Inf, zeros elsewhere (docs/usage.md, non-finite values)."""
    x = _finite_operand(torch.bfloat16)
    x[9, 9] = math.inf
    te_data, te_scale_inv = _te_quantize(x, ElementFormat.E4M3, True, tile)
    data, scale_inv = _spec_quantize(x, ElementFormat.E4M3, True, tile)
    block = (9 // BLOCK, 0) if tile else (9, 0)
    assert te_scale_inv[block].item() == 1.0 and te_data[9, 9].item() == 0x7E  # 448
    assert scale_inv[block].item() == math.inf and data[9, 9].item() == 0x7F  # NaN
    others = torch.ones_like(scale_inv, dtype=torch.bool)
    others[block] = False
    assert torch.equal(scale_inv[others].view(torch.int32), te_scale_inv[others].view(torch.int32))
