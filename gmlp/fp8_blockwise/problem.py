"""Validation of the FP8 blockwise quantize arguments: one validator for every backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.fp8_blockwise.spec import BLOCK, SUPPORTED_INPUT_DTYPES
from gmlp.mxfp8.problem import validate_split_sizes
from gmlp.mxfp8.spec import ElementFormat, enum_member

__all__ = ["BlockwiseQuantizeProblem", "validate_blockwise_args", "validate_weight_args"]


@dataclass(frozen=True, kw_only=True)
class BlockwiseQuantizeProblem:
    """The validated, host-known description of one token-operand quantize call."""

    num_rows: int  # T
    num_cols: int  # K
    num_experts: int  # 1 when not grouped
    grouped: bool
    dtype: torch.dtype
    device: torch.device
    rowwise: bool
    columnwise: bool
    element_format: ElementFormat
    power_of_two: bool


def _check_source(value, name: str, dims: str) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"{name} must be bfloat16 or float32, got {value.dtype}")
    if not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous ({dims} row-major), got strides {value.stride()} for "
                         f"shape {tuple(value.shape)}")


def _check_flags(element_format, power_of_two) -> ElementFormat:
    if not isinstance(power_of_two, bool):
        raise TypeError(f"power_of_two must be a bool, got {power_of_two!r}")
    return enum_member(ElementFormat, element_format, "element_format")


def validate_blockwise_args(x: torch.Tensor, *, rowwise: bool, columnwise: bool, split_sizes: torch.Tensor | None,
                            element_format: ElementFormat | str, power_of_two: bool,
                            check_values: bool = True) -> BlockwiseQuantizeProblem:
    """Check every argument of a token-operand quantize (x (T, K), K a multiple of 128) and say
    which one is wrong; ``split_sizes`` as ``gmlp.mxfp8.problem.validate_split_sizes`` checks it."""
    _check_source(x, "x", "(T, K)")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (T, K), got shape {tuple(x.shape)}")
    rows, cols = x.shape
    if cols % BLOCK:
        raise ValueError(f"x's last dimension K must be a multiple of {BLOCK} (1 x {BLOCK} blocks), got K={cols}")
    if not (rowwise or columnwise):
        raise ValueError(f"at least one of rowwise, columnwise must be True, got {rowwise=}, {columnwise=}")
    element_format = _check_flags(element_format, power_of_two)
    num_experts = 1 if split_sizes is None else validate_split_sizes(split_sizes, x, check_values=check_values)
    return BlockwiseQuantizeProblem(num_rows=rows, num_cols=cols, num_experts=num_experts,
                                    grouped=split_sizes is not None, dtype=x.dtype, device=x.device, rowwise=rowwise,
                                    columnwise=columnwise, element_format=element_format, power_of_two=power_of_two)


def validate_weight_args(w: torch.Tensor, *, element_format: ElementFormat | str, power_of_two: bool,
                         transposed: bool = False, both_orientations: bool = False) -> ElementFormat:
    """Check a weight quantize's arguments (w (N, K) or a stack (E, N, K), N and K multiples of
    128; which orientations it writes: W's tiles, W^T's (``transposed``) or both
    (``both_orientations``)) and return the element format as a member."""
    _check_source(w, "w", "(E, N, K)")
    if w.dim() not in (2, 3):
        raise ValueError(f"w must be (N, K) or a stack (E, N, K), got shape {tuple(w.shape)}")
    if w.shape[-2] % BLOCK or w.shape[-1] % BLOCK:
        raise ValueError(f"w's last two dimensions (N, K) must be multiples of {BLOCK} ({BLOCK} x {BLOCK} tiles), "
                         f"got {tuple(w.shape[-2:])}")
    for name, value in (("transposed", transposed), ("both_orientations", both_orientations)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if transposed and both_orientations:
        raise ValueError("transposed and both_orientations exclude each other (both_orientations returns W^T's tiles "
                         "beside W's), got transposed=True, both_orientations=True")
    return _check_flags(element_format, power_of_two)
