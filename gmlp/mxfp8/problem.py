"""Validation of ``quantize_mxfp8`` arguments: one validator for every backend and the dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.mxfp8.routing import should_check_split_values
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode, enum_member

__all__ = ["QuantizeProblem", "validate_quantize_args", "validate_split_sizes", "check_split_values",
           "SUPPORTED_INPUT_DTYPES"]

SUPPORTED_INPUT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True, kw_only=True)
class QuantizeProblem:
    """The validated, host-known description of one quantize call (no device values)."""

    num_rows: int  # M (T when grouped)
    num_cols: int  # K
    num_experts: int  # 1 when not grouped
    grouped: bool
    dtype: torch.dtype
    device: torch.device
    rowwise: bool
    columnwise: bool
    swizzle: bool
    element_format: ElementFormat
    scale_mode: ScaleMode
    row_stride: int  # elements from one row of x to the next: K, or more for a strided view


def validate_quantize_args(
    x: torch.Tensor,
    *,
    rowwise: bool,
    columnwise: bool,
    swizzle: bool,
    split_sizes: torch.Tensor | None,
    element_format: ElementFormat | str,
    scale_mode: ScaleMode | str,
    check_values: bool = True,
    strided_rows: bool = False,
) -> QuantizeProblem:
    """Check every argument and say which one is wrong, with what was expected and given.

    The values of ``split_sizes`` (negative sizes, sum != T) are checked here only where that
    needs no host sync (CPU tensors) or when asked (GMLP_VALIDATE=1); otherwise the kernels
    poison their output instead (see ``gmlp.mxfp8.routing``). ``check_values=False`` skips them (a
    tracer's tensors, which have shapes but no values). ``strided_rows``: the caller reads x
    through its row stride, so x may be any (M, K) view whose rows are contiguous (a weight's
    gate or up rows in W1's interleaved layout, ``gmlp.contract.gate_up``); else x must be contiguous.
    An empty x passes either layout check (its strides address nothing). ``element_format`` and
    ``scale_mode`` may be given as their values ("e5m2", "floor"); the problem holds the members.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_INPUT_DTYPES:
        raise TypeError(f"x must be bfloat16 or float32, got {x.dtype=}")
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, K), got {tuple(x.shape)=}")
    # torch calls every empty tensor contiguous, whatever its strides (an expanded empty gradient
    # has (0, 0)): both checks let it through by asking torch first
    if strided_rows:
        rows_apart = x.shape[1] > 1 and x.stride(1) != 1 or x.shape[0] > 1 and x.stride(0) < x.shape[1]
        if rows_apart and not x.is_contiguous():
            raise ValueError(f"x must have contiguous rows (strides (row stride >= K, 1)), got {x.stride()=} for "
                             f"{tuple(x.shape)=}")
    elif not x.is_contiguous():
        raise ValueError(f"x must be contiguous (row-major (M, K)), got {x.stride()=} for {tuple(x.shape)=}")
    rows, cols = x.shape
    if cols % BLOCK_SIZE != 0:
        raise ValueError(f"x's last dimension K must be a multiple of {BLOCK_SIZE}, got K={cols}")
    if not (rowwise or columnwise):
        raise ValueError(f"at least one of rowwise, columnwise must be True, got {rowwise=}, {columnwise=}")
    element_format = enum_member(ElementFormat, element_format, "element_format")
    scale_mode = enum_member(ScaleMode, scale_mode, "scale_mode")
    num_experts = 1
    if split_sizes is not None:
        num_experts = validate_split_sizes(split_sizes, x, check_values=check_values)
    return QuantizeProblem(
        num_rows=rows,
        num_cols=cols,
        num_experts=num_experts,
        grouped=split_sizes is not None,
        dtype=x.dtype,
        device=x.device,
        rowwise=rowwise,
        columnwise=columnwise,
        swizzle=swizzle,
        element_format=element_format,
        scale_mode=scale_mode,
        row_stride=x.stride(0) if rows > 1 and x.numel() else cols,
    )


def validate_split_sizes(split_sizes, x: torch.Tensor, *, check_values: bool = True) -> int:
    """Check a ``split_sizes`` argument against the rows of ``x`` and return E: an int32 or int64
    (E,) tensor on x's device, E >= 1; its values (see ``validate_quantize_args``) where that
    needs no host sync or when asked."""
    if not isinstance(split_sizes, torch.Tensor):
        raise TypeError(f"split_sizes must be an integer torch.Tensor of shape (E,), got {type(split_sizes).__name__}")
    if split_sizes.dim() != 1 or split_sizes.numel() == 0:
        raise ValueError(f"split_sizes must have shape (E,) with E >= 1, got {tuple(split_sizes.shape)=}")
    if split_sizes.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"split_sizes must be int32 or int64, got {split_sizes.dtype=}")
    if split_sizes.device != x.device:
        raise ValueError(f"split_sizes must be on x's device, got {split_sizes.device=} and {x.device=}")
    if check_values and should_check_split_values(split_sizes):
        check_split_values(split_sizes, x.shape[0])
    return split_sizes.numel()


def check_split_values(split_sizes: torch.Tensor, num_rows: int) -> None:
    """Check split sizes' values (syncs with the device): non-negative and summing to num_rows."""
    sizes = split_sizes.tolist()
    if any(m < 0 for m in sizes):
        raise ValueError(f"split_sizes must be non-negative, got {sizes}")
    if sum(sizes) != num_rows:
        raise ValueError(f"split_sizes must sum to x's row count {num_rows}, got sum={sum(sizes)} from {sizes}")
