"""The grouped MLP's forward and backward as a sequence of ops, each on the path its plan chose.

The dataflow of docs/design.md, step for step, with no host sync on the kernel paths
("values": the bf16 values of an MXFP8 quantization, made in one pass with no fp8 tensor):

forward:  W1's rowwise values -> quantize x (rowwise for FC1, columnwise kept for FC1 wgrad) ->
          ``fc1`` (c, Q_row(a), Q_col(a)) -> W2's rowwise values -> ``fc2`` (grouped GEMM) -> y
backward: dy's rowwise values (gradient format), W2's columnwise values -> ``fc2 dgrad`` (dprobs,
          Q_row(dh), Q_col(dh)) -> W1's columnwise values -> ``fc1 dgrad`` -> dx; ``fc1 wgrad``
          dW1 = Q_col(dh)^T Q_col(x); dy's columnwise values -> ``fc2 wgrad`` dW2 = dy^T Q_col(a);
          ``bias grad`` for b2

Each op runs through an ``OpRunner``: the implementation of the site's chosen path
(``gmlp.dispatch.sites``), and, when the cross-check is on, the next path down on the same inputs
(``gmlp.debug``). The GEMMs run on bf16 (Hopper has no block-scaled MMA), on the values an
MXFP8 GEMM would multiply: a quantized tensor (x's, a's, dh's) is dequantized once, just before
the GEMM that reads it, rather than tile by tile in every tile; a tensor at hand when its GEMM
runs (the weights, dy) gives its values in one quantize-dequantize pass ("qdq" sites: the same
bits). Only quantized tensors are kept for the backward (of the weights nothing: the backward
makes W^T's values from the weights again, one pass over W, rather than keep an fp8 form), and
no bf16 operand outlives the GEMM that reads it (a weight's values are as large as its
gradient). W_g^T is read as a transposed view of W's columnwise values: no weight is copied to
be transposed. Bias gradients are fp32 per-expert sums (of dy for b2; of dh's per-tile sums
inside ``fc2 dgrad`` for b1).
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
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Tensor, MXFP8Values, QuantAxis

__all__ = ["OpRunner", "LayerSaved", "fake_layer_saved", "grouped_mlp_forward",
           "grouped_mlp_backward", "release"]

CrossCheckHook = Callable[..., None]  # (site name, chosen output, args, kwargs, inputs before the call)
# a weight site's output: a quantization (the SM100 composition's) or values (the step sequence's),
# or a pair of them for W1's gate and up stored apart
KeptWeight = MXFP8Quantized | MXFP8Values | tuple


class OpRunner:
    """Runs each site's op on the path its plan chose; ``check``, when given (the cross-check),
    sees every call and its output. ``reused_weights`` (site -> output) are the weight sites'
    outputs of an earlier forward (quantized weights, or their values), which ``quantized_weight``
    returns instead of quantizing again; with ``keep_weights`` it keeps the weight sites' outputs
    in ``kept_weights`` for later forwards."""

    def __init__(self, plan: LayerPlan, check: CrossCheckHook | None = None,
                 reused_weights: dict[str, KeptWeight] | None = None, keep_weights: bool = False):
        self.plan, self.check = plan, check
        self.reused_weights = reused_weights or {}
        self.kept_weights: dict[str, KeptWeight] | None = {} if keep_weights else None

    @property
    def caches_weights(self) -> bool:
        """Whether this forward keeps its weights' values for later ones or reuses an earlier one's
        (GroupedMLP's ``weight_cache``)."""
        return self.kept_weights is not None or bool(self.reused_weights)

    def __call__(self, site: str, *args, **kwargs):
        run = self.plan.function(site, implementation)
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
    layer that is ("qdq dy": the gradient of y)."""
    try:
        return run(*args, **kwargs)
    except (ValueError, TypeError) as error:
        if type(error) not in (ValueError, TypeError):  # a subclass may take other arguments: left as it is
            raise
        raise type(error)(f"gmlp layer, at its {site!r} op: {error}") from error


@dataclass
class LayerSaved:
    """What the forward keeps for the backward. The backward takes each saved activation out of it
    (``release``, None after) for its last reader, so that what the backward no longer needs is
    freed as it goes (the eager autograd Function lets go of its own references first)."""

    x_col: torch.Tensor | MXFP8Tensor  # (T, H) bf16, or Q_col(x)
    c: torch.Tensor  # (T, 2F | F) bf16
    a_col: torch.Tensor | MXFP8Tensor  # (T, F) bf16, or Q_col(a)
    probs: torch.Tensor | None
    # the weights themselves (the parameters, alive anyway): an MXFP8 backward makes its W^T values
    # from them again (one pass over W), rather than keeping an fp8 form as large as W's half
    w1: torch.Tensor | GateUp  # (E, 2F | F, H), or W1's gate and up views (gmlp.contract.gate_up)
    w2: torch.Tensor  # (E, H, F)
    split_sizes: torch.Tensor
    groups: DeviceGroups  # device prefix sums of split_sizes, computed once for every launcher
    has_b1: bool
    has_b2: bool
    # with a weight cache, the dgrads' W^T values made (or reused) by the forward, as the backward
    # reads them (``_weight_values``): kept for later micro-batches anyway, so made once
    w1t: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None
    w2t: torch.Tensor | None = None


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
        x_col, a_col = x, x.new_empty(tokens, ffn, dtype=unquantized)
    else:
        x_col, a_col = q_col(tokens, hidden, True), q_col(tokens, ffn, True)
    return LayerSaved(x_col=x_col, c=c, a_col=a_col, probs=probs, w1=w1, w2=w2,
                      split_sizes=split_sizes, groups=groups, has_b1=b1 is not None, has_b2=b2 is not None)


def _bf16(run: OpRunner, value: torch.Tensor | MXFP8Tensor, groups: DeviceGroups | None = None) -> torch.Tensor:
    """bf16 values of a GEMM operand: an MXFP8Tensor dequantized (source orientation), or itself.
    ``groups`` are the device prefix sums of a grouped operand's split sizes."""
    return run("dequantize", value, groups) if isinstance(value, MXFP8Tensor) else value


def _stacked_rows(view: torch.Tensor, name: str) -> torch.Tensor:
    """The (E * F, H) rows of W1's gate or up view as one strided matrix (a view: no copy)."""
    if view.shape[0] > 1 and view.stride(0) != view.shape[1] * view.stride(1):
        raise ValueError(f"W1's {name} weights must be evenly spaced rows (expert stride F x row stride) to be quantized "
                         f"in place, got shape {tuple(view.shape)} and strides {view.stride()}")
    return view.reshape(-1, view.shape[2])


def _weight_values(run: OpRunner, site: str, w: torch.Tensor | GateUp, recipe: MXFP8Recipe | None, *,
                   transposed: bool, cached: bool = True) -> torch.Tensor | GateUp | tuple:
    """A GEMM's operand from the (E, N, K) weight ``w``: the forward's B (``transposed`` False,
    shaped as ``w``) or the dgrad's W_g^T per expert (an (E, K, N) transposed view; for W1's gate
    and up stored apart, the pair of their transposed views, side by side along K). In an MXFP8
    layer, the bf16 values of W's rowwise or columnwise quantization, made at ``site`` in one pass
    over its (E * N, K) stack with no fp8 tensor written, or an earlier forward's when ``cached``
    (``quantized_weight``: the weight cache); the backward makes its own from the weight unless
    the forward saved them, so nothing of the weights is kept but the weights. W1's gate and up
    stored apart (a GateUp) are quantized apart, each as the (E * F, H) stack of its rows (a view:
    the interleaved layout's rows are 2H apart); F is a multiple of 32, so the columnwise blocks
    are the halves' blocks."""
    apart = isinstance(w, GateUp)
    if recipe is None:
        if transposed:
            return (w.gate.transpose(1, 2), w.up.transpose(1, 2)) if apart else w.transpose(1, 2)
        return w
    args = dict(rowwise=not transposed, columnwise=transposed, scale_mode=recipe.scale_mode)

    def stacks():  # built only when quantized (a reused value needs none)
        return (_stacked_rows(w.gate, "gate"), _stacked_rows(w.up, "up")) if apart else w.reshape(-1, w.shape[-1])

    result = quantized_weight(run, site, stacks, cache=cached, **args)
    parts = [getattr(part, "columnwise" if transposed else "rowwise").view(w.shape)
             for part in (result if apart else (result,))]
    if transposed:
        parts = [part.transpose(1, 2) for part in parts]
        return tuple(parts) if apart else parts[0]
    return GateUp(*parts) if apart else parts[0]


def _transposed_weight(run: OpRunner, site: str, w: torch.Tensor | GateUp, saved_values, recipe: MXFP8Recipe | None):
    """A dgrad's W^T operand: the values the forward saved (a weight cache's), else made from W now
    (not kept: the backward's runner keeps nothing for later steps)."""
    if saved_values is not None:
        return saved_values
    return _weight_values(run, site, w, recipe, transposed=True, cached=False)


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
    # W1's values before x's quantized forms exist
    w1_fc1 = _weight_values(run, "qdq w1", w1, recipe, transposed=False)
    if recipe is None:
        x_fc1, x_col = x, x
    else:
        xq = run("quantize x", x, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                 scale_mode=recipe.scale_mode, groups=groups)
        x_fc1, x_col = _bf16(run, xq.rowwise), xq.columnwise
        del xq  # Q_row(x) is not kept once FC1's operand is made
    fc1 = run("fc1", x_fc1, w1_fc1, split_sizes, ffn_hidden_size=ffn, activation=activation, recipe=recipe, b1=b1,
              probs=probs, groups=groups)
    del x_fc1, w1_fc1  # an MXFP8 layer's bf16 copies: freed before FC2's are made (W2's values only now)
    w2_fc2 = _weight_values(run, "qdq w2", w2, recipe, transposed=False)
    a_row = fc1.a if recipe is None else fc1.a_rowwise
    y = run("fc2", _bf16(run, a_row), w2_fc2, split_sizes, bias=b2, groups=groups)
    # a weight cache keeps W^T's values too (made here, after the forward's GEMMs, or reused)
    cache = recipe is not None and getattr(run, "caches_weights", False)
    saved = LayerSaved(
        x_col=x_col, c=fc1.c, a_col=fc1.a if recipe is None else fc1.a_columnwise, probs=probs,
        w1=w1, w2=w2, split_sizes=split_sizes, groups=groups, has_b1=b1 is not None,
        has_b2=b2 is not None,
        w1t=_weight_values(run, "qdq w1^T", w1, recipe, transposed=True) if cache else None,
        w2t=_weight_values(run, "qdq w2^T", w2, recipe, transposed=True) if cache else None,
    )
    return y, saved


def release(saved, name: str):
    """``saved.<name>``, taken out of ``saved`` (a ``LayerSaved`` or ``BlockwiseSaved``): the caller
    is its last reader, and it is freed once that op is done with it (a quantized tensor as soon as
    it is dequantized)."""
    value = getattr(saved, name)
    setattr(saved, name, None)
    return value


def grouped_mlp_backward(run: OpRunner, dy: torch.Tensor, saved: LayerSaved, activation: Activation,
                         recipe: MXFP8Recipe | None, weight_grad_dtype: torch.dtype = torch.float32,
                         weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> MLPGrads:
    """Gradients for dy (T, H); the arguments of ``gmlp.contract.reference.grouped_mlp_backward_ref`` after
    the runner. ``saved``'s activations (c, a's and x's) are released after their last reader
    (``release``)."""
    split_sizes, groups = saved.split_sizes, saved.groups
    # W1's gate and up stored apart: their gradients apart, each dW1_g's gate rows and up rows
    apart = {"split_rows": saved.c.shape[1] // 2} if isinstance(saved.w1, GateUp) else {}

    def dy_values(site: str, axis: str) -> torch.Tensor:  # dy's MXFP8 values, made when its GEMM runs
        if recipe is None:
            return dy
        values = run(site, dy, rowwise=axis == "rowwise", columnwise=axis == "columnwise", split_sizes=split_sizes,
                     element_format=recipe.grad_format, scale_mode=recipe.scale_mode, groups=groups)
        return getattr(values, axis)

    # operands made for one GEMM are passed as temporaries, and each saved or quantized tensor is
    # dropped after its last reader (the peak is at the weight gradients, allocated last)
    dgrad = run("fc2 dgrad", dy_values("qdq dy", "rowwise"),
                _transposed_weight(run, "qdq w2^T", saved.w2, saved.w2t, recipe), release(saved, "c"), split_sizes,
                activation=activation, recipe=recipe, probs=saved.probs, bias_grad=saved.has_b1, groups=groups)
    dprobs, db1 = dgrad.dprobs, dgrad.db1
    dh_row, dh_col = (dgrad.dh, dgrad.dh) if recipe is None else (dgrad.dh_rowwise, dgrad.dh_columnwise)
    del dgrad
    dx = run("fc1 dgrad", _bf16(run, dh_row),
             _transposed_weight(run, "qdq w1^T", saved.w1, saved.w1t, recipe), split_sizes, groups=groups)
    del dh_row
    dw1_out, dw2_out = weight_grad_out if weight_grad_out is not None else (None, None)  # added to in the kernel
    # each weight gradient's operands are made first, then its Q_col inputs dropped (the bf16
    # copies are what the GEMM reads), before its output is allocated. FC1's first: dh (and its
    # quantized forms) dies with it, so the step's peak, at the second weight gradient, holds
    # neither dh nor FC1 wgrad's operands (the larger pair: T x (2F + H) against FC2's T x (H + F))
    operands = _bf16(run, dh_col, groups), _bf16(run, release(saved, "x_col"), groups)
    del dh_col
    dw1 = run("fc1 wgrad", *operands, split_sizes, out=dw1_out, out_dtype=weight_grad_dtype, groups=groups, **apart)
    del operands
    operands = _bf16(run, dy_values("qdq dy^T", "columnwise"), groups), _bf16(run, release(saved, "a_col"), groups)
    dw2 = run("fc2 wgrad", *operands, split_sizes, out=dw2_out, out_dtype=weight_grad_dtype, groups=groups)
    del operands
    db2 = run("bias grad", dy, groups.row_start) if saved.has_b2 else None
    return MLPGrads(dx=dx, dprobs=dprobs, dw1=dw1, db1=db1, dw2=dw2, db2=db2)
