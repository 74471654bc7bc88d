"""Triton launcher of the FP8 blockwise quantize of token operands (1 x 128 and/or 128 x 1,
grouped by expert, one pass). Twin of ``gmlp.fp8_blockwise.reference.quantize_fp8_blockwise_ref``,
bit for bit."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.buffers import both_ways_buffers, wrap_both_ways
from gmlp.fp8_blockwise.problem import validate_blockwise_args
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import FP8BlockwiseQuantized
from gmlp.mxfp8.routing import DeviceGroups, given_or_device_groups, launch_offsets
from gmlp.mxfp8.spec import ElementFormat
from gmlp.triton_ref._blockwise_quantize_kernel import quantize_fp8_blockwise_kernel
from gmlp.triton_ref.quantize import search_steps

__all__ = ["BlockwiseQuantizeConfig", "quantize_fp8_blockwise", "format_constants"]


@dataclass(frozen=True)
class BlockwiseQuantizeConfig:
    """Tiling of the token-operand kernel: a program walks one 128-row tile over 128-column blocks."""

    # 4 warps and 4 blocks: 0.44 / 0.35 / 0.34 of copy bandwidth at hidden 7168 / 4096 / 2048 on the
    # H100, the best of warps 4, 8 x blocks 1, 2, 4 (8 warps: 0.27-0.29, as the whole-block kernel)
    blocks_per_program: int = 4
    num_warps: int = 4

    def __post_init__(self) -> None:
        if self.blocks_per_program < 1 or self.num_warps < 1:
            raise ValueError(f"invalid blockwise quantize config: {self}; every field must be >= 1")


def format_constants(element_format: ElementFormat, dtype: torch.dtype, power_of_two: bool) -> dict:
    """The blockwise kernels' format constexprs: fp8 maximum, the source dtype's largest value
    (the scale of a block whose quotient overflows), power-of-two scales."""
    return dict(FMAX=element_format.max_normal, INPUT_MAX=torch.finfo(dtype).max, POWER_OF_TWO=power_of_two)


def quantize_fp8_blockwise(x: torch.Tensor, *, rowwise: bool = True, columnwise: bool = False,
                           split_sizes: torch.Tensor | None = None,
                           element_format: ElementFormat | str = ElementFormat.E4M3, power_of_two: bool = True,
                           groups: DeviceGroups | None = None,
                           config: BlockwiseQuantizeConfig = BlockwiseQuantizeConfig()) -> FP8BlockwiseQuantized:
    """Quantize x (T, K) in one pass; the contract of ``quantize_fp8_blockwise_ref``. Split sizes
    stay on the device (no host sync): invalid ones set every scale to NaN."""
    problem = validate_blockwise_args(x, rowwise=rowwise, columnwise=columnwise, split_sizes=split_sizes,
                                      element_format=element_format, power_of_two=power_of_two)
    element_format, rows, cols, device = problem.element_format, problem.num_rows, problem.num_cols, x.device
    groups = given_or_device_groups(split_sizes, rows, groups)
    row_start, tile_start, _ = launch_offsets(groups, device)
    num_tiles = layout.columnwise_blocks(rows, problem.num_experts)
    buffers = both_ways_buffers(rows, cols, problem.num_experts, element_format, device, rowwise=rowwise,
                                columnwise=columnwise)
    row_data, row_scales, col_data, col_scales = buffers
    if num_tiles > 0 and cols > 0:
        grid = (num_tiles, triton.cdiv(cols // BLOCK, config.blocks_per_program))
        placeholder = x  # the pointers of an orientation not written
        quantize_fp8_blockwise_kernel[grid](
            x, row_start, tile_start,
            row_data if rowwise else placeholder, row_scales if rowwise else placeholder,
            col_data if columnwise else placeholder, col_scales if columnwise else placeholder,
            rows, cols, row_scales.shape[1] if rowwise else 0, col_scales.shape[1] if columnwise else 0,
            col_data.shape[1] if columnwise else 0,
            **format_constants(element_format, x.dtype, power_of_two),
            ROWWISE=rowwise, COLUMNWISE=columnwise, GROUPED=split_sizes is not None,
            NUM_GROUPS=problem.num_experts, SEARCH_STEPS=search_steps(problem.num_experts),
            BLOCKS_PER_PROGRAM=config.blocks_per_program, num_warps=config.num_warps,
        )
    return wrap_both_ways(buffers, groups, element_format, power_of_two, split_sizes, rows)
