"""Triton device function shared by GEMM epilogues: write a tile quantized both ways (Q_row, Q_col)."""

import triton
import triton.language as tl

from gmlp.triton_ref._mxfp8_math import block_amax, e8m0_from_amax, quantize_multiplier


@triton.jit
def store_quantized_both_ways(values, rows, row_mask, n0, col_offset, VALID_N, data_ptr, scale_ptr, col_data_ptr, col_scale_ptr,
                     NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, local_blocks, group_block_start, group_blocks,
                     RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Q_row and Q_col of a (BLOCK_M, BLOCK_N) fp32 tile whose columns are col_offset + n0 + j of a
    (T, NUM_COLS) matrix (j valid while n0 + j < VALID_N): rowwise data (T, NUM_COLS) + compact
    scales (T, NUM_COLS/32); columnwise data (NUM_COLS, T) + compact scales (NUM_COLS, n_blocks),
    the tile's 4 token blocks at local_blocks."""
    local = tl.arange(0, BLOCK_N)
    cols = col_offset + n0 + local
    col_mask = n0 + local < VALID_N
    mask = row_mask[:, None] & col_mask[None, :]
    values = tl.where(mask, values, 0.0)
    e = e8m0_from_amax(block_amax(tl.reshape(tl.abs(values), (BLOCK_M, BLOCK_N // 32, 32)), 2), RECIPROCAL_MAX, EMAX,
                       FLOOR_MODE)
    q = tl.reshape(tl.reshape(values, (BLOCK_M, BLOCK_N // 32, 32)) * quantize_multiplier(e)[:, :, None],
                   (BLOCK_M, BLOCK_N)).to(data_ptr.dtype.element_ty)
    tl.store(data_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], q, mask=mask)
    blocks = tl.arange(0, BLOCK_N // 32)
    scale_cols = (col_offset + n0) // 32 + blocks  # col_offset and n0 are multiples of 32
    tl.store(scale_ptr + rows[:, None].to(tl.int64) * (NUM_COLS // 32) + scale_cols[None, :], e.to(tl.uint8),
             mask=row_mask[:, None] & (n0 + blocks * 32 < VALID_N)[None, :])
    e = e8m0_from_amax(block_amax(tl.reshape(tl.abs(values), (BLOCK_M // 32, 32, BLOCK_N)), 1), RECIPROCAL_MAX, EMAX,
                       FLOOR_MODE)
    q = tl.reshape(tl.reshape(values, (BLOCK_M // 32, 32, BLOCK_N)) * quantize_multiplier(e)[:, None, :],
                   (BLOCK_M, BLOCK_N)).to(col_data_ptr.dtype.element_ty)
    tl.store(col_data_ptr + cols[None, :].to(tl.int64) * NUM_ROWS + rows[:, None], q, mask=mask)
    offsets = cols[:, None].to(tl.int64) * NUM_COL_BLOCKS + group_block_start + local_blocks[None, :]
    tl.store(col_scale_ptr + offsets, tl.trans(e).to(tl.uint8), mask=col_mask[:, None] & (local_blocks < group_blocks)[None, :])
