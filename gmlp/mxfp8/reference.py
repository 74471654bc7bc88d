"""``quantize_mxfp8_ref``: the torch path of ``quantize_mxfp8``, built from the spec (any device).

Same signature and results as the kernels; it syncs with the device to read split sizes, which
is what makes it a readable oracle rather than a fast path.
"""

from __future__ import annotations

import torch

from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.problem import check_split_values, validate_quantize_args
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode, quantize_blocks
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, MXFP8Values, QuantAxis

__all__ = ["quantize_mxfp8_ref", "quantize_dequantize_mxfp8_ref", "quantize_rowwise_ref", "quantize_columnwise_ref"]


def quantize_rowwise_ref(x: torch.Tensor, element_format: ElementFormat, scale_mode: ScaleMode):
    """(data (M, K) fp8, compact scales (M, K/32) uint8) of 1x32 blocks along K."""
    rows, cols = x.shape
    data, scales = quantize_blocks(x.reshape(rows, cols // BLOCK_SIZE, BLOCK_SIZE), element_format, scale_mode)
    return data.reshape(rows, cols), scales


def quantize_columnwise_ref(
    x: torch.Tensor, split_sizes: torch.Tensor | None, element_format: ElementFormat, scale_mode: ScaleMode
):
    """(data (K, M) fp8 transposed, compact scales (K, n_blocks)) of 32x1 blocks along M.

    Blocks start at each expert's first row; a trailing partial block is padded with zeros.
    """
    rows, cols = x.shape
    sizes = [rows] if split_sizes is None else [int(m) for m in split_sizes.tolist()]
    data = torch.empty(cols, rows, dtype=element_format.torch_dtype, device=x.device)
    scales = torch.zeros(cols, scale_layout.max_column_blocks(rows, len(sizes)), dtype=torch.uint8, device=x.device)
    row, block = 0, 0
    for m in sizes:
        blocks = scale_layout.ceil_div(m, BLOCK_SIZE)
        padded = x.new_zeros(cols, blocks * BLOCK_SIZE, dtype=torch.float32)
        padded[:, :m] = x[row : row + m].t().float()
        expert_data, expert_scales = quantize_blocks(padded.view(cols, blocks, BLOCK_SIZE), element_format, scale_mode)
        data[:, row : row + m] = expert_data.view(cols, blocks * BLOCK_SIZE)[:, :m]
        scales[:, block : block + blocks] = expert_scales
        row, block = row + m, block + blocks
    return data, scales


def quantize_mxfp8_ref(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    swizzle: bool = True,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat = ElementFormat.E4M3,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
) -> MXFP8Quantized:
    """Quantize x (M, K) to MXFP8 by the spec; see ``gmlp.quantize_mxfp8`` for the arguments."""
    problem = validate_quantize_args(
        x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes,
        element_format=element_format, scale_mode=scale_mode, strided_rows=True,
    )
    element_format, scale_mode = problem.element_format, problem.scale_mode  # members, if given as strings
    if split_sizes is not None:
        check_split_values(split_sizes, problem.num_rows)
    layout_splits = split_sizes if split_sizes is not None else torch.tensor([problem.num_rows])
    row_result = col_result = None
    if rowwise:
        data, scales = quantize_rowwise_ref(x, element_format, scale_mode)
        if swizzle:
            scales = scale_layout.swizzle_rowwise_grouped(scales, layout_splits)
        row_result = MXFP8Tensor(data, scales, QuantAxis.ROWWISE, swizzle, element_format, scale_mode, split_sizes)
    if columnwise:
        data, scales = quantize_columnwise_ref(x, split_sizes, element_format, scale_mode)
        if swizzle:
            scales = scale_layout.swizzle_columnwise_grouped(scales, layout_splits, problem.num_rows)
        col_result = MXFP8Tensor(data, scales, QuantAxis.COLUMNWISE, swizzle, element_format, scale_mode, split_sizes)
    return MXFP8Quantized(row_result, col_result)


def quantize_dequantize_mxfp8_ref(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat = ElementFormat.E4M3,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
) -> MXFP8Values:
    """The bf16 values of x's MXFP8 quantization in each orientation asked for, by the spec:
    ``quantize_mxfp8_ref`` then ``dequantize()``, rounded to bf16 (exact but for results below
    bf16's smallest subnormal)."""
    quantized = quantize_mxfp8_ref(x, rowwise=rowwise, columnwise=columnwise, swizzle=False, split_sizes=split_sizes,
                                   element_format=element_format, scale_mode=scale_mode)
    return MXFP8Values(*(None if t is None else t.dequantize().to(torch.bfloat16)
                         for t in (quantized.rowwise, quantized.columnwise)))
