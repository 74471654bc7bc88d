"""Triton launcher: an ``MXFP8Tensor`` (compact scales) back to bf16 values, no host sync."""

from __future__ import annotations

import torch
import triton

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups, launch_offsets
from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis
from gmlp.triton_ref._dequantize_kernel import dequantize_columnwise_kernel, dequantize_rowwise_kernel
from gmlp.triton_ref.quantize import search_steps

__all__ = ["dequantize_mxfp8"]

_ROWWISE_TILE = (32, 128)  # rows x columns per program
_COLUMNWISE_BLOCK_K = 64  # columns per program, by one 128-row expert tile


def dequantize_mxfp8(tensor: MXFP8Tensor, groups: DeviceGroups | None = None) -> torch.Tensor:
    """bf16 (M, K) values of ``tensor`` in its source's orientation (a columnwise quantization is
    transposed back): ``tensor.dequantize().to(torch.bfloat16)``, bit for bit. ``groups``:
    ``device_groups`` of the tensor's split sizes, when the caller already has it."""
    if not isinstance(tensor, MXFP8Tensor) or tensor.swizzled:
        raise TypeError(f"tensor must be an MXFP8Tensor with compact scales, got {tensor!r}")
    rows, cols = tensor.source_shape
    out = torch.empty(rows, cols, dtype=torch.bfloat16, device=tensor.data.device)
    if rows == 0 or cols == 0:
        return out
    if tensor.axis is QuantAxis.ROWWISE:
        block_m, block_k = _ROWWISE_TILE
        dequantize_rowwise_kernel[(triton.cdiv(rows, block_m), triton.cdiv(cols, block_k))](
            tensor.data, tensor.scales, out, rows, cols, BLOCK_M=block_m, BLOCK_K=block_k)
        return out
    splits = tensor.split_sizes
    experts = 1 if splits is None else splits.numel()
    if splits is None:
        groups = None  # ungrouped: 32-row blocks over the whole tensor
    elif groups is None:
        groups = device_groups(splits, rows)
    row_start, tile_start, block_start = launch_offsets(groups, out.device)
    grid = (scale_layout.max_row_tiles(rows, experts), triton.cdiv(cols, _COLUMNWISE_BLOCK_K))
    dequantize_columnwise_kernel[grid](
        tensor.data, tensor.scales, row_start, tile_start, block_start, out,
        rows, cols, tensor.scales.shape[1],
        GROUPED=splits is not None, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts),
        BLOCK_K=_COLUMNWISE_BLOCK_K)
    return out
