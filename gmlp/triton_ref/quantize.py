"""Triton launcher of the fused one-pass MXFP8 quantize (rowwise and/or columnwise, grouped)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from gmlp.contract.reasons import Reason
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.buffers import allocate_buffers
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.routing import DeviceGroups, given_or_device_groups, launch_offsets
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized
from gmlp.triton_ref._quantize_kernel import quantize_mxfp8_kernel

__all__ = ["quantize_mxfp8", "problem_support", "QuantizeConfig", "DEFAULT_QUANTIZE_CONFIG"]


@dataclass(frozen=True)
class QuantizeConfig:
    """Tiling of the quantize kernel: a program walks one 32-row slice over chunks of 32 columns."""

    chunks_per_program: int = 2  # 32-column chunks one program walks over (2: fastest on the H200)
    num_warps: int = 1  # one warp holds a 32x32 block: both reductions stay in the warp
    chunks_fastest: bool = False  # launch order: a slice's chunk groups in consecutive programs (else slices)

    def __post_init__(self) -> None:
        if self.chunks_per_program < 1 or self.num_warps < 1:
            raise ValueError(f"invalid quantize config: {self}; every field must be >= 1")


DEFAULT_QUANTIZE_CONFIG = QuantizeConfig()
# The layer's weight stacks (E * N, K) with compact scales: a program's rowwise scales are one byte
# per row, so with slices fastest the bytes of a row arrive from programs far apart and leave L2 as
# partial sectors. Chunks fastest merges them: W1 (131072, 7168) both ways 3.51 -> 1.86 ms on the
# H200 (bench_results/quantize-launch-order-h200-20261129.txt); activations measured no better.
WEIGHT_QUANTIZE_CONFIG = QuantizeConfig(chunks_per_program=4, chunks_fastest=True)


def problem_support(problem: QuantizeProblem) -> Reason | None:
    """None if this kernel runs ``problem``, else the reason it does not.

    The kernel covers every problem that ``validate_quantize_args`` accepts (both input dtypes,
    element formats, scale modes, layouts, any split sizes), so there is no shape reason today.
    """
    del problem
    return None


@functools.lru_cache(maxsize=None)
def _reciprocal_max(element_format: ElementFormat) -> float:
    """1 / the format's largest normal value, rounded to fp32 (as the kernel multiplies by it)."""
    return float(torch.tensor(1.0 / element_format.max_normal, dtype=torch.float32))


def search_steps(num_groups: int) -> int:
    """Binary-search steps that find a group among num_groups (ceil(log2(num_groups)))."""
    return (num_groups - 1).bit_length()


def quantize_mxfp8(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    swizzle: bool = True,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat = ElementFormat.E4M3,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
    config: QuantizeConfig = DEFAULT_QUANTIZE_CONFIG,
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
) -> MXFP8Quantized:
    """Quantize x (T, K) in one pass; same contract as ``gmlp.mxfp8.reference.quantize_mxfp8_ref``.

    Split sizes stay on the device: offsets are prefix sums computed there, and every buffer is
    sized from host-known bounds. x may be a view whose rows are contiguous but further apart
    than K (W1's gate or up rows in its interleaved layout, ``gmlp.contract.gate_up``): read in place.
    """
    # validate
    problem = validate_quantize_args(
        x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes,
        element_format=element_format, scale_mode=scale_mode, strided_rows=True,
    )
    element_format, scale_mode = problem.element_format, problem.scale_mode  # members, if given as strings
    rows, cols, row_stride = problem.num_rows, problem.num_cols, problem.row_stride
    experts = problem.num_experts
    device = x.device

    # canonicalize: device prefix sums of rows, 128-row tiles and 32-row blocks
    groups = given_or_device_groups(split_sizes, rows, groups)
    row_start, tile_start, block_start = launch_offsets(groups, device)
    num_tiles = scale_layout.max_row_tiles(rows, experts)
    num_col_blocks = scale_layout.max_column_blocks(rows, experts)
    out = allocate_buffers(problem)

    # launch
    if num_tiles > 0 and cols > 0:
        chunks = scale_layout.ceil_div(cols, 128) * 4 if swizzle else scale_layout.ceil_div(cols, 32)
        slices, chunk_groups = num_tiles * 4, triton.cdiv(chunks, config.chunks_per_program)
        grid = (chunk_groups, slices) if config.chunks_fastest else (slices, chunk_groups)
        placeholder = x  # unused pointer arguments of disabled outputs
        quantize_mxfp8_kernel[grid](
            x, row_start, tile_start, block_start,
            out.row_data if rowwise else placeholder, out.row_scales if rowwise else placeholder,
            out.col_data if columnwise else placeholder, out.col_scales if columnwise else placeholder,
            rows, cols, num_col_blocks, row_stride,
            RECIPROCAL_MAX=_reciprocal_max(element_format),
            EMAX=element_format.emax,
            FLOOR_MODE=scale_mode is ScaleMode.FLOOR,
            ROWWISE=rowwise, COLUMNWISE=columnwise, SWIZZLE=swizzle,
            GROUPED=split_sizes is not None, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts),
            STRIDED=row_stride != cols, CHUNKS_PER_PROGRAM=config.chunks_per_program, CHUNKS_FASTEST=config.chunks_fastest,
            num_warps=config.num_warps,
        )
    return out.result(problem, split_sizes, groups)

