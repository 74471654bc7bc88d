"""The reference quantize (gmlp.fp8_blockwise.reference) and layouts: each block's values and
where its scale lands, against per-block loops over the spec; expert groups; weights' transpose;
the argument errors."""

from __future__ import annotations

import pytest
import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref, quantize_weights_fp8_blockwise_ref
from gmlp.fp8_blockwise.spec import BLOCK, quantize_blocks
from gmlp.fp8_blockwise.tensor import BlockShape
from gmlp.mxfp8.spec import ElementFormat

SPLITS = {"edges": [0, 1, 127, 128, 129, 0], "one-expert": [300], "all-on-one": [0, 0, 257, 0], "empty": [0, 0]}


def _source(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # a different magnitude every 16 rows and 64 columns, so that 1 x 128 and 128 x 1 blocks disagree
    magnitude = torch.logspace(-3, 3, rows // 16 + 1).repeat_interleave(16)[:rows, None] * torch.logspace(
        -2, 2, cols // 64 + 1).repeat_interleave(64)[None, :cols]
    return (torch.randn(rows, cols, generator=generator) * magnitude).bfloat16()


def _block_loop_rowwise(x: torch.Tensor, power_of_two: bool):
    for t in range(x.shape[0]):
        for kb in range(x.shape[1] // BLOCK):
            data, scale_inv = quantize_blocks(x[t, kb * BLOCK:(kb + 1) * BLOCK][None], ElementFormat.E4M3, power_of_two)
            yield t, kb, data[0], scale_inv[0]


@pytest.mark.parametrize("power_of_two", [True, False])
def test_rowwise_blocks_and_their_scale_positions(power_of_two):
    x = _source(37, 256)
    q = quantize_fp8_blockwise_ref(x, power_of_two=power_of_two).rowwise
    assert q.block_shape is BlockShape.ROWWISE and q.scale_inv.shape == (2, 40)
    assert torch.equal(q.scale_inv[:, 37:], torch.ones(2, 3))  # the padding to 4 tokens
    for t, kb, data, scale_inv in _block_loop_rowwise(x, power_of_two):
        assert torch.equal(q.data[t, kb * BLOCK:(kb + 1) * BLOCK].view(torch.uint8), data.view(torch.uint8))
        assert q.scale_inv[kb, t].item() == scale_inv.item()


@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_columnwise_blocks_start_at_each_experts_first_token(splits):
    """Each expert's 128-token blocks from its first token, each in its own 128 data columns
    (data block j is scale column j), the tokens past the expert's end and the blocks past the
    last expert's zeros (scale 1.0)."""
    tokens = sum(splits)
    x = _source(tokens, 128, seed=1)
    q = quantize_fp8_blockwise_ref(x, rowwise=False, columnwise=True,
                                   split_sizes=torch.tensor(splits)).columnwise
    n_blocks = (tokens + 127 * len(splits)) // 128
    assert q.data.shape == (128, 128 * n_blocks) and q.scale_inv.shape == (128, layout.padded(n_blocks))
    assert q.source_shape == (tokens, 128) and q.num_rows == tokens
    token_data = q.token_data()  # the tokens' bytes in the source's shape (T, K)
    assert token_data.shape == (tokens, 128)
    row, block = 0, 0
    for m in splits:
        for b in range(-(-m // BLOCK)):
            first, end = row + b * BLOCK, min(row + (b + 1) * BLOCK, row + m)
            values = torch.zeros(128, BLOCK, dtype=torch.bfloat16)  # past the expert's end: zeros
            values[:, :end - first] = x[first:end].t()
            data, scale_inv = quantize_blocks(values, ElementFormat.E4M3, True)
            columns = slice((block + b) * BLOCK, (block + b + 1) * BLOCK)
            assert torch.equal(q.data[:, columns].view(torch.uint8), data.view(torch.uint8))
            assert not q.data[:, columns][:, end - first:].view(torch.uint8).any()  # the padding's zeros
            assert torch.equal(token_data[first:end].view(torch.uint8), data[:, :end - first].t().view(torch.uint8))
            assert torch.equal(q.scale_inv[:, block + b], scale_inv)
        row, block = row + m, block - (-m // BLOCK)
    assert torch.equal(q.scale_inv[:, block:], torch.ones_like(q.scale_inv[:, block:]))
    assert not q.data[:, block * BLOCK:].view(torch.uint8).any()


def test_an_experts_quantization_does_not_depend_on_its_neighbours():
    """Padding rows never change a block's amax: an expert quantized alone gives the same bytes
    as in the group (its neighbours here are 100x larger)."""
    splits = [129, 127, 1]
    x = _source(257, 128, seed=2)
    x[:129] *= 100
    x[256:] *= 100
    q = quantize_fp8_blockwise_ref(x, rowwise=False, columnwise=True, split_sizes=torch.tensor(splits)).columnwise
    alone = quantize_fp8_blockwise_ref(x[129:256].contiguous(), rowwise=False, columnwise=True).columnwise
    assert torch.equal(q.data[:, 256:384].view(torch.uint8), alone.data.view(torch.uint8))
    assert torch.equal(q.scale_inv[:, 2], alone.scale_inv[:, 0])  # expert 0 has blocks 0, 1


def test_the_two_directions_differ_and_both_dequantize_near_the_source():
    x = _source(256, 256, seed=3)
    q = quantize_fp8_blockwise_ref(x, columnwise=True, split_sizes=torch.tensor([100, 156]))
    rowwise, columnwise = q.rowwise.dequantize(), q.columnwise.dequantize()
    assert not torch.equal(rowwise, columnwise)
    for values in (rowwise, columnwise):  # E4M3 keeps 3 mantissa bits: relative error <= 2**-4 above the scale's floor
        error = (values - x.float()).abs()
        assert (error <= x.float().abs() * 2.0**-4 + 2.0**-9 * x.float().abs().amax()).all()


@pytest.mark.parametrize("power_of_two", [True, False])
def test_weight_tiles_and_the_exact_transpose(power_of_two):
    generator = torch.Generator().manual_seed(4)
    w = (torch.randn(3, 256, 384, generator=generator) * torch.logspace(-4, 4, 3)[:, None, None]).bfloat16()
    q = quantize_weights_fp8_blockwise_ref(w, power_of_two=power_of_two)
    assert q.data.shape == w.shape and q.scale_inv.shape == (3, 2, 3)
    for e, nb, kb in ((0, 0, 0), (1, 1, 2), (2, 1, 1)):
        tile = w[e, nb * BLOCK:(nb + 1) * BLOCK, kb * BLOCK:(kb + 1) * BLOCK]
        data, scale_inv = quantize_blocks(tile.reshape(1, -1), ElementFormat.E4M3, power_of_two)
        assert q.scale_inv[e, nb, kb].item() == scale_inv.item()
        assert torch.equal(q.data[e, nb * BLOCK:(nb + 1) * BLOCK, kb * BLOCK:(kb + 1) * BLOCK].reshape(1, -1).view(
            torch.uint8), data.view(torch.uint8))
    transposed = quantize_weights_fp8_blockwise_ref(w.transpose(1, 2).contiguous(), power_of_two=power_of_two)
    assert torch.equal(q.transpose().data.view(torch.uint8), transposed.data.view(torch.uint8))
    assert torch.equal(q.transpose().scale_inv, transposed.scale_inv)
    assert torch.equal(q.transpose().dequantize(), q.dequantize().transpose(1, 2))
    direct = quantize_weights_fp8_blockwise_ref(w, power_of_two=power_of_two, transposed=True)
    assert torch.equal(direct.data.view(torch.uint8), transposed.data.view(torch.uint8))
    assert torch.equal(direct.scale_inv, transposed.scale_inv)


@pytest.mark.parametrize("power_of_two", [True, False])
def test_both_orientations_are_the_two_calls(power_of_two):
    """``both_orientations``: W's tiles and W^T's, bit for bit the two separate calls, for a stack
    and a single matrix, bf16 and fp32."""
    generator = torch.Generator().manual_seed(5)
    stack = torch.randn(2, 256, 384, generator=generator) * torch.logspace(-4, 4, 2)[:, None, None]
    for w in (stack, stack[1]):
        for dtype in (torch.bfloat16, torch.float32):
            source = w.to(dtype).contiguous()
            pair = quantize_weights_fp8_blockwise_ref(source, power_of_two=power_of_two, both_orientations=True)
            for got, transposed in ((pair.tiles, False), (pair.transposed, True)):
                want = quantize_weights_fp8_blockwise_ref(source, power_of_two=power_of_two, transposed=transposed)
                assert torch.equal(got.data.view(torch.uint8), want.data.view(torch.uint8))
                assert torch.equal(got.scale_inv.view(torch.int32), want.scale_inv.view(torch.int32))


def test_argument_errors_name_the_argument():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128.*K=200"):
        quantize_fp8_blockwise_ref(torch.zeros(4, 200, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x must be bfloat16 or float32"):
        quantize_fp8_blockwise_ref(x.half())
    with pytest.raises(ValueError, match="x must be contiguous"):
        quantize_fp8_blockwise_ref(torch.zeros(256, 4, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="sum to x's row count 4"):
        quantize_fp8_blockwise_ref(x, columnwise=True, split_sizes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="element_format must be one of"):
        quantize_fp8_blockwise_ref(x, element_format="e3m4")
    with pytest.raises(TypeError, match="power_of_two must be a bool"):
        quantize_fp8_blockwise_ref(x, power_of_two="yes")
    with pytest.raises(ValueError, match=r"\(N, K\) must be multiples of 128.*\(256, 100\)"):
        quantize_weights_fp8_blockwise_ref(torch.zeros(2, 256, 100))
    with pytest.raises(ValueError, match="transposed and both_orientations exclude each other"):
        quantize_weights_fp8_blockwise_ref(torch.zeros(256, 128), transposed=True, both_orientations=True)
    with pytest.raises(TypeError, match="transposed must be a bool, got 1"):
        quantize_weights_fp8_blockwise_ref(torch.zeros(256, 128), transposed=1)
    with pytest.raises(ValueError, match="only 128x128-tiled weights transpose"):
        quantize_fp8_blockwise_ref(x).rowwise.transpose()


def test_e5m2_gradients():
    x = _source(64, 128, seed=5)
    q = quantize_fp8_blockwise_ref(x, columnwise=True, element_format="e5m2")
    assert q.rowwise.data.dtype == q.columnwise.data.dtype == torch.float8_e5m2
    assert q.rowwise.data.float().abs().max().item() > 448  # E5M2's fmax 57344 sets the scale
