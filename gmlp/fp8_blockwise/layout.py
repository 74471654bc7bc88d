"""Which values form each FP8 blockwise block, and where its fp32 ``scale_inv`` lives.

Token-side operands, an (T, K) source whose rows are grouped by expert (m_g rows for expert g):

- rowwise (1 x 128 blocks along K, for the forward and dgrad GEMMs): data (T, K) fp8; scales
  MN-major, (K/128, T) inside a (K/128, pad4(T)) buffer: ``scale_inv[kb, t]`` covers
  ``x[t, 128 kb : 128 kb + 128]``. The token dimension is the fast one so that a GEMM loads one
  k-block's scales for a tile of tokens as one contiguous run, and is padded to a multiple of 4
  so that every row starts 16-byte aligned (a TMA stride). The padding holds 1.0 and is never
  read.
- columnwise (128 x 1 blocks along the tokens, for the weight gradients): data transposed and
  block-aligned, (K, 128 n_blocks) fp8, K-major along the tokens; scales (K, n_blocks) inside
  (K, pad4(n_blocks)). Expert g's blocks start at its first token and never cross experts,
  ``ceil(m_g / 128)`` of them from block ``block_start[g] = sum_{h<g} ceil(m_h / 128)`` (the
  128-row tiles of ``gmlp.mxfp8.routing.DeviceGroups.tile_start``): its token i sits in data
  column ``128 block_start[g] + i``, so data block j is scale column j. A trailing partial
  block takes its amax over its tokens only and is padded with zeros, as are the blocks past
  the last expert's (scale 1.0). ``n_blocks = (T + 127 E) // 128`` bounds every split without a
  host sync. Why padded: a GEMM's 128-token k-tile is then one scale block and one 16-byte
  aligned TMA box (an fp8 box starting at an expert's first token faults when it is not a
  multiple of 16), and the padding's zeros add nothing to a weight gradient.

Weights, a stack (E, N, K) (or one (N, K) matrix), 128 x 128 tiles: data (E, N, K) fp8, scales
(E, N/128, K/128). The transposed weight (E, K, N) for the dgrad GEMM is the transposed data and
scales, bit for bit what quantizing the transposed values gives (a tile's amax does not depend on
its orientation).
"""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.mxfp8.scale_layout import ceil_div, max_row_tiles

__all__ = ["SCALE_ALIGN", "padded", "rowwise_scale_shape", "columnwise_blocks", "columnwise_data_shape",
           "columnwise_scale_shape", "columnwise_token_columns", "weight_scale_shape", "scale_buffer"]

SCALE_ALIGN = 4
"""fp32 scales a buffer row is padded to a multiple of (16 bytes)."""


def padded(n: int) -> int:
    """n rounded up to a multiple of ``SCALE_ALIGN``."""
    return ceil_div(n, SCALE_ALIGN) * SCALE_ALIGN


def rowwise_scale_shape(num_rows: int, num_cols: int) -> tuple[int, int]:
    """Shape of the rowwise scale buffer of a (T, K) source: (K/128, pad4(T))."""
    return num_cols // BLOCK, padded(num_rows)


def columnwise_blocks(num_rows: int, num_experts: int) -> int:
    """n_blocks: the 128-token blocks of any split of ``num_rows`` tokens into ``num_experts``."""
    return max_row_tiles(num_rows, num_experts)


def columnwise_data_shape(num_rows: int, num_cols: int, num_experts: int) -> tuple[int, int]:
    """Shape of the columnwise data of a (T, K) source: (K, 128 n_blocks), each expert's tokens
    from the start of its first block."""
    return num_cols, BLOCK * columnwise_blocks(num_rows, num_experts)


def columnwise_token_columns(sizes: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """(T,) int64: the data column of each token of experts with ``sizes`` tokens (host values)."""
    columns, block = [], 0
    for m in sizes:
        columns.append(torch.arange(m, device=device) + BLOCK * block)
        block += ceil_div(m, BLOCK)
    return torch.cat(columns) if columns else torch.zeros(0, dtype=torch.int64, device=device)


def columnwise_scale_shape(num_rows: int, num_cols: int, num_experts: int) -> tuple[int, int]:
    """Shape of the columnwise scale buffer of a (T, K) source: (K, pad4(n_blocks))."""
    return num_cols, padded(columnwise_blocks(num_rows, num_experts))


def weight_scale_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Scales of a weight (..., N, K): (..., N/128, K/128)."""
    *lead, rows, cols = shape
    return (*lead, rows // BLOCK, cols // BLOCK)


def scale_buffer(shape: tuple[int, int], used_cols: int, device: torch.device) -> torch.Tensor:
    """An fp32 scale buffer (rows, padded columns) for a kernel that writes its first ``used_cols``
    columns: the padding set to 1.0 here (one launch, only where there is padding), the rest left
    to the kernel."""
    buffer = torch.empty(shape, dtype=torch.float32, device=device)
    if shape[1] > used_cols:
        buffer[:, used_cols:] = 1.0
    return buffer
