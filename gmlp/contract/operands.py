"""Argument checks the launchers of every backend share (Triton, CuTeDSL): one function per bf16
operand layout, and ``describe`` for their messages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["describe", "rowwise_operand", "token_operand", "token_scalars", "ExpertOperand", "expert_operand"]


def describe(value) -> str:
    """dtype and shape of a tensor, else its type, for error messages."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}{'' if value.is_contiguous() else ' (not contiguous)'}"
    return type(value).__name__


def rowwise_operand(name: str, value) -> tuple[torch.Tensor, tuple[int, int]]:
    """(matrix, (rows, K)) of a contiguous bf16 matrix (a 3-D one is read as its stacked rows)."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() >= 2
            and value.is_contiguous()):
        raise TypeError(f"{name} must be a contiguous bf16 matrix (MXFP8 operands are dequantized first, "
                        f"gmlp.triton_ref.dequantize), got {describe(value)}")
    matrix = value.reshape(-1, value.shape[-1])
    return matrix, tuple(matrix.shape)


def token_operand(name: str, value, tokens: int | None) -> tuple[int, int]:
    """(T, features) of a contiguous bf16 (T, features) matrix; checks T when ``tokens`` is given."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() == 2
            and value.is_contiguous()):
        raise TypeError(f"{name} must be a contiguous bf16 (T, features) tensor, got {describe(value)}")
    if tokens is not None and value.shape[0] != tokens:
        raise ValueError(f"{name} must have {tokens} token rows, got {tuple(value.shape)}")
    return tuple(value.shape)


def token_scalars(name: str, value, tokens: int) -> None:
    """Check an optional per-token vector (probs): None, or a contiguous float (T,) tensor (the
    kernels read element r at offset r)."""
    if value is None:
        return
    if not (isinstance(value, torch.Tensor) and value.is_floating_point() and tuple(value.shape) == (tokens,)
            and value.is_contiguous()):
        raise ValueError(f"{name} must be a contiguous float ({tokens},) tensor, got {describe(value)}")


@dataclass(frozen=True)
class ExpertOperand:
    """The per-expert matrices B_g (N, K) of a grouped GEMM ``A @ B_g^T``, as the kernels address
    them: element (g, n, k) at ``data[g*strides[0] + n*strides[1] + k*strides[2]]``."""

    data: torch.Tensor
    n: int
    k: int
    strides: tuple[int, int, int]


def expert_operand(name: str, value, experts: int) -> ExpertOperand:
    """Describe a bf16 (E, N, K) tensor of any strides as per-expert B_g = value[g], without
    copying it (so a transposed view of a weight is read in place)."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() == 3):
        raise TypeError(f"{name} must be a bf16 (E, N, K) tensor, got {describe(value)}")
    if value.shape[0] != experts:
        raise ValueError(f"{name} must hold {experts} experts' matrices, got shape {tuple(value.shape)}")
    return ExpertOperand(value, value.shape[1], value.shape[2], tuple(value.stride()))
