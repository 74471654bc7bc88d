"""Triton launcher of the grouped FP8 blockwise weight gradient (128 x 1 blocks of both
operands, fp32 out or added to main_grad). Twin of
``gmlp.fp8_blockwise.gemm.grouped_wgrad_blockwise_ref``; no host sync."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.triton_ref._blockwise_gemm_kernel import wgrad_blockwise_kernel

__all__ = ["grouped_wgrad_fp8_blockwise"]


def grouped_wgrad_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                                out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32,
                                groups: DeviceGroups | None = None, block_m: int = 128, block_n: int = 128,
                                num_warps: int = 8) -> torch.Tensor:
    """(E, M, N): dW_g = A_g^T @ B_g over expert g's tokens, A (T, M) and B (T, N) given as their
    columnwise quantizations; stored as ``out_dtype``, or added to the fp32 ``out`` (main_grad)."""
    require_block_shape(a, "a", BlockShape.COLUMNWISE)
    require_block_shape(b, "b", BlockShape.COLUMNWISE)
    tokens, m = a.source_shape
    if b.source_shape[0] != tokens or b.data.shape[1] != a.data.shape[1] or a.data.stride() != b.data.stride():
        raise ValueError(f"a and b must have the same tokens, got {tokens} and {b.source_shape[0]} (data "
                         f"{tuple(a.data.shape)} and {tuple(b.data.shape)})")
    n, experts = b.source_shape[1], split_sizes.numel()
    if out is not None and (out.shape != (experts, m, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous fp32 ({experts}, {m}, {n}), got {out.dtype} {tuple(out.shape)}")
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    result = out if out is not None else torch.empty(experts, m, n, dtype=out_dtype, device=a.data.device)
    if result.numel():
        wgrad_blockwise_kernel[(scale_layout.ceil_div(n, block_n), scale_layout.ceil_div(m, block_m), experts)](
            a.data, a.scale_inv, b.data, b.scale_inv, groups.tile_start, result,
            a.data.stride(0), m, n, a.scale_inv.stride(0), b.scale_inv.stride(0),
            ACCUMULATE=out is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
        )
    return result

