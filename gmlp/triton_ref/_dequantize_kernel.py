"""Triton kernels: MXFP8 (compact scales) back to bf16 in the source's orientation.

The GEMMs of the MXFP8 layer multiply dequantized values in bf16 (Hopper has no block-scaled
MMA). Dequantizing each operand once, here, lets them run the bf16 GEMM kernels; the
alternative, dequantizing inside every GEMM tile as it is loaded, repeats the work for every
tile that reads the operand. fp8 values times a power-of-two scale are exact in bf16 but for
results below 2**-133 (bf16's smallest subnormal), so the result is ``dequantize().to(bf16)``
of the spec, bit for bit.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile
from gmlp.triton_ref._mxfp8_math import e8m0_to_float


@triton.jit
def dequantize_rowwise_kernel(
    data_ptr,  # (M, K) fp8
    scale_ptr,  # (M, K/32) compact
    out_ptr,  # (M, K) bf16
    NUM_ROWS, NUM_COLS,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    blocks = tl.program_id(1) * (BLOCK_K // 32) + tl.arange(0, BLOCK_K // 32)
    row_mask = rows < NUM_ROWS
    offsets = rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :]
    mask = row_mask[:, None] & (cols < NUM_COLS)[None, :]  # K is a multiple of 32: uniform per block
    q = tl.load(data_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    e = tl.load(scale_ptr + rows[:, None].to(tl.int64) * (NUM_COLS // 32) + blocks[None, :],
                mask=row_mask[:, None] & (blocks < NUM_COLS // 32)[None, :], other=127).to(tl.int32)
    values = tl.reshape(tl.reshape(q, (BLOCK_M, BLOCK_K // 32, 32)) * e8m0_to_float(e)[:, :, None], (BLOCK_M, BLOCK_K))
    tl.store(out_ptr + offsets, values.to(tl.bfloat16), mask=mask)


@triton.jit
def dequantize_columnwise_kernel(
    data_ptr,  # (K, M) fp8, the transposed layout of a columnwise quantization of (M, K)
    scale_ptr,  # (K, n_blocks) compact, 32-row blocks starting at each expert's first row
    row_start_ptr, tile_start_ptr, block_start_ptr,  # (E+1,) int32 device prefix sums (GROUPED)
    out_ptr,  # (M, K) bf16
    NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS,
    GROUPED: tl.constexpr, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program: a 128-row expert-aligned tile (4 blocks of one expert) by BLOCK_K columns."""
    tile = tl.program_id(0)
    first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED, NUM_ROWS)
    if end_row <= first_row:
        return  # a tile past the last expert
    rows = first_row + tl.arange(0, 128)
    row_mask = rows < end_row
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    col_mask = cols < NUM_COLS
    mask = col_mask[:, None] & row_mask[None, :]
    q = tl.load(data_ptr + cols[:, None].to(tl.int64) * NUM_ROWS + rows[None, :], mask=mask, other=0.0).to(tl.float32)
    # the tile's 4 blocks are blocks local_block.. of its expert, whose blocks start at block_start[g]
    local_blocks = (tile - group_tile_start) * 4 + tl.arange(0, 4)
    group_block_start = tl.load(block_start_ptr + group) if GROUPED else 0
    block_valid = first_row + tl.arange(0, 4) * 32 < end_row
    e = tl.load(scale_ptr + cols[:, None].to(tl.int64) * NUM_COL_BLOCKS + (group_block_start + local_blocks)[None, :],
                mask=col_mask[:, None] & block_valid[None, :], other=127).to(tl.int32)
    values = tl.reshape(tl.reshape(q, (BLOCK_K, 4, 32)) * e8m0_to_float(e)[:, :, None], (BLOCK_K, 128))
    tl.store(out_ptr + rows[None, :].to(tl.int64) * NUM_COLS + cols[:, None], values.to(tl.bfloat16), mask=mask)
