"""Triton device functions shared by the FP8 blockwise quantize and the GEMM epilogues: write a
(128, 128) block of values quantized both ways (1 x 128 rowwise, 128 x 1 columnwise), or the
columnwise block of a tile past the last expert (zeros, scale 1.0)."""

import triton
import triton.language as tl

from gmlp.triton_ref._blockwise_math import blockwise_scale
from gmlp.triton_ref._mxfp8_math import block_amax


@triton.jit
def store_blockwise_both_ways(
    values,  # (128, 128) fp32 at (rows, cols) of a (T, NUM_COLS) matrix; 0 in the rows not written
    rows, row_mask,  # (128,) token rows, those of the expert
    col_block,  # the 128-column block: columns 128 col_block ..
    token_block,  # the columnwise block index of these 128 tokens (their expert-aligned tile)
    row_data_ptr, row_scale_ptr, ROW_SCALE_STRIDE,  # (T, NUM_COLS) fp8; (NUM_COLS/128, stride) fp32
    col_data_ptr, col_scale_ptr, COL_SCALE_STRIDE,  # (NUM_COLS, COL_DATA_STRIDE) fp8; (NUM_COLS, stride) fp32
    COL_DATA_STRIDE, NUM_COLS,
    FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr,
):
    cols = col_block * 128 + tl.arange(0, 128)
    magnitude = tl.abs(values)
    if ROWWISE:  # one block per row
        s, scale_inv = blockwise_scale(block_amax(magnitude, 1), FMAX, INPUT_MAX, POWER_OF_TWO)
        q = (values * s[:, None]).to(row_data_ptr.dtype.element_ty)
        tl.store(row_data_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], q, mask=row_mask[:, None])
        tl.store(row_scale_ptr + col_block * ROW_SCALE_STRIDE + rows, scale_inv, mask=row_mask)
    if COLUMNWISE:  # one block per column: these 128 tokens of the expert
        s, scale_inv = blockwise_scale(block_amax(magnitude, 0), FMAX, INPUT_MAX, POWER_OF_TWO)
        q_t = tl.trans((values * s[None, :]).to(col_data_ptr.dtype.element_ty))
        # the whole block, its rows past the expert's end as the zeros they hold (the layout's padding)
        block_columns = token_block * 128 + tl.arange(0, 128)
        tl.store(col_data_ptr + cols[:, None].to(tl.int64) * COL_DATA_STRIDE + block_columns[None, :], q_t)
        tl.store(col_scale_ptr + cols.to(tl.int64) * COL_SCALE_STRIDE + token_block, scale_inv)


@triton.jit
def store_unused_column_block(
    col_block,  # the 128-column block: columns 128 col_block ..
    token_block,  # a columnwise block past the last expert's
    col_data_ptr, col_scale_ptr, COL_SCALE_STRIDE, COL_DATA_STRIDE,  # as store_blockwise_both_ways
):
    cols = col_block * 128 + tl.arange(0, 128)
    block_columns = token_block * 128 + tl.arange(0, 128)
    tl.store(col_data_ptr + cols[:, None].to(tl.int64) * COL_DATA_STRIDE + block_columns[None, :],
             tl.zeros((128, 128), col_data_ptr.dtype.element_ty))
    tl.store(col_scale_ptr + cols.to(tl.int64) * COL_SCALE_STRIDE + token_block, tl.full((128,), 1.0, tl.float32))
