"""The output buffers of a ``quantize_mxfp8`` call, allocated the same way for every kernel."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.routing import poison_scales_if_invalid
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, QuantAxis

__all__ = ["QuantizeBuffers", "allocate_buffers", "compact_buffers", "empty_quantize"]


@dataclass(frozen=True)
class QuantizeBuffers:
    """Data and scales of the requested axes (None for the other)."""

    row_data: torch.Tensor | None  # (T, K) fp8
    row_scales: torch.Tensor | None  # swizzled flat, or compact (T, K / 32)
    col_data: torch.Tensor | None  # (K, T) fp8
    col_scales: torch.Tensor | None  # swizzled flat, or compact (K, max column blocks)

    def result(self, problem: QuantizeProblem, split_sizes: torch.Tensor | None, groups=None) -> MXFP8Quantized:
        """The filled buffers as the call's result; scales poisoned if the split sizes were
        invalid (``groups``: their device prefix sums, ``gmlp.mxfp8.routing``)."""
        for scales in (self.row_scales, self.col_scales):
            if scales is not None:
                poison_scales_if_invalid(scales, groups)
        return MXFP8Quantized(*self.tensors(problem.swizzle, problem.element_format, problem.scale_mode, split_sizes))

    def tensors(self, swizzled: bool, element_format: ElementFormat, scale_mode: ScaleMode,
                split_sizes: torch.Tensor | None) -> tuple[MXFP8Tensor | None, MXFP8Tensor | None]:
        """(rowwise, columnwise) ``MXFP8Tensor`` views of the filled buffers (None for an axis not
        allocated), as written by a kernel with this recipe."""
        recipe = (swizzled, element_format, scale_mode, split_sizes)
        row = None if self.row_data is None else MXFP8Tensor(self.row_data, self.row_scales, QuantAxis.ROWWISE, *recipe)
        col = None if self.col_data is None else MXFP8Tensor(self.col_data, self.col_scales, QuantAxis.COLUMNWISE, *recipe)
        return row, col


def compact_buffers(rows: int, cols: int, experts: int, element_format: ElementFormat, device: torch.device, *,
                    rowwise: bool = True, columnwise: bool = True) -> QuantizeBuffers:
    """Data and compact scales of the requested axes for (rows, cols) values in ``experts`` groups,
    sized from host-known bounds: rowwise (T, K) + (T, K / 32), columnwise (K, T) + (K, max
    column blocks), the latter zero-filled (a split leaves trailing block columns unused). Also
    the outputs of the GEMM epilogues that quantize both ways (FC1's a, FC2 dgrad's dh)."""
    fp8, u8 = element_format.torch_dtype, dict(dtype=torch.uint8, device=device)
    row_data = row_scales = col_data = col_scales = None
    if rowwise:
        row_data = torch.empty(rows, cols, dtype=fp8, device=device)
        row_scales = torch.empty(rows, cols // BLOCK_SIZE, **u8)
    if columnwise:
        col_data = torch.empty(cols, rows, dtype=fp8, device=device)
        col_scales = torch.zeros(cols, scale_layout.max_column_blocks(rows, experts), **u8)
    return QuantizeBuffers(row_data, row_scales, col_data, col_scales)


def allocate_buffers(problem: QuantizeProblem) -> QuantizeBuffers:
    """Buffers sized from host-known bounds (any split of T rows into E groups): compact ones as
    ``compact_buffers``; a kernel writes every byte of swizzled scales, padding included, so they
    start empty, or zeros (all padding) when there is nothing to launch (T == 0 or K == 0)."""
    rows, cols, experts = problem.num_rows, problem.num_cols, problem.num_experts
    if not problem.swizzle:
        return compact_buffers(rows, cols, experts, problem.element_format, problem.device,
                               rowwise=problem.rowwise, columnwise=problem.columnwise)
    fp8, device = problem.element_format.torch_dtype, problem.device
    scale_buffer = torch.empty if rows > 0 and cols > 0 else torch.zeros
    u8 = dict(dtype=torch.uint8, device=device)
    num_tiles = scale_layout.max_row_tiles(rows, experts)
    row_data = row_scales = col_data = col_scales = None
    if problem.rowwise:
        row_data = torch.empty(rows, cols, dtype=fp8, device=device)
        row_scales = scale_buffer(num_tiles * scale_layout.swizzled_size(128, cols // BLOCK_SIZE), **u8)
    if problem.columnwise:
        col_data = torch.empty(cols, rows, dtype=fp8, device=device)
        col_scales = scale_buffer(num_tiles * scale_layout.swizzled_size(cols, 4), **u8)
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
