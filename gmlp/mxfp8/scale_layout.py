"""Where every E8M0 scale byte lives: compact, swizzled and grouped layouts (single source).

Compact layouts (row-major uint8 matrices):

- rowwise scales of an (M, K) matrix: (M, K/32); scale (i, j) covers x[i, 32j:32j+32].
- columnwise scales: (K, n_blocks); scale (k, b) covers x[rows of block b, k]. Ungrouped,
  block b is rows 32b..32b+31. Grouped, each expert's blocks start at its first row and never
  cross experts: expert g owns block columns ``block_start[g] .. block_start[g] + ceil(m_g/32)``
  with ``block_start[g] = sum_{h<g} ceil(m_h/32)``; a trailing partial block takes its amax over
  its valid rows only. ``n_blocks = (T + 31*E) // 32`` is the bound that needs no host sync;
  columns past the last expert's blocks are 0x00.

Swizzled layout (cuBLAS / tcgen05 block-scaled MMA), of an (R, C) compact matrix, as a flat
uint8 vector, padded with 0x00 to (ceil(R/128)*128, ceil(C/4)*4)::

    index(i, j) = ((i // 128) * ceil(C/4) + j // 4) * 512
                  + (i % 32) * 16 + ((i % 128) // 32) * 4 + (j % 4)

i.e. the padded matrix viewed as (R/128, 4, 32, C/4, 4) and permuted to (R/128, C/4, 32, 4, 4):
each 128x4 tile is 512 contiguous bytes.

Grouped swizzled layouts (rows of T grouped by expert, m_g rows for expert g):

- rowwise: every expert's rows start a new 128-row tile; expert g's tiles begin at tile row
  ``tile_start[g] = sum_{h<g} ceil(m_h/128)``; ``n_tiles = (T + 127*E) // 128`` tile rows are
  allocated (no host sync), those past the last expert are 0x00.
- columnwise: expert g's (K, ceil(m_g/32)) scales are swizzled on their own, padded to
  (ceil(K/128)*128, 4*ceil(m_g/128)), and placed at byte ``ceil(K/128)*128 * 4 * tile_start[g]``.

Ungrouped layouts are the grouped ones with a single expert holding all rows.
"""

from __future__ import annotations

import torch

from gmlp.mxfp8.spec import BLOCK_SIZE

__all__ = [
    "SCALE_TILE_ROWS",
    "SCALE_TILE_COLS",
    "ceil_div",
    "swizzled_index",
    "swizzled_size",
    "max_row_tiles",
    "max_column_blocks",
    "swizzle",
    "unswizzle",
    "swizzle_rowwise_grouped",
    "unswizzle_rowwise_grouped",
    "swizzle_columnwise_grouped",
    "unswizzle_columnwise_grouped",
]

SCALE_TILE_ROWS = 128
"""Rows of one swizzled scale tile (= token rows of one tcgen05 MMA tile)."""
SCALE_TILE_COLS = 4
"""Scale columns of one swizzled tile (4 blocks = 128 elements of K)."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def swizzled_index(i: torch.Tensor | int, j: torch.Tensor | int, num_cols: int):
    """Flat offset of compact scale (i, j) in the swizzled layout of a matrix with num_cols columns."""
    col_tiles = ceil_div(num_cols, SCALE_TILE_COLS)
    return ((i // 128) * col_tiles + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + (j % 4)


def swizzled_size(num_rows: int, num_cols: int) -> int:
    """Bytes of the swizzled layout of an (num_rows, num_cols) scale matrix, padding included."""
    return ceil_div(num_rows, SCALE_TILE_ROWS) * SCALE_TILE_ROWS * ceil_div(num_cols, SCALE_TILE_COLS) * SCALE_TILE_COLS


def max_row_tiles(num_rows: int, num_experts: int) -> int:
    """Upper bound of sum_g ceil(m_g/128) over any split of num_rows into num_experts groups."""
    return (num_rows + (SCALE_TILE_ROWS - 1) * num_experts) // SCALE_TILE_ROWS


def max_column_blocks(num_rows: int, num_experts: int) -> int:
    """Upper bound of sum_g ceil(m_g/32) over any split of num_rows into num_experts groups."""
    return (num_rows + (BLOCK_SIZE - 1) * num_experts) // BLOCK_SIZE


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """Swizzle a compact (R, C) uint8 scale matrix into its flat padded layout."""
    rows, cols = scales.shape
    padded_rows = ceil_div(rows, SCALE_TILE_ROWS) * SCALE_TILE_ROWS
    padded_cols = ceil_div(cols, SCALE_TILE_COLS) * SCALE_TILE_COLS
    padded = scales.new_zeros(padded_rows, padded_cols)
    padded[:rows, :cols] = scales
    tiles = padded.view(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1)


def unswizzle(flat: torch.Tensor, num_rows: int, num_cols: int) -> torch.Tensor:
    """Inverse of ``swizzle``: the compact (num_rows, num_cols) matrix, padding dropped."""
    row_tiles = ceil_div(num_rows, SCALE_TILE_ROWS)
    col_tiles = ceil_div(num_cols, SCALE_TILE_COLS)
    tiles = flat[: row_tiles * col_tiles * 512].view(row_tiles, col_tiles, 32, 4, 4)
    padded = tiles.permute(0, 3, 2, 1, 4).reshape(row_tiles * 128, col_tiles * 4)
    return padded[:num_rows, :num_cols].contiguous()


def swizzle_rowwise_grouped(scales: torch.Tensor, split_sizes: torch.Tensor) -> torch.Tensor:
    """Swizzle compact rowwise scales (T, C) with per-expert 128-row tiles (reference; syncs)."""
    total_rows, cols = scales.shape
    sizes = [int(m) for m in split_sizes.tolist()]
    tile_bytes = SCALE_TILE_ROWS * ceil_div(cols, SCALE_TILE_COLS) * SCALE_TILE_COLS
    out = scales.new_zeros(max_row_tiles(total_rows, len(sizes)) * tile_bytes)
    row, tile = 0, 0
    for m in sizes:
        expert_tiles = ceil_div(m, SCALE_TILE_ROWS)
        out[tile * tile_bytes : (tile + expert_tiles) * tile_bytes] = swizzle(scales[row : row + m])
        row, tile = row + m, tile + expert_tiles
    return out


def unswizzle_rowwise_grouped(flat: torch.Tensor, split_sizes: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Inverse of ``swizzle_rowwise_grouped``: compact (T, num_cols) scales."""
    sizes = [int(m) for m in split_sizes.tolist()]
    tile_bytes = SCALE_TILE_ROWS * ceil_div(num_cols, SCALE_TILE_COLS) * SCALE_TILE_COLS
    parts, tile = [], 0
    for m in sizes:
        expert_tiles = ceil_div(m, SCALE_TILE_ROWS)
        parts.append(unswizzle(flat[tile * tile_bytes : (tile + expert_tiles) * tile_bytes], m, num_cols))
        tile += expert_tiles
    return torch.cat(parts) if parts else flat.new_zeros(0, num_cols)


def _column_segments(split_sizes: torch.Tensor):
    """(block_start, blocks, tile_start, tiles) of each expert's columnwise scale columns."""
    block, tile = 0, 0
    for m in (int(m) for m in split_sizes.tolist()):
        blocks, tiles = ceil_div(m, BLOCK_SIZE), ceil_div(m, SCALE_TILE_ROWS)
        yield block, blocks, tile, tiles
        block, tile = block + blocks, tile + tiles


def swizzle_columnwise_grouped(scales: torch.Tensor, split_sizes: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Swizzle compact grouped columnwise scales (K, n_blocks), each expert on its own (reference)."""
    k = scales.shape[0]
    expert_bytes_per_tile = ceil_div(k, SCALE_TILE_ROWS) * SCALE_TILE_ROWS * SCALE_TILE_COLS
    out = scales.new_zeros(max_row_tiles(num_tokens, split_sizes.numel()) * expert_bytes_per_tile)
    for block, blocks, tile, tiles in _column_segments(split_sizes):
        start = tile * expert_bytes_per_tile
        out[start : start + tiles * expert_bytes_per_tile] = swizzle(scales[:, block : block + blocks])
    return out


def unswizzle_columnwise_grouped(flat: torch.Tensor, split_sizes: torch.Tensor, k: int, num_tokens: int) -> torch.Tensor:
    """Inverse of ``swizzle_columnwise_grouped``: compact (K, n_blocks) scales, unused columns 0."""
    expert_bytes_per_tile = ceil_div(k, SCALE_TILE_ROWS) * SCALE_TILE_ROWS * SCALE_TILE_COLS
    out = flat.new_zeros(k, max_column_blocks(num_tokens, split_sizes.numel()))
    for block, blocks, tile, tiles in _column_segments(split_sizes):
        start = tile * expert_bytes_per_tile
        out[:, block : block + blocks] = unswizzle(flat[start : start + tiles * expert_bytes_per_tile], k, blocks)
    return out
