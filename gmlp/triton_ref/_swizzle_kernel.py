"""Triton kernel: compact <-> swizzled E8M0 scale layouts, plain or grouped by expert."""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile, swizzled_offset


@triton.jit
def swizzle_scales_kernel(
    compact_ptr,  # rowwise: (T, C); columnwise: (K, n_blocks)
    swizzled_ptr,  # flat, layout of gmlp.mxfp8.scale_layout
    row_start_ptr,  # (E+1,) int32 prefix sums of split sizes (GROUPED)
    tile_start_ptr,  # (E+1,) int32 prefix sums of ceil(m_g/128) (GROUPED)
    block_start_ptr,  # (E+1,) int32 prefix sums of ceil(m_g/32) (GROUPED)
    NUM_TOKENS,  # T
    NUM_COMPACT_ROWS,  # rowwise: T; columnwise: K
    NUM_COMPACT_COLS,  # rowwise: C = K/32; columnwise: n_blocks
    COLUMNWISE: tl.constexpr,  # groups along the compact columns (token blocks) instead of rows
    UNSWIZZLE: tl.constexpr,  # direction: swizzled -> compact
    GROUPED: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    SEARCH_STEPS: tl.constexpr,
):
    """One program moves one 128x4 scale tile (512 bytes).

    program_id(0) is the 128-token tile of the expert-aligned tiling; program_id(1) the 4-column
    tile (rowwise) or the 128-row K tile (columnwise). Swizzling writes every byte of the padded
    layout (zeros where there is no scale); unswizzling writes only the real compact entries.
    """
    tile = tl.program_id(0)
    other = tl.program_id(1)
    first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED, NUM_TOKENS)
    lanes_128 = tl.arange(0, 128)
    lanes_4 = tl.arange(0, 4)
    local_tile = tile - group_tile_start
    if COLUMNWISE:
        k = other * 128 + lanes_128
        if GROUPED:
            group_block_start = tl.load(block_start_ptr + group)
        else:
            group_block_start = 0
        group_blocks = tl.cdiv(end_row - first_row + local_tile * 128, 32)  # ceil(m_g/32); 0 when idle
        local_blocks = local_tile * 4 + lanes_4
        compact_offsets = k[:, None].to(tl.int64) * NUM_COMPACT_COLS + group_block_start + local_blocks[None, :]
        valid = (k < NUM_COMPACT_ROWS)[:, None] & (local_blocks < group_blocks)[None, :]
        padded_k = tl.cdiv(NUM_COMPACT_ROWS, 128) * 128
        base = padded_k.to(tl.int64) * 4 * group_tile_start
        swizzled_offsets = base + swizzled_offset(k[:, None], local_blocks[None, :], group_tiles)
    else:
        rows = first_row + lanes_128
        scale_cols = other * 4 + lanes_4
        compact_offsets = rows[:, None].to(tl.int64) * NUM_COMPACT_COLS + scale_cols[None, :]
        valid = (rows < end_row)[:, None] & (scale_cols < NUM_COMPACT_COLS)[None, :]
        swizzled_offsets = swizzled_offset(tile * 128 + lanes_128[:, None], scale_cols[None, :],
                                           tl.cdiv(NUM_COMPACT_COLS, 4))
    if UNSWIZZLE:
        values = tl.load(swizzled_ptr + swizzled_offsets, mask=valid)
        tl.store(compact_ptr + compact_offsets, values, mask=valid)
    else:
        values = tl.load(compact_ptr + compact_offsets, mask=valid, other=0)
        tl.store(swizzled_ptr + swizzled_offsets, values)
