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
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.buffers import as_quantized, both_ways_buffers
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseQuantized, FP8BlockwiseTensor, FP8BlockwiseWeightPair
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


def _blockwise_both_ways(rows: int, cols: int, split_sizes: torch.Tensor, fmt: ElementFormat, pow2: bool, *,
                         rowwise: bool = True, columnwise: bool = True) -> FP8BlockwiseQuantized:
    """A blockwise quantization of a (rows, cols) token operand, its buffers unwritten."""
    buffers = both_ways_buffers(rows, cols, split_sizes.numel(), fmt, split_sizes.device, rowwise=rowwise,
                                columnwise=columnwise)
    return as_quantized(buffers, fmt, pow2, split_sizes, rows)


def _tiles(shape: tuple[int, ...], fmt: ElementFormat, pow2: bool, device: torch.device) -> FP8BlockwiseTensor:
    """A weight's 128 x 128 tiles, unwritten."""
    return FP8BlockwiseTensor(torch.empty(shape, dtype=fmt.torch_dtype, device=device),
                              torch.empty(layout.weight_scale_shape(shape), dtype=torch.float32, device=device),
                              BlockShape.TILE, fmt, pow2)


def _blockwise_weights(w: torch.Tensor, *, element_format: ElementFormat, power_of_two: bool, transposed: bool = False,
                       both_orientations: bool = False) -> FP8BlockwiseTensor | FP8BlockwiseWeightPair:
    """The stub of ``Op.BLOCKWISE_WEIGHTS``: W's tiles, W^T's, or both."""
    flipped = (*w.shape[:-2], w.shape[-1], w.shape[-2])
    if both_orientations:
        return FP8BlockwiseWeightPair(_tiles(tuple(w.shape), element_format, power_of_two, w.device),
                                      _tiles(flipped, element_format, power_of_two, w.device))
    return _tiles(flipped if transposed else tuple(w.shape), element_format, power_of_two, w.device)


def _blockwise_stub(op: Op, args: tuple, kwargs: dict):
    """The stub of an FP8 blockwise op (``Op.BLOCKWISE_*``)."""
    if op is Op.BLOCKWISE_WEIGHTS:
        return _blockwise_weights(*args, **kwargs)
    if op is Op.BLOCKWISE_QUANTIZE:
        x = args[0]
        return _blockwise_both_ways(*x.shape, kwargs["split_sizes"], kwargs["element_format"], kwargs["power_of_two"],
                                    rowwise=kwargs["rowwise"], columnwise=kwargs["columnwise"])
    if op is Op.BLOCKWISE_FC1:
        x, w1, split_sizes = args[:3]
        tokens, ffn = x.source_shape[0], kwargs["ffn_hidden_size"]
        c = torch.empty(tokens, w1.data.shape[1], dtype=torch.bfloat16, device=split_sizes.device)
        a = _blockwise_both_ways(tokens, ffn, split_sizes, ElementFormat.E4M3, kwargs["power_of_two"])
        return FC1Output(c=c, a=None, a_rowwise=a.rowwise, a_columnwise=a.columnwise)
    if op is Op.BLOCKWISE_GEMM:
        a, b, split_sizes = args[:3]
        return torch.empty(a.source_shape[0], b.data.shape[1], dtype=torch.bfloat16, device=split_sizes.device)
    if op is Op.BLOCKWISE_FC2_DGRAD:
        _, _, c, split_sizes = args[:4]
        probs = kwargs.get("probs")
        dprobs = None if probs is None else torch.empty(c.shape[0], dtype=torch.float32, device=c.device)
        db1 = (torch.empty(split_sizes.numel(), c.shape[1], dtype=torch.float32, device=c.device)
               if kwargs.get("bias_grad") else None)
        dh = _blockwise_both_ways(*c.shape, split_sizes, kwargs["grad_format"], kwargs["power_of_two"])
        return FC2DgradOutput(dprobs=dprobs, dh=None, db1=db1, dh_rowwise=dh.rowwise, dh_columnwise=dh.columnwise)
    if op is Op.BLOCKWISE_WGRAD:
        a, b, split_sizes = args[:3]
        out = kwargs.get("out")
        if out is not None:
            return out
        return torch.empty(split_sizes.numel(), a.source_shape[1], b.source_shape[1],
                           dtype=kwargs.get("out_dtype", torch.float32), device=split_sizes.device)
    raise NotImplementedError(f"no stub for {op}")


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
        return _blockwise_stub(op, args, kwargs)

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
