"""The output buffers of an FP8 blockwise quantization both ways (a quantize, or a GEMM epilogue
that quantizes its output), allocated the same way for every kernel."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise import layout
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["both_ways_buffers"]


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
