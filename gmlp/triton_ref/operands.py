"""Validation of the Triton launchers' operands: one function per operand layout."""

from __future__ import annotations

import torch

from gmlp.quantized import MXFP8Tensor, QuantAxis

__all__ = ["rowwise_operand", "token_operand"]


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
