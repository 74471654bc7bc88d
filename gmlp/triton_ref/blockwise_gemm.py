"""Triton launcher of the grouped FP8 blockwise GEMM of the forward and dgrad (1 x 128 tokens
times 128 x 128 weight tiles, bf16 out). Twin of ``gmlp.fp8_blockwise.gemm.grouped_gemm_blockwise_ref``;
no host sync."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.triton_ref._blockwise_gemm_kernel import grouped_gemm_blockwise_kernel
from gmlp.triton_ref.quantize import search_steps

__all__ = ["grouped_gemm_fp8_blockwise"]



def grouped_gemm_fp8_blockwise(a: FP8BlockwiseTensor, b: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                               bias: torch.Tensor | None = None, groups: DeviceGroups | None = None, block_n: int = 128,
                               num_warps: int = 8) -> torch.Tensor:
    """(T, N) bf16: each expert's tokens of ``a`` (rowwise, (T, K)) times its tile-quantized
    weight ``b`` (E, N, K) transposed, plus ``bias`` (E, N) (the FC2 forward; the FC1 dgrad with
    ``b`` the transposed weight, ``FP8BlockwiseTensor.transpose``)."""
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
    if bias is not None and tuple(bias.shape) != (experts, n):
        raise ValueError(f"bias must be (E={experts}, N={n}), got {tuple(bias.shape)}")
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a.data.device)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    if num_tiles > 0 and n > 0:
        grouped_gemm_blockwise_kernel[(num_tiles, n // block_n)](
            a.data, a.scale_inv, b.data, b.scale_inv, bias if bias is not None else out, groups.row_start,
            groups.tile_start, out, tokens, n, k, a.scale_inv.stride(0), b.data.stride(0), b.data.stride(1),
            HAS_BIAS=bias is not None, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=block_n, N_FASTEST=False,
            num_warps=num_warps,
        )
    return out
