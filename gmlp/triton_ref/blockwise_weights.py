"""Triton launcher of the FP8 blockwise quantize of weights (128 x 128 tiles). Twin of
``gmlp.fp8_blockwise.reference.quantize_weights_fp8_blockwise_ref``, bit for bit."""

from __future__ import annotations

import torch

from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.problem import validate_weight_args
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor
from gmlp.mxfp8.spec import ElementFormat
from gmlp.triton_ref._blockwise_quantize_kernel import quantize_weight_tiles_kernel
from gmlp.triton_ref.blockwise_quantize import format_constants

__all__ = ["quantize_weights_fp8_blockwise"]


def quantize_weights_fp8_blockwise(w: torch.Tensor, *, element_format: ElementFormat | str = ElementFormat.E4M3,
                                   power_of_two: bool = True, transposed: bool = False) -> FP8BlockwiseTensor:
    """Quantize a weight (N, K) or a stack (E, N, K) in 128 x 128 tiles, or with ``transposed``
    its transpose (..., K, N) straight from W (the dgrads' operand, no copy of W^T made); the
    contract of ``quantize_weights_fp8_blockwise_ref``."""
    element_format = validate_weight_args(w, element_format=element_format, power_of_two=power_of_two)
    shape = (*w.shape[:-2], w.shape[-1], w.shape[-2]) if transposed else tuple(w.shape)
    data = torch.empty(shape, dtype=element_format.torch_dtype, device=w.device)
    scale_inv = torch.empty(layout.weight_scale_shape(shape), dtype=torch.float32, device=w.device)
    rows, cols = w.numel() // max(w.shape[-1], 1), w.shape[-1]
    if w.numel():
        quantize_weight_tiles_kernel[(rows // BLOCK, cols // BLOCK)](
            w, data, scale_inv, cols, w.shape[-2], **format_constants(element_format, w.dtype, power_of_two),
            TRANSPOSED=transposed, num_warps=8)
    return FP8BlockwiseTensor(data, scale_inv, BlockShape.TILE, element_format, power_of_two)
