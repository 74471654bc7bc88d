"""Triton kernel: fused one-pass MXFP8 quantization (rowwise + columnwise) of a (T, K) tensor.

Work unit: a 32x32 block of x, the intersection of one rowwise and one columnwise quantization
block. A program owns one 32-row slice of an expert-aligned 128-row tile and walks along K over
CHUNKS_PER_PROGRAM such blocks. With one warp per program the 32x32 block lives in one warp, so
both reductions (along K for rowwise, along T for columnwise) and the transpose stay within the
warp: no shared-memory round trip, no barrier, few registers, many programs per SM.
"""

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
    CHUNKS_PER_PROGRAM: tl.constexpr,  # 32-column blocks each program walks over
    NUM_STAGES: tl.constexpr,  # software pipelining depth of that walk (loads run ahead)
):
    tile = tl.program_id(0) // 4
    slice_row = (tl.program_id(0) % 4) * 32  # first row of this 32-row slice within the tile
    tile_first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED, NUM_ROWS)
    first_row = tile_first_row + slice_row
    lanes = tl.arange(0, 32)
    rows = first_row + lanes
    row_mask = rows < end_row  # rows past the expert's end read as zeros
    # Full, 16-aligned slices store the transposed data unmasked along rows from a first row the
    # compiler can see is a multiple of 16 (it equals first_row there): 16-byte vector stores.
    full_aligned_slice = (end_row - first_row >= 32) & (first_row % 16 == 0)
    aligned_rows = (first_row // 16) * 16 + lanes
    local_block = (tile - group_tile_start) * 4 + slice_row // 32  # columnwise block within the expert

    # Swizzled layouts: walking K up to its padding writes the zero scales of the padding too.
    if SWIZZLE:
        num_chunks = tl.cdiv(NUM_COLS, 128) * 4
    else:
        num_chunks = tl.cdiv(NUM_COLS, 32)
    first_chunk = tl.program_id(1) * CHUNKS_PER_PROGRAM
    last_chunk = tl.minimum(first_chunk + CHUNKS_PER_PROGRAM, num_chunks)
    for chunk in tl.range(first_chunk, last_chunk, num_stages=NUM_STAGES):
        cols = chunk * 32 + lanes
        col_mask = cols < NUM_COLS
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :],
                    mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        magnitude = nan_ignoring_abs(x)

        if ROWWISE:
            e = e8m0_from_amax(tl.max(magnitude, axis=1), RECIPROCAL_MAX, EMAX, FLOOR_MODE)  # (32,) per row
            q = (x * quantize_multiplier(e)[:, None]).to(row_data_ptr.dtype.element_ty)
            tl.store(row_data_ptr + rows[:, None].to(tl.int64) * NUM_COLS + cols[None, :], q,
                     mask=row_mask[:, None] & col_mask[None, :])
            if SWIZZLE:
                # Row `slice_row + lane` of tile row `tile` of the grouped swizzled layout.
                offsets = swizzled_offset(tile * 128 + slice_row + lanes, chunk, tl.cdiv(NUM_COLS, 128))
                tl.store(row_scale_ptr + offsets, e.to(tl.uint8))
            else:
                # Compact: chunks stop at K (num_chunks = K/32), so only rows need a mask.
                tl.store(row_scale_ptr + rows.to(tl.int64) * (NUM_COLS // 32) + chunk, e.to(tl.uint8), mask=row_mask)

        if COLUMNWISE:
            # One block of 32 rows per column; slices start at expert-aligned rows, so blocks never
            # cross experts, and a partial trailing block sees zeros past the expert's end.
            e = e8m0_from_amax(tl.max(magnitude, axis=0), RECIPROCAL_MAX, EMAX, FLOOR_MODE)  # (32,) per column
            q_t = tl.trans((x * quantize_multiplier(e)[None, :]).to(col_data_ptr.dtype.element_ty))  # (K, T) block
            col_rows = cols[:, None].to(tl.int64) * NUM_ROWS
            if full_aligned_slice:
                tl.store(col_data_ptr + col_rows + aligned_rows[None, :], q_t, mask=col_mask[:, None])
            else:
                tl.store(col_data_ptr + col_rows + rows[None, :], q_t, mask=col_mask[:, None] & row_mask[None, :])
            if SWIZZLE:
                # Expert g's scales form their own swizzled (K, 4 * group_tiles) matrix at byte
                # ceil(K/128)*128 * 4 * tile_start[g]; k runs up to that padded K.
                base = (tl.cdiv(NUM_COLS, 128) * 128).to(tl.int64) * 4 * group_tile_start
                tl.store(col_scale_ptr + base + swizzled_offset(cols, local_block, group_tiles), e.to(tl.uint8))
            else:
                if GROUPED:
                    group_block_start = tl.load(block_start_ptr + group)
                    group_blocks = tl.load(block_start_ptr + group + 1) - group_block_start
                    group_blocks = tl.where(end_row > first_row, group_blocks, 0)  # idle tile: nothing
                else:
                    group_block_start = 0
                    group_blocks = tl.cdiv(NUM_ROWS, 32)
                # local_block broadcast to a vector: the interpreter wants tensor masks.
                valid = col_mask & (local_block + tl.zeros_like(lanes) < group_blocks)
                tl.store(col_scale_ptr + cols.to(tl.int64) * NUM_COL_BLOCKS + group_block_start + local_block,
                         e.to(tl.uint8), mask=valid)
