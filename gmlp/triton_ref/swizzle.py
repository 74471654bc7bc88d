"""Triton launchers: swizzle and unswizzle the scales of an ``MXFP8Tensor`` (no host sync)."""

from __future__ import annotations

import dataclasses

import torch

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import device_groups, launch_offsets
from gmlp.mxfp8.spec import BLOCK_SIZE
from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis
from gmlp.triton_ref._swizzle_kernel import swizzle_scales_kernel
from gmlp.triton_ref.quantize import search_steps

__all__ = ["swizzle_scales", "unswizzle_scales"]


def _launch(tensor: MXFP8Tensor, compact: torch.Tensor, swizzled: torch.Tensor, unswizzle: bool) -> None:
    tokens, k = tensor.source_shape
    splits = tensor.split_sizes
    device = tensor.data.device
    groups = device_groups(splits, tokens) if splits is not None else None
    row_start, tile_start, block_start = launch_offsets(groups, device)
    experts = 1 if splits is None else splits.numel()
    columnwise = tensor.axis is QuantAxis.COLUMNWISE
    compact_rows, compact_cols = (k, scale_layout.max_column_blocks(tokens, experts)) if columnwise else (tokens, k // BLOCK_SIZE)
    other_tiles = scale_layout.ceil_div(k, 128) if columnwise else scale_layout.ceil_div(compact_cols, 4)
    grid = (scale_layout.max_row_tiles(tokens, experts), other_tiles)
    if grid[0] == 0 or grid[1] == 0:
        return
    swizzle_scales_kernel[grid](
        compact, swizzled, row_start, tile_start, block_start,
        tokens, compact_rows, compact_cols,
        COLUMNWISE=columnwise, UNSWIZZLE=unswizzle,
        GROUPED=splits is not None, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts),
        num_warps=1,
    )


def swizzle_scales(tensor: MXFP8Tensor) -> MXFP8Tensor:
    """The same quantized tensor with its compact scales rewritten in the swizzled layout."""
    if tensor.swizzled:
        raise ValueError(f"tensor's scales are already swizzled: {tensor!r}")
    tokens, k = tensor.source_shape
    experts = 1 if tensor.split_sizes is None else tensor.split_sizes.numel()
    tiles = scale_layout.max_row_tiles(tokens, experts)
    per_tile = scale_layout.swizzled_size(k, 4) if tensor.axis is QuantAxis.COLUMNWISE else scale_layout.swizzled_size(128, k // BLOCK_SIZE)
    swizzled = torch.empty(tiles * per_tile, dtype=torch.uint8, device=tensor.data.device)
    _launch(tensor, tensor.scales.contiguous(), swizzled, unswizzle=False)
    return dataclasses.replace(tensor, scales=swizzled, swizzled=True)


def unswizzle_scales(tensor: MXFP8Tensor) -> MXFP8Tensor:
    """The same quantized tensor with its swizzled scales rewritten as the compact matrix."""
    if not tensor.swizzled:
        raise ValueError(f"tensor's scales are already compact: {tensor!r}")
    tokens, k = tensor.source_shape
    experts = 1 if tensor.split_sizes is None else tensor.split_sizes.numel()
    device = tensor.data.device
    if tensor.axis is QuantAxis.COLUMNWISE:
        compact = torch.zeros(k, scale_layout.max_column_blocks(tokens, experts), dtype=torch.uint8, device=device)
    else:
        compact = torch.empty(tokens, k // BLOCK_SIZE, dtype=torch.uint8, device=device)
    _launch(tensor, compact, tensor.scales, unswizzle=True)
    return dataclasses.replace(tensor, scales=compact, swizzled=False)
