"""The output buffers of an FP8 blockwise quantization both ways (a quantize, or a GEMM epilogue
that quantizes its output): allocated, and once the kernel has written them, checked against the
routing and wrapped, the same way for every kernel."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseQuantized, FP8BlockwiseTensor
from gmlp.mxfp8.routing import DeviceGroups, poison_scales_if_invalid
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["both_ways_buffers", "no_token_columnwise", "wrap_both_ways", "as_quantized"]


def both_ways_buffers(rows: int, cols: int, experts: int, element_format: ElementFormat, device: torch.device, *,
                      rowwise: bool = True, columnwise: bool = True) -> tuple[torch.Tensor | None, ...]:
    """(row data (T, K), row scales, column data (K, 128 n_blocks), column scales) of a (T, K)
    source in ``experts`` groups, None for an orientation not asked for; the scale buffers'
    padding set to 1.0 (``layout.scale_buffer``), the rest for the kernel to write: every token's
    rowwise scales, and every one of the ``layout.columnwise_blocks`` columnwise blocks, data and
    scale (zeros and 1.0 where no token is)."""
    fp8 = element_format.torch_dtype
    row_data = row_scales = col_data = col_scales = None
    if rowwise:
        row_data = torch.empty(rows, cols, dtype=fp8, device=device)
        row_scales = layout.scale_buffer(layout.rowwise_scale_shape(rows, cols), rows, device)
    if columnwise:
        col_data = torch.empty(layout.columnwise_data_shape(rows, cols, experts), dtype=fp8, device=device)
        col_scales = layout.scale_buffer(layout.columnwise_scale_shape(rows, cols, experts),
                                         layout.columnwise_blocks(rows, experts), device)
    return row_data, row_scales, col_data, col_scales


def no_token_columnwise(col_data: torch.Tensor, col_scales: torch.Tensor) -> None:
    """The columnwise buffers of a batch without tokens, whose kernel launches nothing: every
    block unused (zeros, scale 1.0)."""
    col_data.view(torch.uint8).zero_()
    col_scales.fill_(1.0)


def wrap_both_ways(buffers: tuple[torch.Tensor | None, ...], groups: DeviceGroups, element_format: ElementFormat,
                   power_of_two: bool, split_sizes: torch.Tensor | None, rows: int) -> FP8BlockwiseQuantized:
    """``both_ways_buffers``' four tensors, written by a kernel, as an ``FP8BlockwiseQuantized``
    of a ``rows``-token source (None for an orientation not asked for); every scale NaN where the
    split sizes are invalid (checked on the device, no host sync)."""
    _, row_scales, _, col_scales = buffers
    for scales in (row_scales, col_scales):
        if scales is not None:
            poison_scales_if_invalid(scales, groups, poison=float("nan"))
    return as_quantized(buffers, element_format, power_of_two, split_sizes, rows)


def as_quantized(buffers: tuple[torch.Tensor | None, ...], element_format: ElementFormat, power_of_two: bool,
                 split_sizes: torch.Tensor | None, rows: int) -> FP8BlockwiseQuantized:
    """``both_ways_buffers``' four tensors as an ``FP8BlockwiseQuantized`` of a ``rows``-token
    source (None for an orientation not asked for), as they are."""
    row_data, row_scales, col_data, col_scales = buffers
    recipe = (element_format, power_of_two, split_sizes)
    return FP8BlockwiseQuantized(
        None if row_data is None else FP8BlockwiseTensor(row_data, row_scales, BlockShape.ROWWISE, *recipe),
        None if col_data is None else FP8BlockwiseTensor(col_data, col_scales, BlockShape.COLUMNWISE, *recipe, rows))
