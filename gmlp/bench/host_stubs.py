"""Ops that only allocate their outputs: ``bench host --paths stub`` times the layer's own Python.

With every site's op replaced by a stub that allocates what the op returns (same shapes, dtypes
and output types; nothing computed, nothing launched but the allocations), a layer step costs
what gmlp adds around its kernels: the module's checks, planning, the expert groups and split
check, the op runner, autograd and the saved state. The figure is meaningful on any device, the
CPU included (there it is the only host figure that leaves out the computation), and its changes
are the changes of that Python.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from gmlp.contract.gate_up import GateUp
from gmlp.contract.outputs import FC1Output, FC2DgradOutput
from gmlp.dispatch.sites import Op, Site
from gmlp.mxfp8.buffers import compact_buffers, empty_quantize
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.spec import ElementFormat
from gmlp.mxfp8.tensor import MXFP8Tensor, MXFP8Values

__all__ = ["stub", "stubbed_ops"]


def _shape(a: torch.Tensor | MXFP8Tensor) -> tuple[int, ...]:
    """A GEMM operand's (M, K): an MXFP8 tensor's source shape."""
    return a.source_shape if isinstance(a, MXFP8Tensor) else tuple(a.shape)


def _n(b: torch.Tensor | GateUp | tuple) -> int:
    """N of a GEMM's (E, N, K) B operand (W1's gate and up stored apart: both, side by side)."""
    if isinstance(b, GateUp):
        return 2 * b.gate.shape[1]
    if isinstance(b, tuple):
        return sum(part.shape[1] for part in b)
    return b.shape[1]


def _both_ways(values: torch.Tensor, recipe: MXFP8Recipe, split_sizes: torch.Tensor, fmt) -> tuple:
    """(rowwise, columnwise) MXFP8 tensors of an epilogue's quantized output, unwritten."""
    buffers = compact_buffers(values.shape[0], values.shape[1], split_sizes.numel(), fmt, values.device)
    return buffers.tensors(False, fmt, recipe.scale_mode, split_sizes)


def stub(site: Site, path, capability) -> Callable:
    """The stub of ``site``'s op, with ``gmlp.dispatch.plan.implementation``'s signature: the
    arguments of the op's Triton launcher in, its outputs allocated and unwritten out."""
    del path, capability
    op = site.op

    def run(*args, **kwargs):
        if op is Op.QUANTIZE:
            kwargs.pop("groups", None)
            return empty_quantize(*args, **kwargs)
        if op is Op.QUANTIZE_DEQUANTIZE:
            x = args[0]
            return MXFP8Values(*(torch.empty(x.shape, dtype=torch.bfloat16, device=x.device) if kwargs.get(axis) else None
                                 for axis in ("rowwise", "columnwise")))
        if op is Op.DEQUANTIZE:
            rows, cols = args[0].source_shape
            return torch.empty(rows, cols, dtype=torch.bfloat16, device=args[0].data.device)
        if op is Op.FC1:
            x, w1, split_sizes = args[:3]
            ffn, recipe = kwargs["ffn_hidden_size"], kwargs["recipe"]
            c = torch.empty(_shape(x)[0], _n(w1), dtype=torch.bfloat16, device=split_sizes.device)
            a = c.new_empty(c.shape[0], ffn)
            if recipe is None:
                return FC1Output(c, a, None, None)
            return FC1Output(c, None, *_both_ways(a, recipe, split_sizes, ElementFormat.E4M3))
        if op is Op.GROUPED_GEMM:
            a, b = args[:2]
            return torch.empty(_shape(a)[0], _n(b), dtype=torch.bfloat16, device=args[2].device)
        if op is Op.FC2_DGRAD:
            _, _, c, split_sizes = args[:4]
            recipe, probs = kwargs["recipe"], kwargs.get("probs")
            dprobs = None if probs is None else torch.empty(c.shape[0], dtype=torch.float32, device=c.device)
            db1 = (torch.empty(split_sizes.numel(), c.shape[1], dtype=torch.float32, device=c.device)
                   if kwargs.get("bias_grad") else None)
            dh = c.new_empty(c.shape)
            if recipe is None:
                return FC2DgradOutput(dprobs, dh, None, None, db1)
            return FC2DgradOutput(dprobs, None, *_both_ways(dh, recipe, split_sizes, recipe.grad_format), db1)
        if op is Op.WGRAD:
            a, b, split_sizes = args[:3]
            out = kwargs.get("out")
            if out is not None:
                return out
            grad = torch.empty(split_sizes.numel(), _shape(a)[1], _shape(b)[1],
                               dtype=kwargs.get("out_dtype", torch.float32), device=split_sizes.device)
            rows = kwargs.get("split_rows")
            return (grad[:, :rows], grad[:, rows:]) if rows else grad
        if op is Op.SEGMENT_SUM:
            values, starts = args[:2]
            return torch.empty(starts.numel() - 1, values.shape[1], dtype=torch.float32, device=values.device)
        raise NotImplementedError(f"no stub for {op}")

    return run


@contextlib.contextmanager
def stubbed_ops() -> Iterator[None]:
    """Every layer site runs its stub inside (``gmlp.layer.steps.implementation`` replaced)."""
    from gmlp.layer import steps

    real = steps.implementation
    steps.implementation = stub
    try:
        yield
    finally:
        steps.implementation = real
