"""Triton launchers of the grouped FP8 blockwise GEMMs: forward / dgrad (1 x 128 tokens times
128 x 128 weight tiles, bf16 out) and the weight gradient (128 x 1 blocks of both operands,
fp32 out or added to main_grad). Twins of ``gmlp.fp8_blockwise.gemm``; no host sync."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, require_block_shape
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.triton_ref._blockwise_gemm_kernel import grouped_gemm_blockwise_kernel, wgrad_blockwise_kernel
from gmlp.triton_ref.quantize import search_steps

__all__ = ["grouped_gemm_fp8_blockwise", "grouped_wgrad_fp8_blockwise"]



def grouped_gemm_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                               groups: DeviceGroups | None = None, block_n: int = 128,
                               num_warps: int = 8) -> torch.Tensor:
    """(T, N) bf16: each expert's tokens of ``a`` (rowwise, (T, K)) times its tile-quantized
    weight ``b`` (E, N, K) transposed (the FC1 and FC2 forward; the dgrads with ``b`` the
    transposed weight, ``FP8BlockwiseTensor.transpose``)."""
    require_block_shape(a, "a", BlockShape.ROWWISE)
    require_block_shape(b, "b", BlockShape.TILE)
    tokens, k = a.source_shape
    experts = split_sizes.numel()
    if b.data.dim() != 3 or b.data.shape[0] != experts or b.data.shape[2] != k:
        raise ValueError(f"b must be (E={experts}, N, K={k}), got {tuple(b.data.shape)}")
    if BLOCK % block_n:
        raise ValueError(f"block_n must divide {BLOCK} (a tile's columns share one weight tile row), got {block_n}")
    if not (b.data.stride(2) == 1 and b.scale_inv.is_contiguous()):
        raise ValueError("b's data must be contiguous along K and its scales contiguous")
    n = b.data.shape[1]
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a.data.device)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    if num_tiles > 0 and n > 0:
        grouped_gemm_blockwise_kernel[(num_tiles, n // block_n)](
            a.data, a.scale_inv, b.data, b.scale_inv, groups.row_start, groups.tile_start, out,
            tokens, n, k, a.scale_inv.stride(0), b.data.stride(0), b.data.stride(1),
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=block_n, N_FASTEST=False,
            num_warps=num_warps,
        )
    return out


def grouped_wgrad_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                                out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32,
                                groups: DeviceGroups | None = None, block_m: int = 128, block_n: int = 128,
                                num_warps: int = 8) -> torch.Tensor:
    """(E, M, N): dW_g = A_g^T @ B_g over expert g's tokens, A (T, M) and B (T, N) given as their
    columnwise quantizations; stored as ``out_dtype``, or added to the fp32 ``out`` (main_grad)."""
    require_block_shape(a, "a", BlockShape.COLUMNWISE)
    require_block_shape(b, "b", BlockShape.COLUMNWISE)
    tokens, m = a.source_shape
    if b.source_shape[0] != tokens:
        raise ValueError(f"a and b must have the same tokens, got {tokens} and {b.source_shape[0]}")
    n, experts = b.source_shape[1], split_sizes.numel()
    if out is not None and (out.shape != (experts, m, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous fp32 ({experts}, {m}, {n}), got {out.dtype} {tuple(out.shape)}")
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    result = out if out is not None else torch.empty(experts, m, n, dtype=out_dtype, device=a.data.device)
    if result.numel():
        wgrad_blockwise_kernel[(scale_layout.ceil_div(n, block_n), scale_layout.ceil_div(m, block_m), experts)](
            a.data, a.scale_inv, b.data, b.scale_inv, groups.row_start, groups.tile_start, result,
            tokens, m, n, a.scale_inv.stride(0), b.scale_inv.stride(0),
            ACCUMULATE=out is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps,
        )
    return result

