"""Validation of the Triton launchers' operands: one function per operand layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.mxfp8 import BLOCK_SIZE
from gmlp.quantized import MXFP8Tensor, QuantAxis

__all__ = ["rowwise_operand", "token_operand", "ExpertOperand", "expert_operand"]


def rowwise_operand(name: str, value, quantized: bool) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(data, scales, (rows, K)) of a bf16 matrix (a 3-D one is read as its stacked rows) or of a
    rowwise MXFP8Tensor with compact scales; the scales are the data when not quantized."""
    if quantized:
        if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.ROWWISE and not value.swizzled):
            raise TypeError(f"{name} must be a rowwise MXFP8Tensor with compact scales, got {value!r}")
        return value.data, value.scales, value.source_shape
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.is_contiguous()):
        raise TypeError(f"{name} must be a contiguous bf16 tensor, got {getattr(value, 'dtype', type(value))}")
    matrix = value.reshape(-1, value.shape[-1])
    return matrix, matrix, tuple(matrix.shape)


def token_operand(name: str, value, quantized: bool, tokens: int | None) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(data, scales, (T, features)) of a bf16 (T, features) matrix or of a columnwise MXFP8Tensor
    with compact scales (blocks along tokens); checks T when ``tokens`` is given."""
    if quantized:
        if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.COLUMNWISE and not value.swizzled):
            raise TypeError(f"{name} must be a columnwise MXFP8Tensor with compact scales, got {value!r}")
        shape, data, scales = value.source_shape, value.data, value.scales
    else:
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() == 2 and value.is_contiguous()):
            raise TypeError(f"{name} must be a contiguous bf16 (T, features) tensor, got {getattr(value, 'dtype', type(value))}")
        shape, data, scales = tuple(value.shape), value, value
    if tokens is not None and shape[0] != tokens:
        raise ValueError(f"{name} must have {tokens} token rows, got {shape}")
    return data, scales, shape


@dataclass(frozen=True)
class ExpertOperand:
    """The per-expert matrices B_g (N, K) of a grouped GEMM ``A @ B_g^T``, as the kernels address
    them: element (g, n, k) at ``data[g*strides[0] + n*strides[1] + k*strides[2]]`` and its scale
    (block k // 32) at ``scales[g*scale_strides[0] + n*scale_strides[1] + (k//32)*scale_strides[2]]``
    (the scales are the data when not quantized)."""

    data: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    strides: tuple[int, int, int]
    scale_strides: tuple[int, int, int]


def expert_operand(name: str, value, quantized: bool, experts: int) -> ExpertOperand:
    """Describe ``value`` as per-expert B_g (N, K) without copying it. Accepted:

    - bf16 (E, N, K), any strides: B_g = value[g] (so a transposed view of a weight works as is);
    - a rowwise MXFP8Tensor of an (E * N, K) matrix: B_g = rows g*N .. (g+1)*N;
    - a columnwise MXFP8Tensor of an (E * K, N) matrix S, K a multiple of 32 so that no block
      crosses experts: B_g = S_g^T, read from the transposed (N, E * K) data in place. This is
      Q_col of a weight, the operand of the backward GEMMs.
    All scales compact.
    """
    if quantized:
        if not isinstance(value, MXFP8Tensor) or value.swizzled:
            raise TypeError(f"{name} must be an MXFP8Tensor with compact scales, got {value!r}")
        rows, cols = value.source_shape
        if rows % experts:
            raise ValueError(f"{name} must stack {experts} experts' matrices, got a ({rows}, {cols}) source")
        if value.axis is QuantAxis.ROWWISE:
            n, k = rows // experts, cols
            return ExpertOperand(value.data, value.scales, n, k, (n * k, k, 1),
                                 (n * k // BLOCK_SIZE, k // BLOCK_SIZE, 1))
        k, n = rows // experts, cols
        if k % BLOCK_SIZE:
            raise ValueError(f"{name}: each expert's {k} rows must be a multiple of {BLOCK_SIZE} (blocks cross experts)")
        return ExpertOperand(value.data, value.scales, n, k, (k, rows, 1), (k // BLOCK_SIZE, value.scales.shape[1], 1))
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() == 3):
        raise TypeError(f"{name} must be a bf16 (E, N, K) tensor, got {getattr(value, 'dtype', type(value))} "
                        f"{tuple(getattr(value, 'shape', ()))}")
    if value.shape[0] != experts:
        raise ValueError(f"{name} must hold {experts} experts' matrices, got shape {tuple(value.shape)}")
    strides = tuple(value.stride())
    return ExpertOperand(value, value, value.shape[1], value.shape[2], strides, strides)
