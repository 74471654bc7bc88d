"""Triton kernel: the bf16 values of an MXFP8 quantization, in one pass, with no fp8 tensor written.

A Hopper GEMM of the MXFP8 layer multiplies ``dequantize(quantize(x))`` in bf16. Where x itself
(a weight, dy) is at hand when the GEMM runs, those values come straight from x: read x once,
quantize each block by the spec, dequantize it at once, write bf16. That is the quantize
followed by the dequantize, with the same expressions (``_mxfp8_math``, the dequantize's
``fp8 -> fp32 * 2**(e - 127) -> bf16``), so the same bits, minus the fp8 round trip through
memory.

One program: ROWS rows (128 or 32) of one 128-row expert-aligned tile (ROWS / 32 columnwise
blocks of one expert; rows past the expert's end read as 0, as the spec pads a trailing block)
by BLOCK_K columns (BLOCK_K / 32 rowwise blocks per row); both orientations from the same
registers. Column chunks are the fast grid axis, so the programs running together read whole
runs of the same rows.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile
from gmlp.triton_ref._mxfp8_math import block_amax, e8m0_from_amax, e8m0_to_float, quantize_multiplier


@triton.jit
def _values_of_blocks(x, e, E5M2: tl.constexpr):
    """bf16 of the blocks of ``x`` (fp32) quantized with E8M0 bytes ``e`` (broadcast over each
    block) and dequantized: the quantize's fp8 cast, then the dequantize's multiply."""
    scaled = x * quantize_multiplier(e)
    q = scaled.to(tl.float8e5) if E5M2 else scaled.to(tl.float8e4nv)
    return (q.to(tl.float32) * e8m0_to_float(e)).to(tl.bfloat16)


@triton.jit
def quantize_dequantize_kernel(
    x_ptr,  # (M, K) bf16 | fp32, rows X_ROW_STRIDE apart
    row_start_ptr, tile_start_ptr,  # (E+1,) int32 device prefix sums of rows and 128-row tiles (GROUPED)
    row_out_ptr,  # (M, K) bf16: the rowwise quantization's values (ROWWISE)
    col_out_ptr,  # (M, K) bf16: the columnwise quantization's values, source orientation (COLUMNWISE)
    NUM_ROWS, NUM_COLS, X_ROW_STRIDE,
    RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr, E5M2: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr,
    GROUPED: tl.constexpr, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(1) // (128 // ROWS)
    tile_first_row, end_row, _, _, _ = group_tile(tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS,
                                                  GROUPED, NUM_ROWS)
    first_row = tile_first_row + (tl.program_id(1) % (128 // ROWS)) * ROWS
    if end_row <= first_row:
        return  # a tile past the last expert, or rows past this expert's end
    rows = first_row + tl.arange(0, ROWS)
    cols = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < end_row)[:, None] & (cols < NUM_COLS)[None, :]  # K is a multiple of 32: uniform per block
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * X_ROW_STRIDE + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    magnitude = tl.abs(x)
    offsets = rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :]

    if ROWWISE:  # 1 x 32 blocks: (ROWS, BLOCK_K / 32, 32)
        blocks = tl.reshape(x, (ROWS, BLOCK_K // 32, 32))
        e = e8m0_from_amax(block_amax(tl.reshape(magnitude, (ROWS, BLOCK_K // 32, 32)), 2),
                           RECIPROCAL_MAX, EMAX, FLOOR_MODE)
        values = tl.reshape(_values_of_blocks(blocks, e[:, :, None], E5M2), (ROWS, BLOCK_K))
        tl.store(row_out_ptr + offsets, values, mask=mask)
    if COLUMNWISE:  # 32 x 1 blocks: (ROWS / 32, 32, BLOCK_K), blocks starting at the expert's rows
        blocks = tl.reshape(x, (ROWS // 32, 32, BLOCK_K))
        e = e8m0_from_amax(block_amax(tl.reshape(magnitude, (ROWS // 32, 32, BLOCK_K)), 1),
                           RECIPROCAL_MAX, EMAX, FLOOR_MODE)
        values = tl.reshape(_values_of_blocks(blocks, e[:, None, :], E5M2), (ROWS, BLOCK_K))
        tl.store(col_out_ptr + offsets, values, mask=mask)
