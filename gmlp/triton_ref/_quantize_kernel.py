"""Triton kernel: fused one-pass MXFP8 quantization (rowwise + columnwise) of a (T, K) tensor.

Work unit: a 32x32 block of x, the intersection of one rowwise and one columnwise quantization
block. A program owns one 32-row slice of an expert-aligned 128-row tile and walks along K over
CHUNKS_PER_PROGRAM such blocks. With one warp per program the 32x32 block lives in one warp, so
both reductions (along K for rowwise, along T for columnwise) and the transpose stay within the
warp. The kernel is close to instruction-bound on Hopper, so the walk keeps per-element work to
the spec's arithmetic: addresses and scale offsets are split into a loop-invariant part and a
per-chunk scalar, and full slices (the common case) run without any mask.
"""

import triton
import triton.language as tl

from gmlp.triton_ref._grouping import group_tile
from gmlp.triton_ref._mxfp8_math import block_amax, e8m0_from_amax, quantize_multiplier


@triton.jit
def _load_chunk(x_slice, chunk, lanes, row_mask, end_chunk, X_ROW_STRIDE, MASKED: tl.constexpr):
    """The (32, 32) block of chunk ``chunk`` as loaded (bf16 stays packed until used): zeros past
    the expert's rows, and no access at all from ``end_chunk`` on."""
    cols = chunk * 32 + lanes
    offsets = lanes[:, None] * X_ROW_STRIDE + cols[None, :]
    in_range = cols[None, :] < end_chunk * 32  # a vector compare, uniform over each 16-byte vector
    if MASKED:
        return tl.load(x_slice + offsets, mask=row_mask[:, None] & in_range, other=0.0)
    return tl.load(x_slice + offsets, mask=in_range)


@triton.jit
def _quantize_chunk(
    x,  # (32, 32) block of x, as loaded
    chunk,  # index of the 32-column chunk
    lanes,  # (32,) 0..31
    row_mask,  # (32,) rows of the slice that hold data (MASKED only)
    row_data_slice,  # rowwise data at (first_row, 0)
    col_data_slice,  # columnwise data (K, T) at (0, first_row)
    row_scale_lane_offsets,  # (32,) per-row part of the rowwise scale offsets
    col_scale_lane_offsets,  # (32,) per-column part of the columnwise scale offsets
    col_scale_group_base,  # scalar part of the columnwise scale offsets common to all chunks
    row_scale_ptr, col_scale_ptr, col_scale_valid,
    NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, col_tiles_of_group,
    RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, SWIZZLE: tl.constexpr, MASKED: tl.constexpr,
):
    offsets = lanes[:, None] * NUM_COLS + (chunk * 32 + lanes)[None, :]  # (row, column) within the slice
    x = x.to(tl.float32)
    magnitude = tl.abs(x)

    if ROWWISE:
        e = e8m0_from_amax(block_amax(magnitude, 1), RECIPROCAL_MAX, EMAX, FLOOR_MODE)  # (32,) one per row
        q = (x * quantize_multiplier(e)[:, None]).to(row_data_slice.dtype.element_ty)
        if MASKED:
            tl.store(row_data_slice + offsets, q, mask=row_mask[:, None])
        else:
            tl.store(row_data_slice + offsets, q)
        if SWIZZLE:
            # scale (i, j) at ((i//128)*col_tiles + j//4)*512 + (i%32)*16 + ((i%128)//32)*4 + j%4:
            # the i part is per lane, the j = chunk part is one scalar.
            tl.store(row_scale_ptr + row_scale_lane_offsets + ((chunk // 4) * 512 + chunk % 4), e.to(tl.uint8))
        elif MASKED:
            tl.store(row_scale_ptr + row_scale_lane_offsets + chunk, e.to(tl.uint8), mask=row_mask)
        else:
            tl.store(row_scale_ptr + row_scale_lane_offsets + chunk, e.to(tl.uint8))

    if COLUMNWISE:
        # One block of 32 rows per column: slices start at expert-aligned rows, so blocks never
        # cross experts, and a partial trailing block sees zeros past the expert's end.
        e = e8m0_from_amax(block_amax(magnitude, 0), RECIPROCAL_MAX, EMAX, FLOOR_MODE)  # (32,) one per column
        q_t = tl.trans((x * quantize_multiplier(e)[None, :]).to(col_data_slice.dtype.element_ty))
        col_data_chunk = col_data_slice + tl.cast(chunk, tl.int64) * 32 * NUM_ROWS
        transposed = lanes[:, None] * NUM_ROWS + lanes[None, :]  # (k, row) within the chunk
        if MASKED:
            tl.store(col_data_chunk + transposed, q_t, mask=row_mask[None, :])
        else:
            tl.store(col_data_chunk + transposed, q_t)
        if SWIZZLE:
            # k = chunk*32 + lane: (k//128)*col_tiles*512 + ((k%128)//32)*4 is per chunk, (k%32)*16 per lane.
            chunk_part = col_scale_group_base + (chunk // 4) * col_tiles_of_group * 512 + (chunk % 4) * 4
            tl.store(col_scale_ptr + col_scale_lane_offsets + chunk_part, e.to(tl.uint8))
        else:
            chunk_part = col_scale_group_base + tl.cast(chunk, tl.int64) * 32 * NUM_COL_BLOCKS
            tl.store(col_scale_ptr + chunk_part + col_scale_lane_offsets, e.to(tl.uint8), mask=col_scale_valid)


@triton.jit
def _walk(
    first_chunk, last_chunk, lanes, row_mask, x_slice, row_data_slice, col_data_slice,
    row_scale_lane_offsets, col_scale_lane_offsets, col_scale_group_base,
    row_scale_ptr, col_scale_ptr, col_scale_valid,
    NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, col_tiles_of_group, X_ROW_STRIDE,
    RECIPROCAL_MAX: tl.constexpr, EMAX: tl.constexpr, FLOOR_MODE: tl.constexpr,
    ROWWISE: tl.constexpr, COLUMNWISE: tl.constexpr, SWIZZLE: tl.constexpr, MASKED: tl.constexpr,
):
    """Quantize chunks [first_chunk, last_chunk) of one slice, loading chunk c + 1 before
    quantizing chunk c (register double buffering): a one-warp program has little else to
    overlap with DRAM latency."""
    x = _load_chunk(x_slice, first_chunk, lanes, row_mask, last_chunk, X_ROW_STRIDE, MASKED)
    for chunk in tl.range(first_chunk, last_chunk):
        x_next = _load_chunk(x_slice, chunk + 1, lanes, row_mask, last_chunk, X_ROW_STRIDE, MASKED)
        _quantize_chunk(x, chunk, lanes, row_mask, row_data_slice, col_data_slice, row_scale_lane_offsets,
                        col_scale_lane_offsets, col_scale_group_base, row_scale_ptr, col_scale_ptr, col_scale_valid,
                        NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, col_tiles_of_group,
                        RECIPROCAL_MAX, EMAX, FLOOR_MODE, ROWWISE, COLUMNWISE, SWIZZLE, MASKED)
        x = x_next


@triton.jit
def quantize_mxfp8_kernel(
    # input
    x_ptr,  # (T, K) bf16 | fp32, rows contiguous (STRIDED: X_ROW_STRIDE apart, else K)
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
    X_ROW_STRIDE,  # elements from one row of x to the next (read with STRIDED only)
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
    STRIDED: tl.constexpr,  # x's rows are X_ROW_STRIDE apart (a view: W1's gate or up rows, gmlp.contract.gate_up)
    # tiling
    CHUNKS_PER_PROGRAM: tl.constexpr,  # 32-column chunks each program walks over
    CHUNKS_FASTEST: tl.constexpr,  # grid (chunk groups, slices), else (slices, chunk groups)
):
    slice_id = tl.program_id(1) if CHUNKS_FASTEST else tl.program_id(0)
    chunk_group = tl.program_id(0) if CHUNKS_FASTEST else tl.program_id(1)
    tile = slice_id // 4
    slice_row = (slice_id % 4) * 32  # first row of this 32-row slice within the tile
    tile_first_row, end_row, group_tile_start, group_tiles, group = group_tile(
        tile, row_start_ptr, tile_start_ptr, NUM_GROUPS, SEARCH_STEPS, GROUPED, NUM_ROWS)
    first_row = tile_first_row + slice_row
    lanes = tl.arange(0, 32)
    row_mask = first_row + lanes < end_row  # rows past the expert's end read as zeros
    # Full, 16-aligned slices run unmasked; their first row is written as (first_row // 16) * 16,
    # equal to it there, so that the compiler sees the transposed stores' 16-byte alignment.
    full_slice = (end_row - first_row >= 32) & (first_row % 16 == 0)
    aligned_first_row = (first_row // 16) * 16
    local_block = (tile - group_tile_start) * 4 + slice_row // 32  # columnwise block within the expert

    x_row_stride = X_ROW_STRIDE if STRIDED else NUM_COLS
    x_slice = x_ptr + first_row.to(tl.int64) * x_row_stride
    row_data_slice = row_data_ptr + first_row.to(tl.int64) * NUM_COLS
    col_tiles = tl.cdiv(NUM_COLS, 128)  # 4-column tiles of the rowwise scales (K/32 columns)
    if SWIZZLE:
        swizzled_row = tile * 128 + slice_row + lanes
        row_scale_lane_offsets = (swizzled_row // 128).to(tl.int64) * col_tiles * 512 + (swizzled_row % 32) * 16 + (
            (swizzled_row % 128) // 32) * 4
        # Expert g's columnwise scales: its own swizzled (K, 4 * group_tiles) matrix at byte
        # ceil(K/128)*128 * 4 * tile_start[g]; this slice is its column local_block.
        col_scale_group_base = (col_tiles * 128).to(tl.int64) * 4 * group_tile_start + (local_block // 4) * 512 + local_block % 4
        col_scale_lane_offsets = lanes * 16
        col_scale_valid = lanes >= 0
    else:
        row_scale_lane_offsets = (first_row + lanes).to(tl.int64) * (NUM_COLS // 32)
        if GROUPED:
            group_block_start = tl.load(block_start_ptr + group)
            group_blocks = tl.load(block_start_ptr + group + 1) - group_block_start
            group_blocks = tl.where(end_row > first_row, group_blocks, 0)  # idle tile: nothing
        else:
            group_block_start = 0
            group_blocks = tl.cdiv(NUM_ROWS, 32)
        col_scale_group_base = group_block_start + local_block
        col_scale_lane_offsets = lanes.to(tl.int64) * NUM_COL_BLOCKS
        col_scale_valid = local_block + tl.zeros_like(lanes) < group_blocks

    data_chunks = NUM_COLS // 32
    first_chunk = chunk_group * CHUNKS_PER_PROGRAM
    last_chunk = tl.minimum(first_chunk + CHUNKS_PER_PROGRAM, data_chunks)
    if full_slice:
        _walk(first_chunk, last_chunk, lanes, row_mask, x_slice, row_data_slice, col_data_ptr + aligned_first_row,
              row_scale_lane_offsets, col_scale_lane_offsets, col_scale_group_base, row_scale_ptr, col_scale_ptr,
              col_scale_valid, NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, group_tiles, x_row_stride,
              RECIPROCAL_MAX, EMAX, FLOOR_MODE, ROWWISE, COLUMNWISE, SWIZZLE, MASKED=False)
    else:
        _walk(first_chunk, last_chunk, lanes, row_mask, x_slice, row_data_slice, col_data_ptr + first_row,
              row_scale_lane_offsets, col_scale_lane_offsets, col_scale_group_base, row_scale_ptr, col_scale_ptr,
              col_scale_valid, NUM_ROWS, NUM_COLS, NUM_COL_BLOCKS, group_tiles, x_row_stride,
              RECIPROCAL_MAX, EMAX, FLOOR_MODE, ROWWISE, COLUMNWISE, SWIZZLE, MASKED=True)

    if SWIZZLE:
        # Padding chunks, K <= k < ceil(K/128)*128: their scales are the layout's zero padding.
        zeros = tl.zeros_like(lanes).to(tl.uint8)
        padded_chunks = col_tiles * 4
        for chunk in tl.range(tl.maximum(first_chunk, data_chunks), tl.minimum(first_chunk + CHUNKS_PER_PROGRAM, padded_chunks)):
            if ROWWISE:
                tl.store(row_scale_ptr + row_scale_lane_offsets + ((chunk // 4) * 512 + chunk % 4), zeros)
            if COLUMNWISE:
                chunk_part = col_scale_group_base + (chunk // 4) * group_tiles * 512 + (chunk % 4) * 4
                tl.store(col_scale_ptr + col_scale_lane_offsets + chunk_part, zeros)
