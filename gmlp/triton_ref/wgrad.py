"""Triton launcher: grouped weight gradients ``dW_g = A_g^T @ B_g`` over each expert's tokens."""

from __future__ import annotations

import torch

from gmlp.groups import DeviceGroups, device_groups
from gmlp.triton_ref._wgrad_kernel import wgrad_kernel
from gmlp.triton_ref.operands import token_operand
from gmlp.triton_ref.tuning import WGRAD_TILING, WgradTiling

__all__ = ["grouped_wgrad"]


def grouped_wgrad(
    a: torch.Tensor,  # (T, M) bf16: dy (FC2) or dh (FC1)
    b: torch.Tensor,  # (T, N) bf16: a (FC2) or x (FC1)
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    out: torch.Tensor | None = None,  # (E, M, N) fp32 to accumulate into (main_grad)
    out_dtype: torch.dtype = torch.float32,  # of a new result: fp32, or bf16 (the fp32 sums rounded once)
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: WgradTiling | None = None,
) -> torch.Tensor:
    """(E, M, N) weight gradients, fp32 sums stored as ``out_dtype``; added to ``out`` (fp32) when
    given. No host sync. Twin of ``gmlp.mlp_ref.grouped_wgrad_ref``; MXFP8 operands (Q_col) are
    dequantized first (``gmlp.triton_ref.dequantize``)."""
    # validate
    tokens, m = token_operand("a", a, None)
    _, n = token_operand("b", b, tokens)
    experts = split_sizes.numel()
    if out is not None and (tuple(out.shape) != (experts, m, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous fp32 ({experts}, {m}, {n}) tensor, got {out.dtype} {tuple(out.shape)}")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    tiling = tiling or WGRAD_TILING

    # canonicalize, allocate, launch
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    accumulate = out is not None
    if out is None:
        out = torch.empty(experts, m, n, dtype=out_dtype, device=a.device)
    if m > 0 and n > 0:
        wgrad_kernel[tiling.grid(experts, m, n)](
            a, b, groups.row_start, out, m, n, ACCUMULATE=accumulate,
            BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, BLOCK_T=tiling.block_t, N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    return out
