"""The grouped MLP's forward and backward under the FP8 blockwise recipe, as a sequence of ops,
each on the path its plan chose (``gmlp.layer.steps.OpRunner``; sites ``BLOCKWISE_SITES``).

The dataflow of docs/design.md with every GEMM on fp8 operands, the scales promoted every 128 of
K (``gmlp.fp8_blockwise``), and no host sync on the kernel paths:

forward:  W1 in 128 x 128 tiles -> x both ways (1 x 128 for FC1, 128 x 1 kept for FC1 wgrad) ->
          ``fc1`` (c, Q_row(a), Q_col(a)) -> W2 in tiles -> ``fc2`` (+ b2) -> y
backward: dy both ways (gradient format) -> W2^T's tiles -> ``fc2 dgrad`` (dprobs, Q_row(dh),
          Q_col(dh), db1) -> W1^T's tiles -> ``fc1 dgrad`` -> dx;
          ``fc1 wgrad`` dW1 = Q_col(dh)^T Q_col(x); ``fc2 wgrad`` dW2 = Q_col(dy)^T Q_col(a);
          ``bias grad`` for b2

The backward keeps fp8 only: Q_col(x), Q_col(a) and c (bf16, as every recipe); nothing of the
weights but the weights: the dgrads' W^T tiles are quantized from W in the backward, written
transposed (bit for bit the forward's tiles transposed: a tile's amax is its transpose's), one
pass over W instead of keeping its fp8 tiles from the forward to the backward and copying them
transposed. Each saved tensor is released after its last reader.

With a weight cache (GroupedMLP's ``weight_cache``: micro-batches sharing their weights) the
forward's weight sites write both orientations from one read of W ("update"), or take the kept
pair ("reuse"); the forward reads W's tiles, and W^T's, kept for the later micro-batches anyway,
are saved for this backward, which then quantizes no weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.gate_up import GateUp
from gmlp.contract.outputs import MLPGrads
from gmlp.contract.weight_reuse import quantized_weight
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.fp8_blockwise.tensor import BlockShape, FP8BlockwiseTensor, FP8BlockwiseWeightPair
from gmlp.layer.steps import OpRunner, release
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["BlockwiseSaved", "blockwise_forward", "blockwise_backward", "fake_blockwise_saved"]


@dataclass
class BlockwiseSaved:
    """What the blockwise forward keeps for the backward (each taken out by its last reader)."""

    x_col: FP8BlockwiseTensor  # Q_col(x), 128 x 1 blocks
    c: torch.Tensor  # (T, 2F | F) bf16
    a_col: FP8BlockwiseTensor  # Q_col(a)
    probs: torch.Tensor | None
    w1: torch.Tensor | GateUp  # W1 (E, 2F | F, H) as the layer was given it (the dgrad's tiles are made from it)
    w2: torch.Tensor  # W2 (E, H, F)
    split_sizes: torch.Tensor
    groups: DeviceGroups
    has_b1: bool
    has_b2: bool
    w1_apart: bool = False  # W1's gate and up stored apart: dW1 returned as the pair of their gradients
    # with a weight cache, the dgrads' W^T tiles made (or reused) by the forward with W's, in one pass
    w1t: FP8BlockwiseTensor | None = None
    w2t: FP8BlockwiseTensor | None = None


def _stacked(halves: list[FP8BlockwiseTensor], dim: int) -> FP8BlockwiseTensor:
    """W1's gate and up tiles, quantized apart, stacked along ``dim`` (N: 1 for W1's tiles, 2 for
    W1^T's): F is a multiple of 128, so no tile holds both halves, and the stack is bit for bit
    the quantization of the (E, 2F, H) [gate; up] tensor."""
    gate, up = halves
    return FP8BlockwiseTensor(torch.cat([gate.data, up.data], dim), torch.cat([gate.scale_inv, up.scale_inv], dim),
                              BlockShape.TILE, gate.element_format, gate.power_of_two)


def _weight_tiles(run: OpRunner, site: str, w: torch.Tensor | GateUp, pow2: bool, *, transposed: bool = False,
                  both_orientations: bool = False,
                  cache: bool = True) -> FP8BlockwiseTensor | FP8BlockwiseWeightPair:
    """A weight's 128 x 128 tiles, or an earlier forward's (``quantized_weight``: GroupedMLP's
    ``weight_cache``; with ``cache`` False neither kept nor reused); ``transposed``: W^T's
    (..., K, N); ``both_orientations``: the pair of both from one read of W. W1's gate and up
    stored apart (a ``GateUp``) are quantized apart and their tiles stacked into one (E, 2F, H)
    tensor, [gate; up] halves (transposed: (E, H, 2F), [gate^T, up^T]), once: the stack is what
    is kept (an interleaved layout's strided views are copied to be read)."""
    def stacks():
        return tuple(part.contiguous() for part in (w.gate, w.up)) if isinstance(w, GateUp) else w

    def combine(halves: tuple) -> FP8BlockwiseTensor | FP8BlockwiseWeightPair:
        if both_orientations:
            return FP8BlockwiseWeightPair(_stacked([half.tiles for half in halves], 1),
                                          _stacked([half.transposed for half in halves], 2))
        return _stacked(list(halves), 2 if transposed else 1)

    return quantized_weight(run, site, stacks, cache=cache, combine=combine, element_format=ElementFormat.E4M3,
                            power_of_two=pow2, transposed=transposed, both_orientations=both_orientations)


def _forward_tiles(run: OpRunner, site: str, w: torch.Tensor | GateUp,
                   pow2: bool) -> tuple[FP8BlockwiseTensor, FP8BlockwiseTensor | None]:
    """(W's tiles for the forward's GEMM, W^T's for the backward's or None): with a weight cache
    both from one pass (or the kept pair), else W's alone (the backward makes W^T's itself)."""
    if not run.caches_weights:
        return _weight_tiles(run, site, w, pow2), None
    pair = _weight_tiles(run, site, w, pow2, both_orientations=True)
    return pair.tiles, pair.transposed


def _transposed_tiles(run: OpRunner, site: str, saved: BlockwiseSaved, weight: str, pow2: bool) -> FP8BlockwiseTensor:
    """A dgrad's W^T tiles (``weight``: "w1" or "w2"): those the forward saved (a weight cache's),
    else made from W now (not kept: the backward's runner keeps nothing for later steps)."""
    kept, w = release(saved, f"{weight}t"), release(saved, weight)
    return kept if kept is not None else _weight_tiles(run, site, w, pow2, transposed=True, cache=False)


def _add_dw1(dw1: torch.Tensor, into: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None, apart: bool):
    """dW1 as the layer returns it: (gate, up) halves for W1 stored apart, or added into a pair of
    main_grads (the kernel adds into one (E, 2F, H) tensor only)."""
    if isinstance(into, tuple):
        for target, half in zip(into, dw1.chunk(2, dim=1)):
            target.add_(half)
        return into
    return tuple(dw1.chunk(2, dim=1)) if apart else dw1


def blockwise_forward(run: OpRunner, x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None,
                      w1: torch.Tensor | GateUp, b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
                      activation: Activation, recipe: FP8BlockwiseRecipe,
                      groups: DeviceGroups | None = None) -> tuple[torch.Tensor, BlockwiseSaved]:
    """y (T, H) bf16 and the saved state; W1 one (E, 2F | F, H) tensor, or its gate and up (a
    ``GateUp``, ``gmlp.contract.gate_up``)."""
    ffn, pow2 = w2.shape[2], recipe.power_of_two_scales
    groups = groups if groups is not None else device_groups(split_sizes, x.shape[0])
    w1q, w1t = _forward_tiles(run, "quantize w1", w1, pow2)
    xq = run("quantize x", x, rowwise=True, columnwise=True, split_sizes=split_sizes,
             element_format=ElementFormat.E4M3, power_of_two=pow2, groups=groups)
    fc1 = run("fc1", xq.rowwise, w1q, split_sizes, ffn_hidden_size=ffn, activation=activation, b1=b1, probs=probs,
              power_of_two=pow2, groups=groups)
    x_col = xq.columnwise
    del xq, w1q  # Q_row(x) and W1's tiles: FC1's only
    w2q, w2t = _forward_tiles(run, "quantize w2", w2, pow2)
    y = run("fc2", fc1.a_rowwise, w2q, split_sizes, bias=b2, groups=groups)
    saved = BlockwiseSaved(x_col=x_col, c=fc1.c, a_col=fc1.a_columnwise, probs=probs, w1=w1, w2=w2,
                           split_sizes=split_sizes, groups=groups, has_b1=b1 is not None, has_b2=b2 is not None,
                           w1_apart=isinstance(w1, GateUp), w1t=w1t, w2t=w2t)
    return y, saved


def blockwise_backward(run: OpRunner, dy: torch.Tensor, saved: BlockwiseSaved, activation: Activation,
                       recipe: FP8BlockwiseRecipe, weight_grad_dtype: torch.dtype = torch.float32,
                       weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> MLPGrads:
    """Gradients for dy (T, H); ``weight_grad_out``: the fp32 (dW1, dW2) to add into (main_grad;
    dW1 a pair for W1's gate and up stored apart)."""
    split_sizes, groups, pow2 = saved.split_sizes, saved.groups, recipe.power_of_two_scales
    dyq = run("quantize dy", dy, rowwise=True, columnwise=True, split_sizes=split_sizes,
              element_format=recipe.grad_format, power_of_two=pow2, groups=groups)
    w2t = _transposed_tiles(run, "quantize w2^T", saved, "w2", pow2)
    dgrad = run("fc2 dgrad", dyq.rowwise, w2t, release(saved, "c"), split_sizes,
                activation=activation, grad_format=recipe.grad_format, probs=saved.probs, bias_grad=saved.has_b1,
                power_of_two=pow2, groups=groups)
    # each operand dropped once its last GEMM has read it (Q_row(dy), W2^T, Q_row(dh), W1^T)
    dy_col, dprobs, db1, dh_row, dh_col = (dyq.columnwise, dgrad.dprobs, dgrad.db1, dgrad.dh_rowwise,
                                           dgrad.dh_columnwise)
    del dyq, dgrad, w2t
    w1t = _transposed_tiles(run, "quantize w1^T", saved, "w1", pow2)
    dx = run("fc1 dgrad", dh_row, w1t, split_sizes, groups=groups)
    del dh_row, w1t
    dw1_out, dw2_out = weight_grad_out if weight_grad_out is not None else (None, None)
    dw1 = run("fc1 wgrad", dh_col, release(saved, "x_col"), split_sizes,
              out=None if isinstance(dw1_out, tuple) else dw1_out,
              out_dtype=torch.float32 if isinstance(dw1_out, tuple) else weight_grad_dtype, groups=groups)
    dw1 = _add_dw1(dw1, dw1_out, saved.w1_apart)
    del dh_col
    dw2 = run("fc2 wgrad", dy_col, release(saved, "a_col"), split_sizes, out=dw2_out, out_dtype=weight_grad_dtype,
              groups=groups)
    db2 = run("bias grad", dy, groups.row_start) if saved.has_b2 else None
    return MLPGrads(dx=dx, dprobs=dprobs, dw1=dw1, db1=db1, dw2=dw2, db2=db2)


def fake_blockwise_saved(x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None,
                         w1: torch.Tensor | GateUp,
                         b1: torch.Tensor | None, w2: torch.Tensor, b2: torch.Tensor | None,
                         recipe: FP8BlockwiseRecipe) -> BlockwiseSaved:
    """What ``blockwise_forward`` saves, as new empty tensors of the same shapes, dtypes and strides
    (every buffer is sized from host-known bounds; the weights are the inputs themselves): the
    state of a traced forward."""
    tokens, experts, hidden, ffn = x.shape[0], w2.shape[0], w2.shape[1], w2.shape[2]
    fp8, pow2 = ElementFormat.E4M3, recipe.power_of_two_scales
    groups = DeviceGroups(*(split_sizes.new_empty(experts + 1, dtype=torch.int32) for _ in range(3)),
                          split_sizes.new_empty((), dtype=torch.bool), checked=True)

    def q_col(cols: int) -> FP8BlockwiseTensor:  # Q_col of a (T, cols) token operand
        return FP8BlockwiseTensor(x.new_empty(layout.columnwise_data_shape(tokens, cols, experts),
                                              dtype=fp8.torch_dtype),
                                  x.new_empty(layout.columnwise_scale_shape(tokens, cols, experts), dtype=torch.float32),
                                  BlockShape.COLUMNWISE, fp8, pow2, split_sizes, tokens)

    apart = isinstance(w1, GateUp)
    w1_rows = 2 * ffn if apart else w1.shape[1]
    return BlockwiseSaved(x_col=q_col(hidden), c=x.new_empty(tokens, w1_rows, dtype=torch.bfloat16),
                          a_col=q_col(ffn), probs=probs, w1=w1, w2=w2,
                          split_sizes=split_sizes, groups=groups, has_b1=b1 is not None, has_b2=b2 is not None,
                          w1_apart=apart)
