"""Triton launcher: grouped GEMM ``A @ B_g^T (+ bias)`` per expert, bf16 out (FC2 fwd, FC1 dgrad)."""

from __future__ import annotations

import torch

from gmlp import scale_layout
from gmlp.groups import DeviceGroups, device_groups
from gmlp.triton_ref._grouped_gemm_kernel import grouped_gemm_kernel
from gmlp.triton_ref.operands import expert_operand, rowwise_operand
from gmlp.triton_ref.quantize import search_steps
from gmlp.triton_ref.tuning import GROUPED_GEMM_TILING, GemmTiling

__all__ = ["grouped_gemm"]


def grouped_gemm(
    a: torch.Tensor,  # (T, K) bf16, rows grouped by expert
    b: torch.Tensor,  # B_g (N, K) per expert: bf16 (E, N, K), any strides (operands.expert_operand)
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    bias: torch.Tensor | None = None,  # (E, N)
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: GemmTiling | None = None,
) -> torch.Tensor:
    """(T, N) bf16: each expert's rows of ``a`` times its ``b`` transposed; no host sync.
    Twin of ``gmlp.mlp_ref.grouped_gemm_ref``; MXFP8 operands are dequantized first
    (``gmlp.triton_ref.dequantize``)."""
    # validate
    a_data, (tokens, k) = rowwise_operand("a", a)
    experts = split_sizes.numel()
    b_op = expert_operand("b", b, experts)
    if b_op.k != k:
        raise ValueError(f"b must hold {experts} experts' (N, K={k}) matrices, got ({b_op.n}, {b_op.k}) each")
    tiling = tiling or GROUPED_GEMM_TILING
    n = b_op.n

    # canonicalize, allocate, launch
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a_data.device)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    if num_tiles > 0 and n > 0:
        grouped_gemm_kernel[tiling.grid(num_tiles, n)](
            a_data, b_op.data, bias if bias is not None else out,
            groups.row_start, groups.tile_start, out, tokens, n, k, *b_op.strides, HAS_BIAS=bias is not None,
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
            N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    return out
