"""Triton launcher: grouped GEMM ``A @ B_g^T (+ bias)`` per expert, bf16 out (FC2 fwd, FC1 dgrad)."""

from __future__ import annotations

import torch

from gmlp.contract.operands import expert_operand, rowwise_operand
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.triton_ref._grouped_gemm_kernel import grouped_gemm_kernel
from gmlp.triton_ref.quantize import search_steps
from gmlp.triton_ref.tuning import GROUPED_GEMM_TILING, GemmTiling

__all__ = ["grouped_gemm"]


def grouped_gemm(
    a: torch.Tensor,  # (T, K) bf16, rows grouped by expert
    b: torch.Tensor | tuple[torch.Tensor, torch.Tensor],  # B_g (N, K) per expert: bf16 (E, N, K), any strides
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    bias: torch.Tensor | None = None,  # (E, N)
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: GemmTiling | None = None,
) -> torch.Tensor:
    """(T, N) bf16: each expert's rows of ``a`` times its ``b`` transposed; no host sync.
    Twin of ``gmlp.contract.reference.grouped_gemm_ref``; MXFP8 operands are dequantized first
    (``gmlp.triton_ref.dequantize``). ``b`` may be a pair (B, B2) of (E, N, K1) and (E, N, K - K1)
    operands, B_g = [B_g | B2_g] along K (W1^T with its gate and up stored apart), read in place."""
    # validate
    a_data, (tokens, k) = rowwise_operand("a", a)
    experts = split_sizes.numel()
    split = isinstance(b, tuple)
    b_op, b2_op = (expert_operand(name, value, experts) for name, value in zip(("b", "b[1]"), b if split else (b, b)))
    k1 = b_op.k  # B's columns: all of K unless B2 holds the rest
    if b_op.n != b2_op.n or k1 + (b2_op.k if split else 0) != k:
        shapes = f"({b_op.n}, {b_op.k}) and ({b2_op.n}, {b2_op.k})" if split else f"({b_op.n}, {b_op.k})"
        raise ValueError(f"b must hold {experts} experts' (N, K={k}) matrices{' side by side along K' if split else ''}, "
                         f"got {shapes} each")
    tiling = tiling or GROUPED_GEMM_TILING
    n = b_op.n

    # canonicalize, allocate, launch
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a_data.device)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    if num_tiles > 0 and n > 0:
        grouped_gemm_kernel[tiling.grid(num_tiles, n)](
            a_data, b_op.data, b2_op.data, bias if bias is not None else out,
            groups.row_start, groups.tile_start, out, tokens, n, k, k1, *b_op.strides, *b2_op.strides,
            HAS_BIAS=bias is not None, SPLIT_K=split,
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
            N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    return out
