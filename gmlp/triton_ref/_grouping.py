"""Triton device functions for expert-grouped tilings and the swizzled scale index (scale_layout)."""

import triton
import triton.language as tl


@triton.jit
def find_group(tile, unit_start, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr):
    """Largest g < NUM_GROUPS with unit_start[g] <= tile (binary search over device prefix sums)."""
    lo = 0
    hi = NUM_GROUPS
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        go_right = tl.load(unit_start + mid) <= tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit
def group_tile(tile, row_start, tile_start, NUM_GROUPS: tl.constexpr, SEARCH_STEPS: tl.constexpr, GROUPED: tl.constexpr,
               NUM_ROWS):
    """Locate 128-row tile number ``tile`` of the expert-aligned tiling.

    Returns (first_row, end_row, group_tile_start, group_tiles, group): the tile covers rows
    [first_row, first_row + 128) of which those below end_row are real. A tile past the last
    expert acts as an empty expert of one tile starting at itself, so that it writes the zero
    padding of the swizzled layouts through the same code as the others.
    """
    if GROUPED:
        total_tiles = tl.load(tile_start + NUM_GROUPS)
        group = find_group(tile, tile_start, NUM_GROUPS, SEARCH_STEPS)
        group_tile_start = tl.load(tile_start + group)
        group_first_row = tl.load(row_start + group)
        group_end_row = tl.load(row_start + group + 1)
        group_tiles = tl.load(tile_start + group + 1) - group_tile_start
        idle = tile >= total_tiles
        first_row = group_first_row + (tile - group_tile_start) * 128
        end_row = tl.where(idle, first_row, group_end_row)
        group_tile_start = tl.where(idle, tile, group_tile_start)
        group_tiles = tl.where(idle, 1, group_tiles)
    else:
        group = 0
        first_row = tile * 128
        end_row = NUM_ROWS
        group_tile_start = 0
        group_tiles = tl.cdiv(NUM_ROWS, 128)
    return first_row, end_row, group_tile_start, group_tiles, group


@triton.jit
def output_tile(N_FASTEST: tl.constexpr):
    """(row tile, column tile, column tiles) of this program of a 2-D GEMM grid. The grid is
    (row tiles, column tiles), or, N_FASTEST, (column tiles, row tiles): programs launch in
    grid order, so consecutive programs then share a row tile (its A rows stay in L2) instead of
    a column tile (its B columns)."""
    if N_FASTEST:
        return tl.program_id(1), tl.program_id(0), tl.num_programs(0)
    return tl.program_id(0), tl.program_id(1), tl.num_programs(1)


@triton.jit
def swizzled_offset(i, j, col_tiles):
    """Flat offset of scale (i, j) in a swizzled matrix with col_tiles 4-column tiles (scale_layout)."""
    return ((i // 128) * col_tiles + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + (j % 4)
