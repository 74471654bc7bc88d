"""torchao's FP8 rowwise MoE grouped GEMMs as a side of ``bench mlp``: the Hopper FP8 training
path a user can install today (``torchao.prototype.moe_training``), on the same routed rows,
weights and router probabilities as the other sides.

The layer is the compiled-activation baseline's with both grouped GEMMs replaced by torchao's
``_to_fp8_rowwise_then_scaled_grouped_mm``: each operand quantized to E4M3 with one
power-of-two scale a row (tokens) or a column (weights), ``torch._scaled_grouped_mm`` forward
and backward, its weight gradients from per-expert column scales. torchao needs every expert's
rows a multiple of 16 (the bench's balanced routing of the design shapes has that; the skewed one
does not, and the side says so); its weights go in transposed, (E, K, N) column-major a group,
which is the (E, N, K) stacks' transposed view.
"""

from __future__ import annotations

import importlib

import torch

__all__ = ["SIDE", "GROUP_ALIGN", "unsupported_reason", "torchao_run"]

SIDE = "torchao-fp8-rowwise"
GROUP_ALIGN = 16  # torchao's scaled grouped GEMM: rows of every expert a multiple of 16


def unsupported_reason(split_sizes: torch.Tensor) -> str | None:
    """None if torchao's grouped GEMM takes this routing, else why not."""
    if bool((split_sizes % GROUP_ALIGN != 0).any()):
        return f"torchao's FP8 grouped GEMM needs every expert's rows a multiple of {GROUP_ALIGN}"
    return None


def torchao_run(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor, probs: torch.Tensor, offsets: torch.Tensor,
                activation):
    """``bench mlp``'s run of torchao's FP8 rowwise layer: w1 (E, 2F, H), w2 (E, H, F) bf16 (copied
    into new leaves), x (T, H), probs (T,) fp32, offsets the cumulative rows per expert (each
    expert's a multiple of ``GROUP_ALIGN``: ``unsupported_reason``), ``activation`` the compiled
    baseline's (h, probs) -> a."""
    grouped_mm = importlib.import_module("torchao.prototype.moe_training")._to_fp8_rowwise_then_scaled_grouped_mm
    w1, w2 = (w.detach().clone().requires_grad_() for w in (w1, w2))

    def forward() -> torch.Tensor:
        h = grouped_mm(x, w1.transpose(1, 2), offsets, pad_token_groups_for_grouped_mm=False)
        return grouped_mm(activation(h, probs), w2.transpose(1, 2), offsets, pad_token_groups_for_grouped_mm=False)

    return forward, [x, probs, w1, w2]
