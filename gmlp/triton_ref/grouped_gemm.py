"""Triton launcher: grouped GEMM ``A @ B_g^T (+ bias)`` per expert, bf16 out (FC2 fwd, FC1 dgrad)."""

from __future__ import annotations

import torch
import triton

from gmlp import scale_layout
from gmlp.groups import device_groups
from gmlp.mxfp8 import BLOCK_SIZE
from gmlp.quantized import MXFP8Tensor
from gmlp.triton_ref._grouped_gemm_kernel import grouped_gemm_kernel
from gmlp.triton_ref.operands import rowwise_operand
from gmlp.triton_ref.quantize import search_steps

__all__ = ["grouped_gemm"]


def grouped_gemm(
    a: torch.Tensor | MXFP8Tensor,  # (T, K) rows grouped by expert
    b: torch.Tensor | MXFP8Tensor,  # (E, N, K) bf16, or Q_row of its (E * N, K) view
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    bias: torch.Tensor | None = None,  # (E, N)
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """(T, N) bf16: each expert's rows of ``a`` times its ``b`` transposed; no host sync.
    Twin of ``gmlp.mlp_ref.grouped_gemm_ref``."""
    # validate
    quantized = isinstance(a, MXFP8Tensor)
    a_data, a_scales, (tokens, k) = rowwise_operand("a", a, quantized)
    b_data, b_scales, (b_rows, b_k) = rowwise_operand("b", b, quantized)
    experts = split_sizes.numel()
    if b_k != k or b_rows % experts:
        raise ValueError(f"b must hold (E={experts}) x (N, K={k}) matrices, got a ({b_rows}, {b_k}) view")
    if k % BLOCK_SIZE or block_k % BLOCK_SIZE:
        raise ValueError(f"K and block_k must be multiples of {BLOCK_SIZE}, got {k=}, {block_k=}")
    n = b_rows // experts

    # canonicalize, allocate, launch
    groups = device_groups(split_sizes, tokens)
    out = torch.empty(tokens, n, dtype=torch.bfloat16, device=a_data.device)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    if num_tiles > 0 and n > 0:
        grouped_gemm_kernel[(num_tiles, triton.cdiv(n, block_n))](
            a_data, a_scales, b_data, b_scales, bias if bias is not None else out,
            groups.row_start, groups.tile_start, out, tokens, n, k,
            QUANTIZED=quantized, HAS_BIAS=bias is not None,
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=block_n, BLOCK_K=block_k,
        )
    return out
