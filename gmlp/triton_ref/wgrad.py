"""Triton launcher: grouped weight gradients ``dW_g = A_g^T @ B_g`` over each expert's tokens."""

from __future__ import annotations

import torch

from gmlp.contract.operands import token_operand
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.triton_ref._wgrad_kernel import wgrad_kernel
from gmlp.triton_ref.tuning import WGRAD_TILING, WgradTiling

__all__ = ["grouped_wgrad"]


def grouped_wgrad(
    a: torch.Tensor,  # (T, M) bf16: dy (FC2) or dh (FC1)
    b: torch.Tensor,  # (T, N) bf16: a (FC2) or x (FC1)
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,  # fp32 to accumulate into (main_grad)
    out_dtype: torch.dtype = torch.float32,  # of a new result: fp32, or bf16 (the fp32 sums rounded once)
    split_rows: int | None = None,  # return rows [0, split_rows) and the rest of each dW_g apart
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: WgradTiling | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(E, M, N) weight gradients, fp32 sums stored as ``out_dtype``; added to ``out`` (fp32) when
    given. No host sync. Twin of ``gmlp.contract.reference.grouped_wgrad_ref``; MXFP8 operands (Q_col) are
    dequantized first (``gmlp.triton_ref.dequantize``). With ``split_rows`` (``out`` then a pair),
    each dW_g's first ``split_rows`` rows and the rest are two (E, ., N) tensors (dW1's gate and up,
    the gradients of two weights: ``gmlp.contract.gate_up``), written by the same tiles."""
    # validate
    tokens, m = token_operand("a", a, None)
    _, n = token_operand("b", b, tokens)
    experts = split_sizes.numel()
    if isinstance(out, tuple) != (split_rows is not None) and out is not None:
        raise ValueError("out must be a pair of tensors exactly when split_rows is given, got "
                         f"{'a pair' if isinstance(out, tuple) else 'one tensor'} and split_rows={split_rows}")
    if split_rows is not None and not 0 <= split_rows <= m:
        raise ValueError(f"split_rows must be in [0, {m}] (the rows of each dW_g), got {split_rows}")
    shapes = [(experts, m, n)] if split_rows is None else [(experts, split_rows, n), (experts, m - split_rows, n)]
    if out is not None:
        targets = list(out) if isinstance(out, tuple) else [out]
        if len(targets) != len(shapes) or any(tuple(t.shape) != shape or t.dtype != torch.float32 or not t.is_contiguous()
                                               for t, shape in zip(targets, shapes)):
            want = " and ".join(f"({e}, {r}, {c})" for e, r, c in shapes)
            got = ", ".join(f"{t.dtype} {tuple(t.shape)}" for t in targets)
            raise ValueError(f"out must be contiguous fp32 {want} tensor{'s' if len(shapes) > 1 else ''}, got {got}")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}")
    tiling = tiling or WGRAD_TILING

    # canonicalize, allocate, launch
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    accumulate = out is not None
    outputs = targets if accumulate else [torch.empty(shape, dtype=out_dtype, device=a.device) for shape in shapes]
    if m > 0 and n > 0:
        wgrad_kernel[tiling.grid(experts, m, n)](
            a, b, groups.row_start, outputs[0], outputs[-1], m, n, m if split_rows is None else split_rows,
            ACCUMULATE=accumulate, SPLIT_M=split_rows is not None,
            BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, BLOCK_T=tiling.block_t, N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    return outputs[0] if split_rows is None else tuple(outputs)
