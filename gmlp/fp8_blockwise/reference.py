"""The spec's FP8 blockwise quantize in plain PyTorch (any device): the oracle of every kernel.

It syncs with the device to read split sizes, which is what makes it a readable oracle rather
than a fast path.
"""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.problem import validate_blockwise_args, validate_weight_args
from gmlp.fp8_blockwise.spec import BLOCK, quantize_blocks
from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseQuantized,
    FP8BlockwiseTensor,
    FP8BlockwiseWeightPair,
)
from gmlp.mxfp8.problem import check_split_values
from gmlp.mxfp8.scale_layout import ceil_div
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["quantize_fp8_blockwise_ref", "quantize_weights_fp8_blockwise_ref"]


def _rowwise(x: torch.Tensor, element_format: ElementFormat, power_of_two: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    data, scale_inv = quantize_blocks(x.reshape(rows, cols // BLOCK, BLOCK), element_format, power_of_two)
    buffer = torch.ones(layout.rowwise_scale_shape(rows, cols), dtype=torch.float32, device=x.device)
    buffer[:, :rows] = scale_inv.t()
    return data.reshape(rows, cols), buffer


def _columnwise(x: torch.Tensor, sizes: list[int], element_format: ElementFormat,
                power_of_two: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    data = torch.zeros(layout.columnwise_data_shape(rows, cols, len(sizes)), dtype=element_format.torch_dtype,
                       device=x.device)
    buffer = torch.ones(layout.columnwise_scale_shape(rows, cols, len(sizes)), dtype=torch.float32, device=x.device)
    row, block = 0, 0
    for m in sizes:
        blocks = ceil_div(m, BLOCK)
        padded = x.new_zeros(cols, blocks * BLOCK)  # the tokens past the expert's end count as 0
        padded[:, :m] = x[row:row + m].t()
        expert_data, expert_scales = quantize_blocks(padded.view(cols, blocks, BLOCK), element_format, power_of_two)
        data[:, block * BLOCK:(block + blocks) * BLOCK] = expert_data.view(cols, blocks * BLOCK)
        buffer[:, block:block + blocks] = expert_scales
        row, block = row + m, block + blocks
    return data, buffer


def quantize_fp8_blockwise_ref(x: torch.Tensor, *, rowwise: bool = True, columnwise: bool = False,
                               split_sizes: torch.Tensor | None = None,
                               element_format: ElementFormat | str = ElementFormat.E4M3,
                               power_of_two: bool = True) -> FP8BlockwiseQuantized:
    """Quantize a token operand x (T, K) by the spec: 1 x 128 blocks along K (``rowwise``) and/or
    128 x 1 blocks along each expert's tokens (``columnwise``, from x's values, not from the
    rowwise fp8). ``split_sizes`` (E,) groups x's rows by expert (None: one group)."""
    problem = validate_blockwise_args(x, rowwise=rowwise, columnwise=columnwise, split_sizes=split_sizes,
                                      element_format=element_format, power_of_two=power_of_two)
    element_format = problem.element_format
    if split_sizes is not None:
        check_split_values(split_sizes, problem.num_rows)
    sizes = [problem.num_rows] if split_sizes is None else [int(m) for m in split_sizes.tolist()]
    row_result = col_result = None
    if rowwise:
        row_result = FP8BlockwiseTensor(*_rowwise(x, element_format, power_of_two), BlockShape.ROWWISE,
                                        element_format, power_of_two, split_sizes)
    if columnwise:
        col_result = FP8BlockwiseTensor(*_columnwise(x, sizes, element_format, power_of_two), BlockShape.COLUMNWISE,
                                        element_format, power_of_two, split_sizes, problem.num_rows)
    return FP8BlockwiseQuantized(row_result, col_result)


def quantize_weights_fp8_blockwise_ref(w: torch.Tensor, *, element_format: ElementFormat | str = ElementFormat.E4M3,
                                       power_of_two: bool = True, transposed: bool = False,
                                       both_orientations: bool = False
                                       ) -> FP8BlockwiseTensor | FP8BlockwiseWeightPair:
    """Quantize a weight (N, K) or a stack (E, N, K) in 128 x 128 tiles by the spec; with
    ``transposed``, its transpose (..., K, N): the transposed tiles, bit for bit (a tile's amax is
    its transpose's); with ``both_orientations``, the pair of both (``FP8BlockwiseWeightPair``)."""
    element_format = validate_weight_args(w, element_format=element_format, power_of_two=power_of_two,
                                          transposed=transposed, both_orientations=both_orientations)
    *lead, rows, cols = w.shape
    # (..., N/128, 128, K/128, 128) -> (..., N/128, K/128, 128 * 128): one tile a row
    blocks = w.reshape(*lead, rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).transpose(-3, -2)
    data, scale_inv = quantize_blocks(blocks.reshape(*blocks.shape[:-2], BLOCK * BLOCK), element_format, power_of_two)
    data = data.view(*blocks.shape).transpose(-3, -2).reshape(w.shape)
    tiles = FP8BlockwiseTensor(data, scale_inv, BlockShape.TILE, element_format, power_of_two)
    if both_orientations:
        return FP8BlockwiseWeightPair(tiles, tiles.transpose())
    return tiles.transpose() if transposed else tiles
