"""Triton kernels: FP8 blockwise quantization of a token operand (1 x 128 and 128 x 1 in one
pass) and of weight tiles (128 x 128: W's, W^T's, or both from one read of W).

Token operand (T, K), rows grouped by expert: a program owns one expert-aligned 128-row tile
(``_grouping.group_tile``) and walks BLOCKS_PER_PROGRAM 128-column blocks of it. Each (128, 128)
block of x is both a stack of 128 rowwise blocks (amax along K) and of 128 columnwise blocks
(amax along the tokens): an expert's 128-token blocks are exactly its 128-row tiles, so the
columnwise block index is the tile index, and a tile past the last expert (all rows masked)
writes ``scale_inv = 1`` there, the layout's value for unused blocks.

A block is read as two 64-row halves: each half's rows are whole rowwise blocks (quantized and
stored at once) and give their part of the column maxima; the columnwise pass then reads both
halves again (from L1/L2) with the column scales. Holding one half at a time instead of the
whole (128, 128) fp32 block and its two quantized copies halves the registers a program needs:
the whole block ran one 512-thread program an SM (128 registers a thread), latency-bound at 0.30
of copy bandwidth (ncu on the H100, 2026-12-05).
"""

import triton
import triton.language as tl

from gmlp.triton_ref._blockwise_math import blockwise_scale
from gmlp.triton_ref._grouping import group_tile
from gmlp.triton_ref._mxfp8_math import block_amax

HALF = tl.constexpr(64)  # rows of a half block


@triton.jit
def quantize_fp8_blockwise_kernel(
    x_ptr,  # (T, K) bf16 | fp32, contiguous
    row_start_ptr,  # (E+1,) int32 prefix sums of split sizes (GROUPED)
    tile_start_ptr,  # (E+1,) int32 prefix sums of ceil(m_g/128) (GROUPED)
    row_data_ptr,  # (T, K) fp8
    row_scale_ptr,  # (K/128, ROW_SCALE_STRIDE) fp32, MN-major
    col_data_ptr,  # (K, COL_DATA_STRIDE) fp8, transposed, each expert's tokens from a block's start
    col_scale_ptr,  # (K, COL_SCALE_STRIDE) fp32
    NUM_ROWS, NUM_COLS, ROW_SCALE_STRIDE, COL_SCALE_STRIDE, COL_DATA_STRIDE,
    FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr,
    GROUPED: tl.constexpr, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr,
    BLOCKS_PER_PROGRAM: tl.constexpr,
):
    tile = tl.program_id(0)
    first_row, end_row, _, _, _ = group_tile(tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED,
                                             NUM_ROWS)
    lanes = tl.arange(0, 128)
    half_lanes = tl.arange(0, HALF)
    first_block = tl.program_id(1) * BLOCKS_PER_PROGRAM
    last_block = tl.minimum(first_block + BLOCKS_PER_PROGRAM, NUM_COLS // 128)
    for block in tl.range(first_block, last_block):
        cols = block * 128 + lanes
        col_amax = tl.zeros((128,), tl.float32)
        for half in tl.static_range(2):
            # rows past the expert's end read as zeros (in both amaxes) and are not written
            rows = first_row + half * HALF + half_lanes
            row_mask = rows < end_row
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], mask=row_mask[:, None],
                        other=0.0).to(tl.float32)
            magnitude = tl.abs(x)
            if ROWWISE:  # one block per row
                s, scale_inv = blockwise_scale(block_amax(magnitude, 1), FMAX, INPUT_MAX, POWER_OF_TWO)
                q = (x * s[:, None]).to(row_data_ptr.dtype.element_ty)
                tl.store(row_data_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], q,
                         mask=row_mask[:, None])
                tl.store(row_scale_ptr + block * ROW_SCALE_STRIDE + rows, scale_inv, mask=row_mask)
            col_amax = tl.maximum(col_amax, block_amax(magnitude, 0))  # NaN-free: block_amax's floor of 0
        if COLUMNWISE:  # one block per column: the tile's 128 tokens of the expert
            s, scale_inv = blockwise_scale(col_amax, FMAX, INPUT_MAX, POWER_OF_TWO)
            for half in tl.static_range(2):
                rows = first_row + half * HALF + half_lanes
                row_mask = rows < end_row
                x = tl.load(x_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], mask=row_mask[:, None],
                            other=0.0).to(tl.float32)
                q_t = tl.trans((x * s[None, :]).to(col_data_ptr.dtype.element_ty))
                # the whole block, its rows past the expert's end as the zeros they hold (the layout's padding)
                tokens = tile * 128 + half * HALF + half_lanes
                tl.store(col_data_ptr + cols[:, None].to(tl.int64) * COL_DATA_STRIDE + tokens[None, :], q_t)
            tl.store(col_scale_ptr + cols.to(tl.int64) * COL_SCALE_STRIDE + tile, scale_inv)


@triton.jit
def quantize_weight_tiles_kernel(
    w_ptr,  # (R, K) bf16 | fp32, contiguous: a stack (E, N, K) as (E * N, K), N a multiple of 128
    data_ptr,  # (R, K) fp8: W's tiles (TILES)
    scale_ptr,  # (R/128, K/128) fp32 (TILES)
    t_data_ptr,  # (E, K, N) fp8: each expert's transposed tiles (TRANSPOSED)
    t_scale_ptr,  # (E, K/128, N/128) fp32 (TRANSPOSED)
    NUM_COLS,  # K
    EXPERT_ROWS,  # N: the rows of one expert's weight (TRANSPOSED's row-tile -> expert)
    FMAX: tl.constexpr, INPUT_MAX: tl.constexpr, POWER_OF_TWO: tl.constexpr, TILES: tl.constexpr,
    TRANSPOSED: tl.constexpr,
):
    """One 128 x 128 tile of W read once, quantized once, and written as W's tile (TILES), as its
    transpose into W^T (TRANSPOSED), or both: the two orientations of one read."""
    tile_row, block = tl.program_id(0), tl.program_id(1)
    lanes = tl.arange(0, 128)
    offsets = (tile_row * 128 + lanes)[:, None].to(tl.int64) * NUM_COLS + (block * 128 + lanes)[None, :]
    x = tl.load(w_ptr + offsets).to(tl.float32)
    amax = tl.max(block_amax(tl.abs(x), 1), 0)  # per row, then over the tile's rows
    s, scale_inv = blockwise_scale(amax, FMAX, INPUT_MAX, POWER_OF_TWO)
    q = (x * s).to(data_ptr.dtype.element_ty)
    if TILES:
        tl.store(data_ptr + offsets, q)
        tl.store(scale_ptr + tile_row * (NUM_COLS // 128) + block, scale_inv)
    if TRANSPOSED:  # the tile's transpose at (k-tile, n-tile) of W_g^T: bit for bit the quantized W^T
        row_tiles = EXPERT_ROWS // 128
        expert, n_tile = tile_row // row_tiles, tile_row % row_tiles
        expert_base = expert.to(tl.int64) * NUM_COLS * EXPERT_ROWS
        t_offsets = (expert_base + (block * 128 + lanes)[:, None].to(tl.int64) * EXPERT_ROWS
                     + (n_tile * 128 + lanes)[None, :])
        tl.store(t_data_ptr + t_offsets, tl.trans(q))
        tl.store(t_scale_ptr + (expert * (NUM_COLS // 128) + block) * row_tiles + n_tile, scale_inv)
