"""Calling conventions: every path's implementation of an op takes the arguments of the op's
Triton launcher. The torch implementations (the oracle's twins) ignore the launch-only ones, and
the bf16 GEMMs also take the MXFP8 operands of a site whose chosen kernel decodes them."""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["without", "dequantize_ref", "operand_values", "dequantizing_a"]


def without(*launch_only: str) -> Callable[[Callable], Callable]:
    """Wrap an implementation so that it accepts, and ignores, the Triton launcher's launch-only
    arguments."""
    def wrap(function: Callable) -> Callable:
        def twin(*args, **kwargs):
            for name in launch_only:
                kwargs.pop(name, None)
            return function(*args, **kwargs)
        twin.__name__ = twin.__qualname__ = function.__name__
        return twin
    return wrap


def dequantize_ref(tensor: MXFP8Tensor, groups=None) -> torch.Tensor:
    """The spec's dequantize, rounded to bf16 (what the Triton kernel writes, bit for bit)."""
    del groups
    return tensor.dequantize().to(torch.bfloat16)


def operand_values(a: torch.Tensor | MXFP8Tensor) -> torch.Tensor:
    """A GEMM operand's values: an MXFP8Tensor's (the spec's dequantize in bf16), or the tensor."""
    return dequantize_ref(a) if isinstance(a, MXFP8Tensor) else a


def dequantizing_a(function: Callable, dequantize: Callable, operands: int = 1) -> Callable:
    """Wrap a GEMM that reads bf16 operands (the token-row GEMMs' A: x, a, dy, dh; the weight
    gradients' two, ``operands=2``) so that it also takes the MXFP8 operands of a site whose chosen
    kernel decodes them (``LayerPlan.decoding_sites``): the cross-check's reference then runs on the
    dequantized values, which the decoding kernel multiplies bit for bit. ``dequantize`` gets the
    call's ``groups`` (a columnwise quantization's experts)."""
    def twin(*args, **kwargs):
        values = [dequantize(v, kwargs.get("groups")) if isinstance(v, MXFP8Tensor) else v for v in args[:operands]]
        return function(*values, *args[operands:], **kwargs)
    twin.__name__ = twin.__qualname__ = function.__name__
    return twin
