"""Triton kernels: fused one-pass MXFP8 quantization (rowwise + columnwise) of a (T, K) tensor."""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile, swizzled_offset
from gmlp.triton_ref._mxfp8_math import e8m0_from_amax, nan_ignoring_abs, quantize_multiplier


@triton.jit
def quantize_mxfp8_kernel(
    # input
    x_ptr,  # (T, K) bf16 | fp32
    row_start_ptr,  # (E+1,) int32 prefix sums of split sizes (GROUPED)
    tile_start_ptr,  # (E+1,) int32 prefix sums of ceil(m_g/128) (GROUPED)
    block_start_ptr,  # (E+1,) int32 prefix sums of ceil(m_g/32) (GROUPED)
    # outputs
    row_data_ptr,  # (T, K) fp8
    row_scale_ptr,  # compact (T, K/32) | swizzled flat
    col_data_ptr,  # (K, T) fp8, transposed
    col_scale_ptr,  # compact (K, n_blocks) | swizzled flat
    # sizes
    NUM_ROWS,  # T
    NUM_COLS,  # K
    NUM_COL_BLOCKS,  # n_blocks of the compact columnwise scales
    # format
    RECIPROCAL_MAX: tl.constexpr,
    EMAX: tl.constexpr,
    FLOOR_MODE: tl.constexpr,
    # what to write
    ROWWISE: tl.constexpr,
    COLUMNWISE: tl.constexpr,
    SWIZZLE: tl.constexpr,
    # grouping
    GROUPED: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
    # tiling
    BLOCK_M: tl.constexpr,  # rows per program: 32, 64 or 128 (a slice of one 128-row tile)
    BLOCK_K: tl.constexpr,
):
    tl.static_assert(BLOCK_K % 128 == 0, f"{BLOCK_K=} must be a multiple of 128 to cover the swizzled padding")
    tl.static_assert(128 % BLOCK_M == 0 and BLOCK_M % 32 == 0, f"{BLOCK_M=} must be 32, 64 or 128")
    SLICES: tl.constexpr = 128 // BLOCK_M
    SCALES_K: tl.constexpr = BLOCK_K // 32
    BLOCKS_M: tl.constexpr = BLOCK_M // 32
    tile = tl.program_id(0) // SLICES
    slice_row = (tl.program_id(0) % SLICES) * BLOCK_M  # first row of this slice within the tile
    pid_k = tl.program_id(1)
    tile_first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED, NUM_ROWS)

    # One read of the (BLOCK_M, BLOCK_K) slice; rows past the expert's end read as zeros.
    first_row = tile_first_row + slice_row
    local_rows = tl.arange(0, BLOCK_M)
    rows = first_row + local_rows
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    row_mask = rows < end_row
    col_mask = cols < NUM_COLS
    mask = row_mask[:, None] & col_mask[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    magnitude = nan_ignoring_abs(x)

    if ROWWISE:
        amax = tl.max(tl.reshape(magnitude, (BLOCK_M, SCALES_K, 32)), axis=2)
        e = e8m0_from_amax(amax, RECIPROCAL_MAX, EMAX, FLOOR_MODE)
        scaled = tl.reshape(x, (BLOCK_M, SCALES_K, 32)) * quantize_multiplier(e)[:, :, None]
        q = tl.reshape(scaled, (BLOCK_M, BLOCK_K)).to(row_data_ptr.dtype.element_ty)
        tl.store(row_data_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], q, mask=mask)
        scale_cols = pid_k * SCALES_K + tl.arange(0, SCALES_K)
        num_scale_cols = NUM_COLS // 32
        if SWIZZLE:
            # This slice is part of tile row `tile` of the grouped swizzled layout; all its rows
            # and the padding columns up to a multiple of 4 are written (zeros where no data).
            col_tiles = tl.cdiv(num_scale_cols, 4)
            offsets = swizzled_offset(tile * 128 + slice_row + local_rows[:, None], scale_cols[None, :], col_tiles)
            tl.store(row_scale_ptr + offsets, e.to(tl.uint8), mask=(scale_cols < col_tiles * 4)[None, :])
        else:
            offsets = rows[:, None].to(tl.int64) * num_scale_cols + scale_cols[None, :]
            tl.store(row_scale_ptr + offsets, e.to(tl.uint8), mask=row_mask[:, None] & (scale_cols < num_scale_cols)[None, :])

    if COLUMNWISE:
        # Blocks of 32 rows along tokens; slices start at expert-aligned rows, so blocks never
        # cross experts, and a partial trailing block sees zeros past the expert's end.
        amax = tl.max(tl.reshape(magnitude, (BLOCKS_M, 32, BLOCK_K)), axis=1)
        e = e8m0_from_amax(amax, RECIPROCAL_MAX, EMAX, FLOOR_MODE)
        scaled = tl.reshape(x, (BLOCKS_M, 32, BLOCK_K)) * quantize_multiplier(e)[:, None, :]
        q_t = tl.trans(tl.reshape(scaled, (BLOCK_M, BLOCK_K)).to(col_data_ptr.dtype.element_ty))  # (BLOCK_K, BLOCK_M)
        col_rows = cols[:, None].to(tl.int64) * NUM_ROWS
        if (end_row - first_row >= BLOCK_M) & (first_row % 16 == 0):
            # Full, 16-aligned slice: no row mask, and a first row the compiler can see is a
            # multiple of 16 (it equals first_row here), so the transposed rows go out as vectors.
            aligned_rows = (first_row // 16) * 16 + local_rows
            tl.store(col_data_ptr + col_rows + aligned_rows[None, :], q_t, mask=col_mask[:, None])
        else:
            tl.store(col_data_ptr + col_rows + rows[None, :], q_t, mask=col_mask[:, None] & row_mask[None, :])
        local_tile = tile - group_tile_start
        local_blocks = local_tile * 4 + slice_row // 32 + tl.arange(0, BLOCKS_M)
        e_t = tl.trans(e)  # (BLOCK_K, BLOCKS_M): scale (k, block)
        if SWIZZLE:
            # Expert g's scales form their own swizzled (K, 4 * group_tiles) matrix at byte
            # ceil(K/128)*128 * 4 * tile_start[g].
            padded_k = tl.cdiv(NUM_COLS, 128) * 128
            base = padded_k.to(tl.int64) * 4 * group_tile_start
            offsets = base + swizzled_offset(cols[:, None], local_blocks[None, :], group_tiles)
            tl.store(col_scale_ptr + offsets, e_t.to(tl.uint8), mask=(cols < padded_k)[:, None])
        else:
            if GROUPED:
                group_block_start = tl.load(block_start_ptr + group)
                group_blocks = tl.load(block_start_ptr + group + 1) - group_block_start
                group_blocks = tl.where(end_row > tile_first_row, group_blocks, 0)  # idle tile: nothing
            else:
                group_block_start = 0
                group_blocks = tl.cdiv(NUM_ROWS, 32)
            offsets = cols[:, None].to(tl.int64) * NUM_COL_BLOCKS + group_block_start + local_blocks[None, :]
            valid = col_mask[:, None] & (local_blocks < group_blocks)[None, :]
            tl.store(col_scale_ptr + offsets, e_t.to(tl.uint8), mask=valid)
