"""The output buffers of a ``quantize_mxfp8`` call, allocated the same way for every kernel."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp import scale_layout
from gmlp.groups import poison_scales_if_invalid
from gmlp.mxfp8 import BLOCK_SIZE
from gmlp.mxfp8 import ElementFormat, ScaleMode
from gmlp.quantize_args import QuantizeProblem, validate_quantize_args
from gmlp.quantized import MXFP8Quantized, MXFP8Tensor, QuantAxis

__all__ = ["QuantizeBuffers", "allocate_buffers", "empty_quantize"]


@dataclass(frozen=True)
class QuantizeBuffers:
    """Data and scales of the requested axes (None for the other)."""

    row_data: torch.Tensor | None  # (T, K) fp8
    row_scales: torch.Tensor | None  # swizzled flat, or compact (T, K / 32)
    col_data: torch.Tensor | None  # (K, T) fp8
    col_scales: torch.Tensor | None  # swizzled flat, or compact (K, max column blocks)

    def result(self, problem: QuantizeProblem, split_sizes: torch.Tensor | None, groups=None) -> MXFP8Quantized:
        """The filled buffers as the call's result; scales poisoned if the split sizes were
        invalid (``groups``: their device prefix sums, ``gmlp.groups``)."""
        for scales in (self.row_scales, self.col_scales):
            if scales is not None:
                poison_scales_if_invalid(scales, groups)
        recipe = (problem.swizzle, problem.element_format, problem.scale_mode, split_sizes)
        row = None if self.row_data is None else MXFP8Tensor(self.row_data, self.row_scales, QuantAxis.ROWWISE, *recipe)
        col = None if self.col_data is None else MXFP8Tensor(self.col_data, self.col_scales, QuantAxis.COLUMNWISE, *recipe)
        return MXFP8Quantized(row, col)


def allocate_buffers(problem: QuantizeProblem) -> QuantizeBuffers:
    """Buffers sized from host-known bounds (any split of T rows into E groups). A kernel writes
    every byte of swizzled scales, padding included, so they start empty, or zeros (all padding)
    when there is nothing to launch (T == 0 or K == 0); compact columnwise scales start at zero,
    since a split leaves some trailing block columns unused."""
    rows, cols, experts = problem.num_rows, problem.num_cols, problem.num_experts
    fp8, device = problem.element_format.torch_dtype, problem.device
    scale_buffer = torch.empty if rows > 0 and cols > 0 else torch.zeros
    u8 = dict(dtype=torch.uint8, device=device)
    num_tiles = scale_layout.max_row_tiles(rows, experts)
    row_data = row_scales = col_data = col_scales = None
    if problem.rowwise:
        row_data = torch.empty(rows, cols, dtype=fp8, device=device)
        row_scales = (scale_buffer(num_tiles * scale_layout.swizzled_size(128, cols // BLOCK_SIZE), **u8)
                      if problem.swizzle else torch.empty(rows, cols // BLOCK_SIZE, **u8))
    if problem.columnwise:
        col_data = torch.empty(cols, rows, dtype=fp8, device=device)
        col_scales = (scale_buffer(num_tiles * scale_layout.swizzled_size(cols, 4), **u8)
                      if problem.swizzle else torch.zeros(cols, scale_layout.max_column_blocks(rows, experts), **u8))
    return QuantizeBuffers(row_data, row_scales, col_data, col_scales)


def empty_quantize(x: torch.Tensor, *, rowwise: bool = True, columnwise: bool = False, swizzle: bool = True,
                   split_sizes: torch.Tensor | None = None, element_format: ElementFormat = ElementFormat.E4M3,
                   scale_mode: ScaleMode = ScaleMode.RCEIL) -> MXFP8Quantized:
    """``quantize_mxfp8``'s result with its buffers allocated and not written: what every kernel
    returns, for a tracer's fake tensors or ``meta`` tensors (shapes, dtypes, strides only)."""
    problem = validate_quantize_args(x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle,
                                     split_sizes=split_sizes, element_format=element_format, scale_mode=scale_mode,
                                     check_values=False)
    return allocate_buffers(problem).result(problem, split_sizes)
