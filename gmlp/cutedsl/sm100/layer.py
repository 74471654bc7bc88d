"""The grouped MLP on SM100: the dataflow of docs/design.md as cuDNN frontend's fused grouped kernels.

forward:  x, dy are padded so that every expert starts at a multiple of 256 rows
          (``layout``); quantize x (Q_row for FC1, Q_col for dW1, grouped by the padded
          sizes), W1 (gate/up interleaved when gated) and W2, both ways -> ``fc1`` (GEMM +
          activation * probs, C saved, ``a`` quantized both ways in the epilogue) -> ``fc2``
          (grouped GEMM) -> y
backward: quantize dy both ways -> ``fc2 dgrad`` (GEMM with W2 + activation backward +
          deterministic dprobs, dh quantized both ways) -> ``fc1 dgrad`` (GEMM with W1) -> dx;
          ``fc2 wgrad`` dW2 += Q_col(dy)^T Q_col(a), ``fc1 wgrad`` dW1 += Q_col(dh)^T Q_col(x)

The quantizes run through the layer's ``OpRunner`` (their own dispatch and cross-check; every
path gives the same bits); the fused steps launch kernels (``launch``: by default each is built,
checked and compiled once per call signature). Under the cross-check, each step is then handed
to it as gmlp's op at that site (``views``), and the next path down runs on the same
operands. Every decision is made on the host from shapes:
no host sync. The same function runs with torch twins of the kernels (the CPU tests) or with a
compile-only launcher (the sm_100a compile tests).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.outputs import MLPGrads
from gmlp.contract.weight_reuse import quantized_weight
from gmlp.cutedsl.sm100 import views
from gmlp.cutedsl.sm100.layout import (
    PaddedRows,
    deinterleave_gate_up,
    from_padded,
    interleave_gate_up,
    padded_group_sizes,
    padded_rows,
    to_padded,
)
from gmlp.cutedsl.sm100.steps import (
    KernelCall,
    d_col_of,
    d_row_of,
    dprobs_of,
    fc1_call,
    fc1_dgrad_call,
    fc1_wgrad_call,
    fc2_dgrad_call,
    fc2_wgrad_call,
    grouped_gemm_call,
)
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["CompiledKernels", "Sm100Saved", "sm100_forward", "sm100_backward", "launch_kernel"]

_log = logging.getLogger(__name__)
Launcher = Callable[[str, KernelCall], None]  # (site, call): runs the call's kernel


# what the backward steps read of FC1's call: C and probs (dGLU), Q_col(a) (dW2), the offsets;
# not its operands (Q_row of x and W1) nor Q_row(a), which only the forward reads
FC1_SAVED = ("padded_offsets", "c", "prob", "norm_const", "d_col", "sfd_col")


class CompiledKernels:
    """Builds, checks and compiles each kernel object once per call signature, then launches it
    (a compile takes seconds: each is logged at INFO level, logger ``gmlp.cutedsl.sm100.layer``)."""

    def __init__(self):
        self._kernels: dict[tuple, object] = {}

    def __call__(self, site: str, call: KernelCall) -> None:
        key = call.signature()
        kernel = self._kernels.get(key)
        if kernel is None:
            kernel = call.kernel()
            if not kernel.check_support():
                raise RuntimeError(f"{site}: cuDNN frontend's {call.step} kernel refused gmlp's arguments (a gap in "
                                   "gmlp.dispatch.providers.cutedsl_sm100.composition_reason; GMLP_BACKEND=triton runs the layer without it)")
            start = time.perf_counter()
            kernel.compile()
            _log.info("%s: compiled cuDNN frontend's %s kernel in %.1f s", site, call.step, time.perf_counter() - start)
            self._kernels[key] = kernel
        call.launch(kernel)


launch_kernel: Launcher = CompiledKernels()  # the default launcher (the tests substitute theirs)


@dataclass
class Sm100Saved:
    """What the SM100 forward keeps for the backward."""

    rows: PaddedRows
    x_col: MXFP8Tensor  # Q_col of the padded x, grouped by the padded sizes
    fc1: KernelCall  # FC1's call, FC1_SAVED only: C, Q_col(a) (D_col), probs, offsets
    w1_col: MXFP8Tensor  # Q_col of the (E * N1, H) W1 stack as FC1 read it (interleaved when gated)
    w2_col: MXFP8Tensor
    split_sizes: torch.Tensor
    probs: torch.Tensor | None


def _require_sm100_recipe(recipe: MXFP8Recipe | None, b1, b2) -> MXFP8Recipe:
    if recipe is None or b1 is not None or b2 is not None:  # the dispatcher keeps these off this path
        raise ValueError("the SM100 path runs the MXFP8 recipe without biases (gmlp.dispatch.sites gives the reasons)")
    return recipe


def _both_ways(split_sizes: torch.Tensor, recipe: MXFP8Recipe, element_format=None) -> dict:
    """The quantize arguments of every SM100 operand: both ways, swizzled, grouped."""
    return dict(rowwise=True, columnwise=True, swizzle=True, split_sizes=split_sizes, scale_mode=recipe.scale_mode,
                **({} if element_format is None else {"element_format": element_format}))


def _cross_check(run, site: str, view: Callable[[], tuple], before: torch.Tensor | None = None) -> None:
    """Hand a finished step to the cross-check, when it is on: ``view()`` gives the step's output
    and operands as the site's op takes them; ``before``: an accumulated output's prior value."""
    check = getattr(run, "check", None)
    if check is not None:
        got, args, kwargs = view()
        check(site, got, args, kwargs, before)


def _before(run, out: torch.Tensor) -> torch.Tensor | None:
    """A copy of an output the next launch adds into, when the cross-check needs its prior value."""
    return out.clone() if getattr(run, "check", None) is not None else None


def sm100_forward(run, x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None, w1: torch.Tensor,
                  b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None, activation: Activation,
                  recipe: MXFP8Recipe | None, launch: Launcher | None = None) -> tuple[torch.Tensor, Sm100Saved]:
    """y (T, H) bf16 and the saved state; the arguments of ``gmlp.layer.steps.grouped_mlp_forward``."""
    recipe, launch = _require_sm100_recipe(recipe, b1, b2), launch or launch_kernel
    tokens, hidden = x.shape
    experts, ffn = w2.shape[0], w2.shape[2]
    rows = padded_rows(split_sizes, tokens)
    xq = run("quantize x", to_padded(x, rows), **_both_ways(padded_group_sizes(rows.offsets, rows.num_rows), recipe))
    w1_stack = lambda: (interleave_gate_up(w1) if activation.gated else w1).reshape(-1, hidden)  # noqa: E731
    w1q = quantized_weight(run, "quantize w1", w1_stack,
                           **_both_ways(torch.full((experts,), w1.shape[1], device=x.device), recipe))
    w2q = quantized_weight(run, "quantize w2", lambda: w2.reshape(-1, ffn),
                           **_both_ways(torch.full((experts,), hidden, device=x.device), recipe))
    prob = probs.float() if probs is not None else torch.ones(tokens, dtype=torch.float32, device=x.device)
    fc1 = fc1_call(xq.rowwise, w1q.rowwise, rows.offsets, to_padded(prob, rows), activation)
    launch("fc1", fc1)
    _cross_check(run, "fc1", lambda: views.fc1_view(fc1, xq.rowwise, w1q.rowwise, rows, split_sizes, probs, activation,
                                                    recipe))
    fc2 = grouped_gemm_call(d_row_of(fc1), w2q.rowwise, rows.offsets)
    launch("fc2", fc2)
    _cross_check(run, "fc2", lambda: views.fc2_view(fc2, d_row_of(fc1), w2q.rowwise, rows, split_sizes))
    saved = Sm100Saved(rows, xq.columnwise, fc1.keeping(FC1_SAVED), w1q.columnwise, w2q.columnwise, split_sizes, probs)
    return from_padded(fc2["d"], rows), saved


def sm100_backward(run, dy: torch.Tensor, saved: Sm100Saved, activation: Activation, recipe: MXFP8Recipe | None,
                   weight_grad_dtype: torch.dtype = torch.float32,
                   weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None,
                   launch: Launcher | None = None) -> MLPGrads:
    """Gradients for dy (T, H); the arguments of ``gmlp.layer.steps.grouped_mlp_backward``. Weight
    gradients are fp32 sums added into ``weight_grad_out`` when given (dW1 via an fp32 buffer in
    the kernels' interleaved row order), else returned in ``weight_grad_dtype``."""
    recipe, launch = _require_sm100_recipe(recipe, None, None), launch or launch_kernel
    rows = saved.rows
    dyq = run("quantize dy", to_padded(dy, rows),
              **_both_ways(padded_group_sizes(rows.offsets, rows.num_rows), recipe, recipe.grad_format))
    dgrad = fc2_dgrad_call(dyq.rowwise, saved.w2_col, saved.fc1, activation)
    launch("fc2 dgrad", dgrad)
    dprobs = from_padded(dprobs_of(dgrad), rows) if saved.probs is not None else None
    _cross_check(run, "fc2 dgrad", lambda: views.fc2_dgrad_view(
        dgrad, dprobs, dyq.rowwise, saved.w2_col, saved.fc1, rows, saved.split_sizes, saved.probs, activation, recipe))
    fc1_dgrad = fc1_dgrad_call(dgrad, saved.w1_col)
    launch("fc1 dgrad", fc1_dgrad)
    _cross_check(run, "fc1 dgrad", lambda: views.fc1_dgrad_view(fc1_dgrad, dgrad, saved.w1_col, rows, saved.split_sizes,
                                                                activation))
    dx = from_padded(fc1_dgrad["d"], rows)

    experts, hidden = saved.split_sizes.numel(), dy.shape[1]
    ffn = saved.w2_col.data.shape[0]
    n1 = saved.w1_col.data.shape[1] // experts
    dw1_out, dw2_out = weight_grad_out if weight_grad_out is not None else (None, None)
    direct = dw2_out is not None and dw2_out.dtype == torch.float32 and dw2_out.is_contiguous()
    dw2 = dw2_out if direct else torch.zeros(experts, hidden, ffn, dtype=torch.float32, device=dy.device)
    before = _before(run, dw2) if direct else None
    launch("fc2 wgrad", fc2_wgrad_call(dyq.columnwise, saved.fc1, dw2))
    _cross_check(run, "fc2 wgrad", lambda: views.wgrad_view(dw2, dyq.columnwise, d_col_of(saved.fc1), rows,
                                                            saved.split_sizes, False, dw2 if direct else None), before)
    dw1 = torch.zeros(experts, n1, hidden, dtype=torch.float32, device=dy.device)  # dh's row order
    launch("fc1 wgrad", fc1_wgrad_call(dgrad, saved.x_col, dw1))
    if activation.gated:
        dw1 = deinterleave_gate_up(dw1)
    _cross_check(run, "fc1 wgrad", lambda: views.wgrad_view(dw1, d_col_of(dgrad), saved.x_col, rows, saved.split_sizes,
                                                            activation.gated, None))
    dw1 = _finish(dw1, dw1_out, weight_grad_dtype)
    dw2 = dw2 if direct else _finish(dw2, dw2_out, weight_grad_dtype)
    return MLPGrads(dx=dx, dprobs=dprobs, dw1=dw1, db1=None, dw2=dw2, db2=None)


def _finish(grad: torch.Tensor, out: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """An fp32 weight gradient added into ``out`` (returned), or in ``dtype``."""
    if out is None:
        return grad.to(dtype)
    return out.add_(grad)
