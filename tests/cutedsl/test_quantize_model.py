"""A CPU model of the CuTeDSL quantize kernel, against the spec, bit for bit.

The kernel only runs on a GPU. This model replays in torch what each CTA computes: the
NaN-aware amax keys and the integer E8M0 formulas (mirrors of ``_amax_keys``, ``_amax_of_keys``,
``_scale_byte`` and ``_funnel``), and where every staged scale byte and transposed data chunk
goes, through the kernel module's own index functions. The assembled outputs must equal
``quantize_mxfp8_ref``'s. The fp8 cast itself is the spec's ``cast_to_element`` (what the GPU's
``cvt.rn.satfinite`` does), so this checks the kernel's design; the GPU tests check its code.
"""

from __future__ import annotations

import random

import pytest
import torch

from gmlp.cutedsl import import_error
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode, cast_to_element, e8m0_from_amax, nan_ignoring_amax
from tests.support.cases import SPLIT_CASES, adversarial_blocks, adversarial_matrix, parametrize_quick, random_matrix

_IMPORT_ERROR = import_error()
if _IMPORT_ERROR is not None:
    pytest.skip(f"the CuTeDSL kernel module cannot be imported: {_IMPORT_ERROR}", allow_module_level=True)

from gmlp.cutedsl import _quantize_kernel as kernel  # noqa: E402

SENTINEL = 0xA5  # bytes the model never wrote (the launcher allocates with torch.empty)


# ---- mirrors of the kernel's integer formulas (int64 tensors of raw bits) --------------------


def amax_bits(element_bits: torch.Tensor, bf16: bool) -> torch.Tensor:
    """_amax_keys + _amax_of_keys over the last dimension: fp32 bits of the NaN-ignoring amax."""
    if bf16:
        key = (element_bits & 0x7FFF) + 0x7F
        key = torch.where(key >= 0x8000, key - 0x10000, key).amax(-1)  # signed 16-bit keys
        return torch.where(key >= 0x7F, (key - 0x7F) << 16, 0)
    key = ((element_bits * 2 + 0xFFFFFF) & 0xFFFFFFFF).amax(-1)
    return torch.where(key >= 0xFFFFFF, (key - 0xFFFFFF) >> 1, 0)


def scale_byte(amax: torch.Tensor, element_format: ElementFormat, scale_mode: ScaleMode) -> torch.Tensor:
    """_scale_byte."""
    if scale_mode is ScaleMode.FLOOR:
        exponent = amax >> 23
        e = torch.where(exponent > element_format.emax, exponent - element_format.emax, 0)
        return torch.where(amax == 0x7F800000, 254, e)
    reciprocal = torch.tensor(1.0 / element_format.max_normal, dtype=torch.float32)
    v = amax.to(torch.int32).view(torch.float32) * reciprocal
    bits = v.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    e = torch.clamp((bits + 0x7FFFFF) >> 23, max=254)
    return torch.where(bits > 0x400000, e, 0)


def quantize_model(blocks: torch.Tensor, element_format, scale_mode):
    """(fp8 bytes, scale bytes) of blocks (..., 32) in the input dtype, the kernel's way."""
    bf16 = blocks.dtype == torch.bfloat16
    bits = blocks.view(torch.int16 if bf16 else torch.int32).to(torch.int64) & (0xFFFF if bf16 else 0xFFFFFFFF)
    e = scale_byte(amax_bits(bits, bf16), element_format, scale_mode)
    multiplier = torch.where(e == 254, 0x00400000, (254 - e) << 23).to(torch.int32).view(torch.float32)
    data = cast_to_element(blocks.float() * multiplier.unsqueeze(-1), element_format)
    return data.view(torch.uint8), e.to(torch.uint8)


def prmt(a: int, b: int, selector: int) -> int:
    source = a.to_bytes(4, "little") + b.to_bytes(4, "little")
    return int.from_bytes(bytes(source[(selector >> (4 * i)) & 7] for i in range(4)), "little")


def funnel(lo: list[int], hi: list[int], d: int) -> list[int]:
    """_funnel."""
    words = lo + hi + [0] * 4
    s = 16 - d
    window = [words[m + (s >> 2)] for m in range(5)]
    selector = 0x3210 + (s & 3) * 0x1111
    return [prmt(window[w], window[w + 1], selector) for w in range(4)]


def words_of(chunk: bytes) -> list[int]:
    return [int.from_bytes(chunk[4 * w : 4 * w + 4], "little") for w in range(4)]


# ---- the CTA model ------------------------------------------------------------------------------


def cta_rows(tile: int, sizes: list[int], grouped: bool, num_tiles: int):
    """(row0, valid_rows, tile_base, expert_tiles, block0) of CTA row `tile`, as the kernel finds them."""
    if not grouped:
        return tile * 128, min(sizes[0] - tile * 128, 128), 0, num_tiles, 4 * tile
    row = block = tile_start = 0
    for m in sizes:
        tiles = scale_layout.ceil_div(m, 128)
        if tile_start <= tile < tile_start + tiles:
            local = tile - tile_start
            return row + 128 * local, min(m - 128 * local, 128), tile_start, tiles, block + 4 * local
        row, block, tile_start = row + m, block + scale_layout.ceil_div(m, 32), tile_start + tiles
    return 0, 0, tile, 1, 0  # a padding tile


def kernel_model(x, split_sizes, *, rowwise, columnwise, swizzle, element_format, scale_mode, col_base=0):
    rows, cols = x.shape
    grouped = split_sizes is not None
    sizes = [rows] if not grouped else [int(m) for m in split_sizes]
    num_tiles = scale_layout.max_row_tiles(rows, len(sizes))
    num_chunks = scale_layout.ceil_div(cols, 128)
    row_data = torch.full((rows, cols), SENTINEL, dtype=torch.uint8)
    col_data = torch.full((cols, rows), SENTINEL, dtype=torch.uint8).view(-1)
    if swizzle:
        row_scales = torch.full((num_tiles * num_chunks * 512,), SENTINEL, dtype=torch.uint8)
        col_scales = torch.full((num_tiles * num_chunks * 512,), SENTINEL, dtype=torch.uint8)
    else:
        row_scales = torch.full((rows, cols // 32), SENTINEL, dtype=torch.uint8)
        col_scales = torch.zeros(cols, scale_layout.max_column_blocks(rows, len(sizes)), dtype=torch.uint8)
    for tile in range(num_tiles):
        row0, valid, tile_base, expert_tiles, block0 = cta_rows(tile, sizes, grouped, num_tiles)
        for chunk in range(num_chunks):
            col0, width = chunk * 128, min(128, cols - chunk * 128)
            tile_x = torch.zeros(128, 128, dtype=x.dtype)  # masked rows and columns are zeros
            tile_x[:valid, :width] = x[row0 : row0 + valid, col0 : col0 + width]
            if rowwise:
                data, e = quantize_model(tile_x.view(128, 4, 32), element_format, scale_mode)
                row_data[row0 : row0 + valid, col0 : col0 + width] = data.view(128, 128)[:valid, :width]
                stage = torch.zeros(512, dtype=torch.uint8)
                for r in range(128):
                    for j in range(4):
                        stage[kernel.stage_offset(r, j, swizzle)] = e[r, j]
                if swizzle:
                    index = kernel.rowwise_scale_tile(tile, chunk, num_chunks)
                    row_scales[index * 512 : index * 512 + 512] = stage
                else:
                    for r in range(valid):
                        for j in range(width // 32):
                            row_scales[row0 + r, 4 * chunk + j] = stage[kernel.stage_offset(r, j, False)]
            if columnwise:
                data, e = quantize_model(tile_x.t().contiguous().view(128, 4, 32), element_format, scale_mode)
                logical = data.view(128, 128)  # sQ row k = tile column k, byte i = tile row i
                sq = bytearray(128 * 128)
                for k in range(128):
                    for c in range(8):
                        position = kernel.sq_position(k, c)
                        at = k * 128 + 16 * position
                        sq[at : at + 16] = bytes(logical[k, 16 * c : 16 * c + 16].tolist())
                stage = torch.zeros(512, dtype=torch.uint8)
                for k in range(128):
                    for b in range(4):
                        stage[kernel.stage_offset(k, b, swizzle)] = e[k, b]
                if swizzle:
                    index = kernel.columnwise_scale_tile(tile_base, expert_tiles, tile - tile_base, chunk, num_chunks)
                    col_scales[index * 512 : index * 512 + 512] = stage
                else:
                    for k in range(width):
                        for b in range(4):
                            if 32 * b < valid:
                                col_scales[col0 + k, block0 + b] = stage[kernel.stage_offset(k, b, False)]
                for k in range(width if valid > 0 else 0):  # store_transposed
                    address = col_base + (col0 + k) * rows + row0  # G
                    d = address % 16

                    def chunk_words(c):
                        if not 0 <= c < 8:
                            return [0] * 4
                        position = k * 128 + 16 * kernel.sq_position(k, c)
                        return words_of(bytes(sq[position : position + 16]))

                    for q in range(9):
                        start = 16 * q - d
                        out = chunk_words(q) if d == 0 else funnel(chunk_words(q - 1), chunk_words(q), d)
                        out_bytes = b"".join(w.to_bytes(4, "little") for w in out)
                        first = address - d + 16 * q - col_base  # flat index of the chunk's byte 0
                        if start >= 0 and start + 16 <= valid:
                            assert (address - d + 16 * q) % 16 == 0
                            col_data[first : first + 16] = torch.tensor(list(out_bytes), dtype=torch.uint8)
                        else:
                            for i in range(16):
                                if 0 <= start + i < valid:
                                    col_data[first + i] = out_bytes[i]
    fp8 = element_format.torch_dtype
    row_result = (row_data.view(fp8), row_scales) if rowwise else None
    col_result = (col_data.view(cols, rows).view(fp8), col_scales) if columnwise else None
    return row_result, col_result


def check(x, split_sizes=None, *, rowwise=True, columnwise=True, swizzle=True,
          element_format=ElementFormat.E4M3, scale_mode=ScaleMode.RCEIL, col_base=0):
    splits = None if split_sizes is None else torch.tensor(split_sizes, dtype=torch.int32)
    want = quantize_mxfp8_ref(x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=splits,
                              element_format=element_format, scale_mode=scale_mode)
    got = kernel_model(x, split_sizes, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle,
                       element_format=element_format, scale_mode=scale_mode, col_base=col_base)
    for name, result, expected in (("rowwise", got[0], want.rowwise), ("columnwise", got[1], want.columnwise)):
        assert (result is None) == (expected is None)
        if expected is None:
            continue
        data, scales = result
        assert data.shape == expected.data.shape and scales.shape == expected.scales.shape, name
        data_diff = (data.view(torch.uint8) != expected.data.view(torch.uint8)).nonzero()
        scale_diff = (scales != expected.scales).nonzero()
        assert data_diff.numel() == 0, f"{name} data differs at {data_diff[:5].tolist()}"
        assert scale_diff.numel() == 0, f"{name} scales differ at {scale_diff[:5].tolist()}"


# ---- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("element_format", list(ElementFormat), ids=lambda f: f.value)
@pytest.mark.parametrize("scale_mode", list(ScaleMode), ids=lambda m: m.value)
def test_scale_formulas_match_spec(element_format, scale_mode):
    # every exponent, with the mantissas at the rounding boundaries
    mantissas = [0, 1, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF]
    amax = torch.tensor([(exp << 23) | m for exp in range(255) for m in mantissas] + [0x7F800000], dtype=torch.int64)
    want = e8m0_from_amax(amax.to(torch.int32).view(torch.float32), element_format, scale_mode)
    assert torch.equal(scale_byte(amax, element_format, scale_mode).to(torch.uint8), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_amax_keys_ignore_nan(dtype):
    blocks = torch.stack(adversarial_blocks(ElementFormat.E4M3, ScaleMode.RCEIL)).to(dtype)
    specials = torch.tensor([[float("nan")] * 16 + [-float("inf")] + [0.0] * 15, [-0.0] * 32, [float("-nan")] * 32])
    blocks = torch.cat([blocks, specials.to(dtype), torch.randn(64, 32).to(dtype) * 1e3])
    bf16 = dtype == torch.bfloat16
    bits = blocks.view(torch.int16 if bf16 else torch.int32).to(torch.int64) & (0xFFFF if bf16 else 0xFFFFFFFF)
    want = nan_ignoring_amax(blocks).view(torch.int32).to(torch.int64)
    assert torch.equal(amax_bits(bits, bf16), want)


def test_funnel_shifts_bytes():
    rng = random.Random(0)
    for d in range(1, 16):
        lo, hi = [rng.getrandbits(32) for _ in range(4)], [rng.getrandbits(32) for _ in range(4)]
        source = b"".join(w.to_bytes(4, "little") for w in lo + hi)
        assert funnel(lo, hi, d) == words_of(source[16 - d : 32 - d])


def test_sq_positions_are_conflict_free():
    for k in range(128):  # a row's 8 chunks: a permutation (store step reads them in one phase)
        assert sorted(kernel.sq_position(k, c) for c in range(8)) == list(range(8))
    for m in range(8):  # columnwise step: lanes cp = 8m .. 8m+7 store chunk c of rows k = 2cp (+1)
        for half in (0, 1):
            for c in range(8):
                assert len({kernel.sq_position(2 * (8 * m + lane) + half, c) for lane in range(8)}) == 8


@pytest.mark.parametrize("chunks_per_thread", [2, 4], ids=["bf16", "fp32"])
def test_sx_positions_are_conflict_free(chunks_per_thread):
    chunks_per_row = 8 * chunks_per_thread  # 8 lanes per row in the rowwise step
    positions = [kernel.sx_position(c, chunks_per_thread) for c in range(chunks_per_row)]
    assert sorted(positions) == list(range(chunks_per_row))
    assert all(p // 8 == c // 8 for c, p in enumerate(positions))  # columnwise runs stay in place
    for i in range(chunks_per_thread):  # a rowwise 16-byte load phase: lanes cg = 0..7 of one row
        assert len({positions[chunks_per_thread * cg + i] % 8 for cg in range(8)}) == 8


@pytest.mark.parametrize("split_case", list(SPLIT_CASES), ids=str)
@parametrize_quick("swizzle", [True, False], ids=["swizzled", "compact"])
def test_grouped_layouts(split_case, swizzle):
    splits = SPLIT_CASES[split_case]
    x = random_matrix("lognormal", 300, 160, torch.bfloat16)
    check(x, splits, swizzle=swizzle)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("element_format", list(ElementFormat), ids=lambda f: f.value)
@pytest.mark.parametrize("scale_mode", list(ScaleMode), ids=lambda m: m.value)
def test_adversarial_values(dtype, element_format, scale_mode):
    x = adversarial_matrix(element_format, scale_mode, rows=64).to(dtype)
    check(x[:, :256].contiguous(), [0, 17, 47], element_format=element_format, scale_mode=scale_mode)
    check(x.t().contiguous()[:96], None, element_format=element_format, scale_mode=scale_mode)


@parametrize_quick("shape", [(1, 32), (33, 96), (129, 32), (200, 288)], keep=3, ids=str)
@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True), (True, True)], ids=["row", "col", "both"])
def test_odd_shapes_and_alignments(shape, rowwise, columnwise):
    x = random_matrix("normal", *shape, torch.float32)
    for splits in (None, [shape[0] // 3, 0, shape[0] - shape[0] // 3]):
        for swizzle in (True, False):
            check(x, splits, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, col_base=16 * 7)
