"""Triton launcher of the FP8 blockwise quantize of weights (128 x 128 tiles). Twin of
``gmlp.fp8_blockwise.reference.quantize_weights_fp8_blockwise_ref``, bit for bit."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.problem import validate_weight_args
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, FP8BlockwiseWeightPair
from gmlp.mxfp8.spec import ElementFormat
from gmlp.triton_ref._blockwise_quantize_kernel import quantize_weight_tiles_kernel
from gmlp.triton_ref.blockwise_quantize import format_constants

__all__ = ["quantize_weights_fp8_blockwise"]


def _empty_tiles(shape: tuple[int, ...], element_format: ElementFormat, power_of_two: bool,
                 device: torch.device) -> FP8BlockwiseTensor:
    """The buffers of a weight (..., N, K)'s tiles, for the kernel to fill."""
    return FP8BlockwiseTensor(torch.empty(shape, dtype=element_format.torch_dtype, device=device),
                              torch.empty(layout.weight_scale_shape(shape), dtype=torch.float32, device=device),
                              BlockShape.TILE, element_format, power_of_two)


def quantize_weights_fp8_blockwise(w: torch.Tensor, *, element_format: ElementFormat | str = ElementFormat.E4M3,
                                   power_of_two: bool = True, transposed: bool = False,
                                   both_orientations: bool = False) -> FP8BlockwiseTensor | FP8BlockwiseWeightPair:
    """Quantize a weight (N, K) or a stack (E, N, K) in 128 x 128 tiles, or with ``transposed``
    its transpose (..., K, N) straight from W (the dgrads' operand, no copy of W^T made), or with
    ``both_orientations`` both from one read of W (an ``FP8BlockwiseWeightPair``: 2 bytes an
    element read and 1 + 1 written, against 2 + 1 for each orientation alone); the contract of
    ``quantize_weights_fp8_blockwise_ref``."""
    element_format = validate_weight_args(w, element_format=element_format, power_of_two=power_of_two,
                                          transposed=transposed, both_orientations=both_orientations)
    flipped_shape = (*w.shape[:-2], w.shape[-1], w.shape[-2])
    tiles = None if transposed else _empty_tiles(tuple(w.shape), element_format, power_of_two, w.device)
    flipped = (_empty_tiles(flipped_shape, element_format, power_of_two, w.device)
               if transposed or both_orientations else None)
    if w.numel():
        # an orientation not written takes the other's buffers as its (unused) pointers
        written, written_t = tiles or flipped, flipped or tiles
        rows, cols = w.numel() // w.shape[-1], w.shape[-1]
        quantize_weight_tiles_kernel[(rows // BLOCK, cols // BLOCK)](
            w, written.data, written.scale_inv, written_t.data, written_t.scale_inv, cols, w.shape[-2],
            **format_constants(element_format, w.dtype, power_of_two), TILES=tiles is not None,
            TRANSPOSED=flipped is not None, num_warps=8)
    if both_orientations:
        return FP8BlockwiseWeightPair(tiles, flipped)
    return flipped if transposed else tiles
