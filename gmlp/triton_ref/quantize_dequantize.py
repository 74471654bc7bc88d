"""Triton launcher: the bf16 values of x's MXFP8 quantization (rowwise and/or columnwise, grouped)
in one pass over x, no fp8 tensor written, no host sync."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.routing import DeviceGroups, given_or_device_groups, launch_offsets
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Values
from gmlp.triton_ref._quantize_dequantize_kernel import quantize_dequantize_kernel
from gmlp.triton_ref.quantize import _reciprocal_max, search_steps

__all__ = ["quantize_dequantize_mxfp8", "problem_support", "QuantizeDequantizeConfig", "ROWWISE_CONFIG",
           "COLUMNWISE_CONFIG"]

_MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension (128-row tiles here)


@dataclass(frozen=True)
class QuantizeDequantizeConfig:
    """Tiling: a program takes ``rows`` rows (128: a whole expert-aligned tile, or 32) by ``block_k`` columns."""

    block_k: int = 64  # columns per program, a power of two >= 32
    num_warps: int = 4
    rows: int = 128

    def __post_init__(self) -> None:
        if self.block_k < 32 or self.block_k & (self.block_k - 1) or self.num_warps < 1 or self.rows not in (32, 128):
            raise ValueError(f"invalid quantize-dequantize config: {self}; block_k must be a power of two >= 32, "
                             "rows 32 or 128")


# Timed on the H200 (bench_results/qdq-sweep-h200-20261204T174500.json; a device copy of the same
# tensor in the same run: W1 (131072, 7168) 0.885 ms, dy (32768, 7168, 32 experts) 0.224 ms):
# rowwise alone, whole 128-row tiles by 64 columns, 4 warps (0.914, 0.236 ms); columnwise, 32 rows
# by 128 columns in one warp, which reduces each block's column within its threads (0.889, 0.229
# ms; the 128-row tile takes 1.31 ms on W1, its reduction crossing warps).
ROWWISE_CONFIG = QuantizeDequantizeConfig(block_k=64, num_warps=4, rows=128)
COLUMNWISE_CONFIG = QuantizeDequantizeConfig(block_k=128, num_warps=1, rows=32)


def problem_support(problem: QuantizeProblem) -> Reason | None:
    """None if this kernel runs ``problem`` (any validated one whose 128-row tiles fit the grid)."""
    tiles = scale_layout.max_row_tiles(problem.num_rows, problem.num_experts) * 4  # at most 4 programs a tile
    if tiles > _MAX_GRID_Y:
        return Reason(ReasonKind.SHAPE, f"{tiles} slices of 32 rows (T={problem.num_rows}, E={problem.num_experts}) "
                                        f"exceed the Triton quantize-dequantize's grid limit of {_MAX_GRID_Y}")
    return None


def quantize_dequantize_mxfp8(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat = ElementFormat.E4M3,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
    config: QuantizeDequantizeConfig | None = None,  # None: the timed one for the orientations asked
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
) -> MXFP8Values:
    """bf16 (M, K) values of x's rowwise and/or columnwise MXFP8 quantization, as
    ``gmlp.mxfp8.reference.quantize_dequantize_mxfp8_ref`` gives them, bit for bit. Arguments as
    ``quantize_mxfp8``'s (scales are not written, so there is no layout to choose). x may be a
    view whose rows are contiguous but further apart than K (W1's gate or up rows). Invalid split
    sizes (unless ``groups`` were checked) make every value NaN, as they poison the quantize's
    scales."""
    problem = validate_quantize_args(x, rowwise=rowwise, columnwise=columnwise, swizzle=False, split_sizes=split_sizes,
                                     element_format=element_format, scale_mode=scale_mode, strided_rows=True)
    reason = problem_support(problem)
    if reason is not None:
        raise ValueError(f"the Triton quantize-dequantize cannot run this problem: {reason}")
    rows, cols, experts = problem.num_rows, problem.num_cols, problem.num_experts
    config = config or (COLUMNWISE_CONFIG if columnwise else ROWWISE_CONFIG)
    groups = given_or_device_groups(split_sizes, rows, groups)
    row_start, tile_start, _ = launch_offsets(groups, x.device)
    row_out = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if rowwise else None
    col_out = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if columnwise else None
    if rows > 0 and cols > 0:
        grid = (triton.cdiv(cols, config.block_k), scale_layout.max_row_tiles(rows, experts) * (128 // config.rows))
        placeholder = row_out if rowwise else col_out  # the pointer of an orientation not written
        quantize_dequantize_kernel[grid](
            x, row_start, tile_start, row_out if rowwise else placeholder, col_out if columnwise else placeholder,
            rows, cols, problem.row_stride,
            RECIPROCAL_MAX=_reciprocal_max(problem.element_format), EMAX=problem.element_format.emax,
            FLOOR_MODE=problem.scale_mode is ScaleMode.FLOOR, E5M2=problem.element_format is ElementFormat.E5M2,
            ROWWISE=rowwise, COLUMNWISE=columnwise,
            GROUPED=split_sizes is not None, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts),
            ROWS=config.rows, BLOCK_K=config.block_k, num_warps=config.num_warps,
        )
    if groups is not None and not groups.checked:  # invalid sizes: every value NaN (no host sync)
        for values in (row_out, col_out):
            if values is not None:
                values.masked_fill_(groups.valid.logical_not(), float("nan"))
    return MXFP8Values(row_out, col_out)
