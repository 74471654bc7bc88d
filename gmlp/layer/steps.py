"""The grouped MLP's forward and backward as a sequence of ops, each on the path its plan chose.

The dataflow of docs/design.md, step for step, with no host sync on the kernel paths:

forward:  quantize W1 -> quantize x (rowwise for FC1, columnwise kept for FC1 wgrad) -> ``fc1``
          (c, Q_row(a), Q_col(a)) -> quantize W2 -> ``fc2`` (grouped GEMM) with Q_row(W2) -> y
backward: quantize dy (both ways, gradient format) -> ``fc2 dgrad`` with Q_col(W2) (dprobs,
          Q_row(dh), Q_col(dh)) -> ``fc1 dgrad`` with Q_col(W1) -> dx; ``fc2 wgrad``
          dW2 = Q_col(dy)^T Q_col(a), ``fc1 wgrad`` dW1 = Q_col(dh)^T Q_col(x); ``bias grad`` for b2

Each op runs through an ``OpRunner``: the implementation of the site's chosen path
(``gmlp.dispatch.sites``), and, when the cross-check is on, the next path down on the same inputs
(``gmlp.debug``). MXFP8 operands are dequantized to bf16 once, just before the GEMM that reads
them, and the GEMMs run on bf16 (Hopper has no block-scaled MMA): the same values a GEMM would
dequantize tile by tile, without repeating that work in every tile. Only the quantized tensors
are kept for the backward, and no bf16 copy outlives the GEMM that reads it (a dequantized W is
as large as its gradient). Each weight is quantized once per forward, rowwise and columnwise in
one pass over its (E * N, K) stack: Q_row(W) for the forward GEMM, Q_col(W) for the backward
one, which reads W_g^T as a transposed view of its dequantized values (in bf16, of the weight
itself). No weight is copied to be transposed. Bias gradients are fp32 per-expert sums (of dy
for b2; of dh's per-tile sums inside ``fc2 dgrad`` for b1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.gate_up import GateUp
from gmlp.contract.outputs import MLPGrads
from gmlp.contract.weight_reuse import quantized_weight
from gmlp.dispatch.plan import LayerPlan, implementation
from gmlp.dispatch.sites import SITES
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, QuantAxis

__all__ = ["OpRunner", "LayerSaved", "fake_layer_saved", "grouped_mlp_forward",
           "grouped_mlp_backward"]

CrossCheckHook = Callable[..., None]  # (site name, chosen output, args, kwargs, inputs before the call)


class OpRunner:
    """Runs each site's op on the path its plan chose; ``check``, when given (the cross-check),
    sees every call and its output. ``reused_weights`` (site -> output) are quantized weights
    of an earlier forward, which ``quantized_weight`` returns instead of quantizing again; with
    ``keep_weights`` it keeps the weight sites' outputs in ``kept_weights`` for later forwards."""

    def __init__(self, plan: LayerPlan, check: CrossCheckHook | None = None,
                 reused_weights: dict[str, MXFP8Quantized] | None = None, keep_weights: bool = False):
        self.plan, self.check = plan, check
        self.reused_weights = reused_weights or {}
        self.kept_weights: dict[str, MXFP8Quantized] | None = {} if keep_weights else None

    def __call__(self, site: str, *args, **kwargs):
        run = implementation(SITES[site], self.plan.path(site), self.plan.capability)
        if self.check is None:
            return _naming_site(site, run, args, kwargs)
        # an accumulating output (main_grad; a pair of them for W1's gate and up) is copied
        # first, so that the check can run the other path from the same starting values
        out = kwargs.get("out")
        before = None if out is None else tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
        result = _naming_site(site, run, args, kwargs)
        self.check(site, result, args, kwargs, before)
        return result


def _naming_site(site: str, run: Callable, args: tuple, kwargs: dict):
    """``run(*args, **kwargs)``; an argument error is raised again (same type) with the site in
    front: the op's own message names its parameter ("x"), the site says which tensor of the
    layer that is ("quantize dy": the gradient of y)."""
    try:
        return run(*args, **kwargs)
    except (ValueError, TypeError) as error:
        if type(error) not in (ValueError, TypeError):  # a subclass may take other arguments: left as it is
            raise
        raise type(error)(f"gmlp layer, at its {site!r} op: {error}") from error


@dataclass
class LayerSaved:
    """What the forward keeps for the backward."""

    x_col: torch.Tensor | MXFP8Tensor  # (T, H) bf16, or Q_col(x)
    c: torch.Tensor  # (T, 2F | F) bf16
    a_col: torch.Tensor | MXFP8Tensor  # (T, F) bf16, or Q_col(a)
    probs: torch.Tensor | None
    # (E, 2F | F, H) W1 (bf16), or Q_col(W1) of its (E * N1, H) stack; W1's gate and up stored
    # apart (gmlp.contract.gate_up): their GateUp views, or (Q_col(gate), Q_col(up)) of (E * F, H) stacks
    w1_col: torch.Tensor | MXFP8Tensor | GateUp | tuple[MXFP8Tensor, MXFP8Tensor]
    w2_col: torch.Tensor | MXFP8Tensor  # (E, H, F) W2 (bf16), or Q_col(W2)
    split_sizes: torch.Tensor
    groups: DeviceGroups  # device prefix sums of split_sizes, computed once for every launcher
    has_b1: bool
    has_b2: bool


def fake_layer_saved(x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None, w1: torch.Tensor,
                     b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None, activation: Activation,
                     recipe: MXFP8Recipe | None) -> LayerSaved:
    """What ``grouped_mlp_forward`` saves, as new empty tensors of the same shapes, dtypes and
    strides (every buffer is sized from host-known bounds): the state of a traced forward
    (``gmlp.layer.autograd``' fake implementation), with symbolic token counts where the tracer has them."""
    tokens = x.shape[0]  # the only size a tracer may hold symbolically; the others come from the weights
    apart = isinstance(w1, GateUp)  # W1's gate and up stored apart
    experts, hidden, ffn = w2.shape[0], w2.shape[1], w2.shape[2]
    fc1_outputs = 2 * ffn if apart else w1.shape[1]
    unquantized = torch.bfloat16 if recipe is not None else x.dtype  # c always; a, dh without a recipe
    groups = DeviceGroups(*(split_sizes.new_empty(experts + 1, dtype=torch.int32) for _ in range(3)),
                          split_sizes.new_empty((), dtype=torch.bool), checked=True)  # as the forward's
    c = x.new_empty(tokens, fc1_outputs, dtype=unquantized)

    def q_col(rows: int, cols: int, grouped: bool) -> MXFP8Tensor:  # Q_col of an (rows, cols) source, compact
        blocks = scale_layout.max_column_blocks(rows, experts if grouped else 1)
        return MXFP8Tensor(x.new_empty(cols, rows, dtype=ElementFormat.E4M3.torch_dtype),
                           x.new_empty(cols, blocks, dtype=torch.uint8), QuantAxis.COLUMNWISE, False,
                           ElementFormat.E4M3, recipe.scale_mode, split_sizes if grouped else None)

    if recipe is None:
        x_col, a_col, w1_col, w2_col = x, x.new_empty(tokens, ffn, dtype=unquantized), w1, w2
    else:
        x_col, a_col = q_col(tokens, hidden, True), q_col(tokens, ffn, True)
        w1_col = ((q_col(experts * ffn, hidden, False), q_col(experts * ffn, hidden, False)) if apart
                  else q_col(experts * fc1_outputs, hidden, False))
        w2_col = q_col(experts * hidden, ffn, False)
    return LayerSaved(x_col=x_col, c=c, a_col=a_col, probs=probs, w1_col=w1_col, w2_col=w2_col,
                      split_sizes=split_sizes, groups=groups, has_b1=b1 is not None, has_b2=b2 is not None)


def _bf16(run: OpRunner, value: torch.Tensor | MXFP8Tensor, groups: DeviceGroups | None = None) -> torch.Tensor:
    """bf16 values of a GEMM operand: an MXFP8Tensor dequantized (source orientation), or itself.
    ``groups`` are the device prefix sums of a grouped operand's split sizes."""
    return run("dequantize", value, groups) if isinstance(value, MXFP8Tensor) else value


def _a_operand(run: OpRunner, site: str, value: torch.Tensor | MXFP8Tensor) -> torch.Tensor | MXFP8Tensor:
    """The token-row operand A (x, a, dy, dh) of the GEMM at ``site``: as it is where the site's
    kernel decodes an MXFP8 A (``LayerPlan.decoding_sites``), else its bf16 values."""
    plan = getattr(run, "plan", None)  # a plain function runs no plan
    return value if plan is not None and site in plan.decoding_sites else _bf16(run, value)


def _wgrad_operands(run: OpRunner, site: str, a: torch.Tensor | MXFP8Tensor, b: torch.Tensor | MXFP8Tensor,
                    groups: DeviceGroups) -> tuple:
    """The two operands of the weight gradient at ``site``: the columnwise MXFP8 tensors as they
    are where the site's kernel decodes them (``LayerPlan.decoding_sites``) and can at this T (the
    SM90 kernel's ``decoded_wgrad_reason``: T a multiple of 16; not while ``DECODED_WGRAD_FAULT``
    holds), else their bf16 values."""
    plan = getattr(run, "plan", None)
    if plan is not None and site in plan.decoding_sites:
        from gmlp.cutedsl.sm90.support import DECODED_WGRAD_FAULT, decoded_wgrad_reason

        if DECODED_WGRAD_FAULT is None and decoded_wgrad_reason(a, b) is None:
            return a, b
    return _bf16(run, a, groups), _bf16(run, b, groups)


def _transposed_weight(run: OpRunner, w_col, shape: tuple[int, int, int]) -> torch.Tensor | tuple:
    """W_g^T per expert, a (E, K, N) transposed view of the (E, N, K) weight's values (from Q_col);
    for W1's gate and up stored apart, the pair of their transposed views (side by side along K)."""
    if isinstance(w_col, GateUp):
        return w_col.gate.transpose(1, 2), w_col.up.transpose(1, 2)
    if isinstance(w_col, tuple):
        return tuple(_bf16(run, part).view(shape).transpose(1, 2) for part in w_col)
    return _bf16(run, w_col).view(shape).transpose(1, 2)


def _stacked_rows(view: torch.Tensor, name: str) -> torch.Tensor:
    """The (E * F, H) rows of W1's gate or up view as one strided matrix (a view: no copy)."""
    if view.shape[0] > 1 and view.stride(0) != view.shape[1] * view.stride(1):
        raise ValueError(f"W1's {name} weights must be evenly spaced rows (expert stride F x row stride) to be quantized "
                         f"in place, got shape {tuple(view.shape)} and strides {view.stride()}")
    return view.reshape(-1, view.shape[2])


def _forward_weight(run: OpRunner, site: str, w: torch.Tensor | GateUp, recipe: MXFP8Recipe | None) -> tuple:
    """The (E, N, K) weight's forward operand and what the backward keeps of it: ``w`` twice, or
    the bf16 values of Q_row(W) and Q_col(W), quantized at ``site`` in one pass over the (E * N, K)
    stack (or reused: ``quantized_weight``). Q_row(W) is not kept once dequantized. W1's gate and
    up stored apart (a GateUp) are quantized apart, each as the (E * F, H) stack of its rows (a
    view: the interleaved layout's rows are 2H apart); F is a multiple of 32, so Q_col's blocks
    are the halves' blocks."""
    if recipe is None:
        return w, w
    args = dict(rowwise=True, columnwise=True, swizzle=False, scale_mode=recipe.scale_mode)
    if isinstance(w, GateUp):
        gate, up = quantized_weight(run, site, lambda: (_stacked_rows(w.gate, "gate"), _stacked_rows(w.up, "up")), **args)
        operand = GateUp(_bf16(run, gate.rowwise).view(w.shape), _bf16(run, up.rowwise).view(w.shape))
        return operand, (gate.columnwise, up.columnwise)
    quantized = quantized_weight(run, site, lambda: w.reshape(-1, w.shape[-1]), **args)
    return _bf16(run, quantized.rowwise).view(w.shape), quantized.columnwise


def grouped_mlp_forward(
    run: OpRunner, x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None,
    w1: torch.Tensor | GateUp, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
    activation: Activation, recipe: MXFP8Recipe | None, groups: DeviceGroups | None = None,
) -> tuple[torch.Tensor, LayerSaved]:
    """y (T, H) bf16 and the saved state; the arguments of ``gmlp.contract.reference.grouped_mlp_forward_ref``
    after the runner (W1 may be its gate and up views, a ``GateUp``); ``groups``: the device prefix
    sums of ``split_sizes`` when the caller has them (computed here otherwise), read by every op."""
    ffn = w2.shape[2]
    groups = groups if groups is not None else device_groups(split_sizes, x.shape[0])
    # W1 before x: its Q_row and the bf16 copy made from it (together twice W1's fp8 size) peak
    # before x's quantized forms and copy exist
    w1_fc1, w1_col = _forward_weight(run, "quantize w1", w1, recipe)
    if recipe is None:
        x_fc1, x_col = x, x
    else:
        xq = run("quantize x", x, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                 scale_mode=recipe.scale_mode, groups=groups)
        x_fc1, x_col = _a_operand(run, "fc1", xq.rowwise), xq.columnwise
        del xq  # Q_row(x) is not kept once FC1's operand is made
    fc1 = run("fc1", x_fc1, w1_fc1, split_sizes, ffn_hidden_size=ffn, activation=activation, recipe=recipe, b1=b1,
              probs=probs, groups=groups)
    del x_fc1, w1_fc1  # an MXFP8 layer's bf16 copies: freed before FC2's are made (W2 is quantized only now)
    w2_fc2, w2_col = _forward_weight(run, "quantize w2", w2, recipe)
    a_row = fc1.a if recipe is None else fc1.a_rowwise
    y = run("fc2", _a_operand(run, "fc2", a_row), w2_fc2, split_sizes, bias=b2, groups=groups)
    saved = LayerSaved(
        x_col=x_col, c=fc1.c, a_col=fc1.a if recipe is None else fc1.a_columnwise, probs=probs,
        w1_col=w1_col, w2_col=w2_col, split_sizes=split_sizes, groups=groups, has_b1=b1 is not None,
        has_b2=b2 is not None,
    )
    return y, saved


def grouped_mlp_backward(run: OpRunner, dy: torch.Tensor, saved: LayerSaved, activation: Activation,
                         recipe: MXFP8Recipe | None, weight_grad_dtype: torch.dtype = torch.float32,
                         weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> MLPGrads:
    """Gradients for dy (T, H); the arguments of ``gmlp.contract.reference.grouped_mlp_backward_ref`` after
    the runner."""
    split_sizes, groups = saved.split_sizes, saved.groups
    experts, hidden = split_sizes.numel(), dy.shape[1]
    if recipe is None:
        dy_row = dy_col = dy
    else:
        dyq = run("quantize dy", dy, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                  element_format=recipe.grad_format, scale_mode=recipe.scale_mode, groups=groups)
        dy_row, dy_col = dyq.rowwise, dyq.columnwise
        del dyq
    # operands made for one GEMM are passed as temporaries, and each quantized tensor is dropped
    # after its last GEMM (the peak is at the weight gradients, allocated last)
    dgrad = run("fc2 dgrad", _a_operand(run, "fc2 dgrad", dy_row),
                _transposed_weight(run, saved.w2_col, (experts, hidden, -1)), saved.c, split_sizes,
                activation=activation, recipe=recipe, probs=saved.probs, bias_grad=saved.has_b1, groups=groups)
    del dy_row
    dprobs, db1 = dgrad.dprobs, dgrad.db1
    dh_row, dh_col = (dgrad.dh, dgrad.dh) if recipe is None else (dgrad.dh_rowwise, dgrad.dh_columnwise)
    del dgrad
    dx = run("fc1 dgrad", _a_operand(run, "fc1 dgrad", dh_row),
             _transposed_weight(run, saved.w1_col, (experts, -1, hidden)), split_sizes, groups=groups)
    del dh_row
    dw1_out, dw2_out = weight_grad_out if weight_grad_out is not None else (None, None)  # added to in the kernel
    # each weight gradient's operands are made first, then its Q_col inputs dropped (the bf16
    # copies are what the GEMM reads), before its output is allocated
    operands = _wgrad_operands(run, "fc2 wgrad", dy_col, saved.a_col, groups)
    del dy_col
    dw2 = run("fc2 wgrad", *operands, split_sizes, out=dw2_out, out_dtype=weight_grad_dtype, groups=groups)
    del operands
    operands = _wgrad_operands(run, "fc1 wgrad", dh_col, saved.x_col, groups)
    del dh_col
    # W1's gate and up stored apart: their gradients apart, each dW1_g's gate rows and up rows
    apart = {"split_rows": saved.c.shape[1] // 2} if isinstance(saved.w1_col, (GateUp, tuple)) else {}
    dw1 = run("fc1 wgrad", *operands, split_sizes, out=dw1_out, out_dtype=weight_grad_dtype, groups=groups, **apart)
    del operands
    db2 = run("bias grad", dy, groups.row_start) if saved.has_b2 else None
    return MLPGrads(dx=dx, dprobs=dprobs, dw1=dw1, db1=db1, dw2=dw2, db2=db2)
