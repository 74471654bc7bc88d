"""Triton launcher: per-expert column sums (bias gradients), deterministic, no host sync."""

from __future__ import annotations

import torch
import triton

from gmlp.triton_ref._segment_sum_kernel import segment_sum_kernel

__all__ = ["segment_sum"]


def segment_sum(values: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """(G, N) fp32: sums of the rows [starts[g], starts[g+1]) of values (R, N), for each group g."""
    if values.dim() != 2 or not values.is_contiguous():
        raise ValueError(f"values must be a contiguous (R, N) matrix, got {tuple(values.shape)} with {values.stride()=}")
    groups, n = starts.numel() - 1, values.shape[1]
    out = torch.empty(groups, n, dtype=torch.float32, device=values.device)
    if groups > 0 and n > 0:
        segment_sum_kernel[(groups, triton.cdiv(n, 64))](values, starts, out, n, BLOCK_R=32, BLOCK_N=64)
    return out
