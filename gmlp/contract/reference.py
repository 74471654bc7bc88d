"""The oracle of the grouped MLP: the dataflow of docs/design.md, step for step, in plain PyTorch.

Quantization happens exactly where the fused kernels quantize (``Q_row`` along a matrix's last
dimension, ``Q_col`` along its first, per expert for activations), through the bit-exact spec;
the GEMMs run on the dequantized values with float64 accumulation, rounded to float32 where the
dataflow keeps float32. It runs on any device and syncs freely (it reads split sizes on the
host): it is the reference every backend is tested against, not a fast path.

Forward, for each expert g (rows s_g of x; GLU: FC1 has 2F outputs)::

    h = Q_row(x) @ Q_row(W1_g)^T (+ b1)           fp32; c = bf16(h) saved
    a = act(h) * probs                             fp32; Q_row(a), Q_col(a)
    y = Q_row(a) @ Q_row(W2_g)^T (+ b2)            -> bf16

Backward, given dy::

    da = Q_row(dy) @ Q_col(W2_g)                   fp32
    dprobs = sum_f(da * act(c)); dh = act'(c) applied to da * probs; Q_row(dh), Q_col(dh)
    dx = Q_row(dh) @ Q_col(W1_g)                   -> bf16
    dW2_g = Q_col(dy)^T @ Q_col(a); dW1_g = Q_col(dh)^T @ Q_col(x)   fp32
    db2 = sum(dy), db1 = sum(dh)                   fp32

With ``recipe=None`` the same flow runs in bf16: every ``Q`` becomes a round to bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.gate_up import GateUp
from gmlp.contract.outputs import FC1Output, FC2DgradOutput, MLPGrads
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat
from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis

__all__ = ["ForwardSaved", "fc1_forward_ref", "fc2_dgrad_ref", "expert_matrices", "grouped_gemm_ref", "grouped_wgrad_ref", "segment_sum_ref", "unquantized_mlp_fp64", "grouped_mlp_forward_ref", "grouped_mlp_backward_ref"]

ACCUMULATE = torch.float64  # accumulation of the oracle's GEMMs


@dataclass
class ForwardSaved:
    """What the forward keeps for the backward (dequantized operands, in float32)."""

    x_col: torch.Tensor  # (T, H) Q_col(x)
    c: torch.Tensor  # (T, 2F | F) bf16(h)
    a_col: torch.Tensor  # (T, F) Q_col(a)
    probs: torch.Tensor | None  # (T,)
    w1_col: torch.Tensor  # (E, 2F | F, H) Q_col(W1): blocks along FC1's outputs
    w2_col: torch.Tensor  # (E, H, F) Q_col(W2): blocks along H
    split_sizes: list[int]
    has_b1: bool
    has_b2: bool


class _Quantizer:
    """The dataflow's Q_row / Q_col for one recipe: quantize by the spec, return fp32 values."""

    def __init__(self, recipe: MXFP8Recipe | None):
        self.recipe = recipe

    def row(self, t: torch.Tensor, element_format: ElementFormat = ElementFormat.E4M3) -> torch.Tensor:
        if self.recipe is None:
            return t.to(torch.bfloat16).float()
        return quantize_mxfp8_ref(t.float().contiguous(), rowwise=True, swizzle=False, element_format=element_format,
                                  scale_mode=self.recipe.scale_mode).rowwise.dequantize()

    def col(self, t: torch.Tensor, split_sizes: torch.Tensor | None,
            element_format: ElementFormat = ElementFormat.E4M3) -> torch.Tensor:
        if self.recipe is None:
            return t.to(torch.bfloat16).float()
        return quantize_mxfp8_ref(t.float().contiguous(), rowwise=False, columnwise=True, swizzle=False,
                                  split_sizes=split_sizes, element_format=element_format,
                                  scale_mode=self.recipe.scale_mode).columnwise.dequantize()

    @property
    def grad_format(self) -> ElementFormat:
        return self.recipe.grad_format if self.recipe is not None else ElementFormat.E4M3


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated in float64, rounded to the operands' working precision (float32, or
    float64 for float64 operands)."""
    return (a.to(ACCUMULATE) @ b.to(ACCUMULATE)).to(torch.promote_types(a.dtype, b.dtype))


def _working(t: torch.Tensor | MXFP8Tensor) -> torch.dtype:
    """The precision the twins compute an operand's products in: float64 for a float64 tensor
    (an unquantized float64 layer, e.g. under gradcheck), else float32."""
    return torch.float64 if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else torch.float32


def _values(t: torch.Tensor | MXFP8Tensor) -> torch.Tensor:
    """An operand's values in its working precision (an MXFP8Tensor dequantized)."""
    return t.dequantize() if isinstance(t, MXFP8Tensor) else t.to(_working(t))


def _segments(split_sizes: list[int]):
    start = 0
    for g, rows in enumerate(split_sizes):
        yield g, slice(start, start + rows)
        start += rows


def _grouped_products(a_values: torch.Tensor, b_values: torch.Tensor, bias: torch.Tensor | None,
                      sizes: list[int]) -> torch.Tensor:
    """Per expert a_g @ B_g^T (+ bias_g) from the operands' (dequantized) values, in their promoted
    working precision (fp32, fp64 for fp64 operands): FC1's h, and every grouped GEMM."""
    dtype = torch.promote_types(a_values.dtype, b_values.dtype)
    out = torch.empty(a_values.shape[0], b_values.shape[1], dtype=dtype, device=a_values.device)
    for g, rows in _segments(sizes):
        out[rows] = _matmul(a_values[rows], b_values[g].t())
        if bias is not None:
            out[rows] += bias[g].to(dtype)
    return out


def _fc1_a(h: torch.Tensor, probs: torch.Tensor | None, activation: Activation) -> torch.Tensor:
    a = activation.forward(h)
    return a if probs is None else a * probs.to(a.dtype)[:, None]


def fc1_forward_ref(
    x: torch.Tensor | MXFP8Tensor,  # (T, H) bf16, or Q_row(x)
    w1: torch.Tensor | MXFP8Tensor | GateUp,  # W1_g (N1, H) per expert, any form of ``expert_matrices``
    split_sizes: torch.Tensor,
    *,
    ffn_hidden_size: int,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    b1: torch.Tensor | None = None,
    probs: torch.Tensor | None = None,
) -> FC1Output:
    """The FC1 step (dataflow steps 2-3) on given operands; twin of ``gmlp.triton_ref.fc1.fc1_forward``."""
    sizes = [int(m) for m in split_sizes.tolist()]
    w1_values = expert_matrices(w1, len(sizes))
    h = _grouped_products(_values(x), w1_values, b1, sizes)
    a = _fc1_a(h, probs, activation)
    if recipe is None:  # unquantized: c and a in x's dtype (bf16 on the Triton path)
        return FC1Output(c=h.to(x.dtype), a=a.to(x.dtype), a_rowwise=None, a_columnwise=None)
    q = quantize_mxfp8_ref(a, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                           scale_mode=recipe.scale_mode)
    return FC1Output(c=h.to(torch.bfloat16), a=None, a_rowwise=q.rowwise, a_columnwise=q.columnwise)


def fc2_dgrad_ref(
    dy: torch.Tensor | MXFP8Tensor,  # (T, H) bf16, or Q_row(dy) in the gradient format
    w2t: torch.Tensor | MXFP8Tensor,  # W2_g^T (F, H) per expert, any form of ``expert_matrices`` (Q_col(W2) read as such)
    c: torch.Tensor,  # (T, 2F | F) bf16 saved pre-activation
    split_sizes: torch.Tensor,
    *,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    probs: torch.Tensor | None = None,
    bias_grad: bool = False,
) -> FC2DgradOutput:
    """Dataflow steps 5-6 on given operands; twin of ``gmlp.triton_ref.fc2_dgrad.fc2_dgrad``."""
    da = grouped_gemm_ref(dy, w2t, split_sizes, out_dtype=_working(dy))
    c = c.to(da.dtype)
    dprobs = None
    if probs is not None:
        dprobs = (da.to(ACCUMULATE) * activation.forward(c).to(ACCUMULATE)).sum(-1).to(da.dtype)
        da = da * probs.to(da.dtype)[:, None]
    dh = activation.backward(c, da)
    db1 = None
    if bias_grad:
        db1 = torch.stack([dh[rows].to(ACCUMULATE).sum(0).to(dh.dtype) for _, rows in _segments(split_sizes.tolist())])
    if recipe is None:  # unquantized: dh in dy's dtype (bf16 on the Triton path)
        return FC2DgradOutput(dprobs=dprobs, dh=dh.to(dy.dtype), dh_rowwise=None, dh_columnwise=None, db1=db1)
    q = quantize_mxfp8_ref(dh, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                           element_format=recipe.grad_format, scale_mode=recipe.scale_mode)
    return FC2DgradOutput(dprobs=dprobs, dh=None, dh_rowwise=q.rowwise, dh_columnwise=q.columnwise, db1=db1)


def expert_matrices(b: torch.Tensor | MXFP8Tensor | GateUp | tuple, experts: int) -> torch.Tensor:
    """(E, N, K) fp32 values of per-expert matrices B_g given as: bf16 (E, N, K) (any strides); a
    rowwise MXFP8Tensor of the (E * N, K) stack; or a columnwise MXFP8Tensor of an (E * K, N)
    stack S, meaning B_g = S_g^T (Q_col of a weight, read by the backward GEMMs). The forms that
    ``gmlp.contract.operands.expert_operand`` accepts; and W1 as its gate and up (a ``GateUp``:
    B_g = [gate_g; up_g]) or a pair of operands side by side along K (B_g = [B_g | B2_g])."""
    if isinstance(b, GateUp):
        return torch.cat([_values(b.gate), _values(b.up)], 1)
    if isinstance(b, tuple):
        return torch.cat([expert_matrices(part, experts) for part in b], 2)
    if not isinstance(b, MXFP8Tensor):
        return _values(b)
    values = b.dequantize()
    stacked = values.reshape(experts, -1, values.shape[1])
    return stacked if b.axis is QuantAxis.ROWWISE else stacked.transpose(1, 2)


def grouped_gemm_ref(
    a: torch.Tensor | MXFP8Tensor,  # (T, K)
    b: torch.Tensor | MXFP8Tensor | tuple,  # B_g (N, K) per expert, any form of ``expert_matrices``
    split_sizes: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,  # (E, N)
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """(T, N) = per expert a @ b_g^T (+ bias), fp32 (fp64 for fp64 operands) rounded to
    out_dtype, by default a's dtype (bf16 for an MXFP8 a); twin of ``gmlp.triton_ref.grouped_gemm``."""
    sizes = [int(m) for m in split_sizes.tolist()]
    out = _grouped_products(_values(a), expert_matrices(b, len(sizes)), bias, sizes)
    if out_dtype is None:
        out_dtype = a.dtype if isinstance(a, torch.Tensor) else torch.bfloat16
    return out.to(out_dtype)


def grouped_wgrad_ref(
    a: torch.Tensor | MXFP8Tensor,  # (T, M) bf16, or Q_col
    b: torch.Tensor | MXFP8Tensor,  # (T, N) bf16, or Q_col
    split_sizes: torch.Tensor,
    *,
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,  # fp32 to add the result to (main_grad)
    out_dtype: torch.dtype = torch.float32,
    split_rows: int | None = None,  # rows [0, split_rows) of each dW_g and the rest as two tensors
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(E, M, N), dW_g = A_g^T @ B_g over expert g's tokens, fp32 sums stored as ``out_dtype`` or
    added to ``out`` (a pair with ``split_rows``); twin of ``gmlp.triton_ref.wgrad.grouped_wgrad``."""
    sizes = [int(m) for m in split_sizes.tolist()]
    a_values, b_values = _values(a), _values(b)
    dtype = torch.promote_types(a_values.dtype, b_values.dtype)
    result = torch.zeros(len(sizes), a_values.shape[1], b_values.shape[1], dtype=dtype, device=a_values.device)
    for g, rows in _segments(sizes):
        result[g] = _matmul(a_values[rows].t(), b_values[rows])
    if split_rows is None:
        return out.add_(result) if out is not None else result.to(out_dtype)
    parts = result[:, :split_rows], result[:, split_rows:]
    if out is not None:
        return tuple(target.add_(part) for target, part in zip(out, parts))
    return tuple(part.to(out_dtype).contiguous() for part in parts)


def segment_sum_ref(values: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """(G, N) sums of the rows [starts[g], starts[g+1]) of values, accumulated in fp64 and returned in
    fp32 (fp64 for fp64 values); twin of ``gmlp.triton_ref.segment_sum`` (the bias gradients)."""
    bounds = starts.tolist()
    sums = torch.stack([values[bounds[g]:bounds[g + 1]].double().sum(0) for g in range(len(bounds) - 1)])
    return sums if values.dtype == torch.float64 else sums.float()


def unquantized_mlp_fp64(x, split_sizes, probs, w1, b1, w2, b2, activation: Activation):
    """The exact layer: no quantization, float64, differentiable by autograd.

    Returns (y, leaves): y (T, H) float64 and the float64 leaf copies of (x, probs, w1, b1, w2,
    b2) (None where an input is None), whose ``.grad`` autograd fills on ``y.backward``. The
    yardstick tests and the demo measure the quantized dataflow's error against.
    """
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, probs, w1, b1, w2, b2)]
    x64, probs64, w1_64, b1_64, w2_64, b2_64 = leaves
    outputs = []
    for g, rows in _segments([int(m) for m in split_sizes.tolist()]):
        h = x64[rows] @ w1_64[g].t() + (b1_64[g] if b1_64 is not None else 0)
        a = activation.forward(h)
        if probs64 is not None:
            a = a * probs64[rows, None]
        outputs.append(a @ w2_64[g].t() + (b2_64[g] if b2_64 is not None else 0))
    return torch.cat(outputs), leaves


def grouped_mlp_forward_ref(
    x: torch.Tensor,  # (T, H) bf16, rows grouped by expert
    split_sizes: torch.Tensor,  # (E,) int
    probs: torch.Tensor | None,  # (T,)
    w1: torch.Tensor,  # (E, 2F | F, H)
    b1: torch.Tensor | None,  # (E, 2F | F)
    w2: torch.Tensor,  # (E, H, F)
    b2: torch.Tensor | None,  # (E, H)
    activation: Activation,
    recipe: MXFP8Recipe | None,
) -> tuple[torch.Tensor, ForwardSaved]:
    """y (T, H) bf16 and what the backward needs."""
    q = _Quantizer(recipe)
    sizes = [int(m) for m in split_sizes.tolist()]
    tokens, hidden = x.shape
    h = _grouped_products(q.row(x), torch.stack([q.row(w1[g]) for g in range(len(sizes))]), b1, sizes)
    a = _fc1_a(h, probs, activation)
    a_row = q.row(a)
    y = torch.empty(tokens, hidden, dtype=torch.float32, device=x.device)
    for g, rows in _segments(sizes):
        y[rows] = _matmul(a_row[rows], q.row(w2[g]).t())
        if b2 is not None:
            y[rows] += b2[g].float()
    saved = ForwardSaved(
        x_col=q.col(x, split_sizes), c=h.to(torch.bfloat16), a_col=q.col(a, split_sizes),
        probs=None if probs is None else probs.float(),
        w1_col=torch.stack([q.col(w1[g], None) for g in range(len(sizes))]),
        w2_col=torch.stack([q.col(w2[g], None) for g in range(len(sizes))]),
        split_sizes=sizes, has_b1=b1 is not None, has_b2=b2 is not None,
    )
    return y.to(torch.bfloat16), saved


def grouped_mlp_backward_ref(dy: torch.Tensor, saved: ForwardSaved, activation: Activation,
                             recipe: MXFP8Recipe | None, weight_grad_dtype: torch.dtype = torch.float32,
                             weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> MLPGrads:
    """Gradients for dy (T, H), from the forward's saved state. Weight gradients are fp32 sums
    stored as ``weight_grad_dtype``, or, given ``weight_grad_out`` (fp32 tensors shaped like W1
    and W2, e.g. main_grad), added to those, which are then returned as dw1 and dw2."""
    q = _Quantizer(recipe)
    sizes = saved.split_sizes
    split_sizes = torch.tensor(sizes, device=dy.device)
    experts = len(sizes)
    dy_row = q.row(dy, q.grad_format)
    da = torch.empty(dy.shape[0], saved.w2_col.shape[2], dtype=torch.float32, device=dy.device)
    for g, rows in _segments(sizes):
        da[rows] = _matmul(dy_row[rows], saved.w2_col[g])
    c = saved.c.float()
    dprobs = None
    if saved.probs is not None:
        dprobs = (da.to(ACCUMULATE) * activation.forward(c).to(ACCUMULATE)).sum(-1).float()
        da = da * saved.probs[:, None]
    dh = activation.backward(c, da)
    dh_row = q.row(dh, q.grad_format)
    dh_col = q.col(dh, split_sizes, q.grad_format)
    dy_col = q.col(dy, split_sizes, q.grad_format)
    dx = torch.empty(dy.shape[0], saved.w1_col.shape[2], dtype=torch.float32, device=dy.device)
    dw1 = torch.zeros_like(saved.w1_col)
    dw2 = torch.zeros_like(saved.w2_col)
    db1 = torch.zeros(experts, saved.w1_col.shape[1], device=dy.device) if saved.has_b1 else None
    db2 = torch.zeros(experts, saved.w2_col.shape[1], device=dy.device) if saved.has_b2 else None
    for g, rows in _segments(sizes):
        dx[rows] = _matmul(dh_row[rows], saved.w1_col[g])
        dw2[g] = _matmul(dy_col[rows].t(), saved.a_col[rows])
        dw1[g] = _matmul(dh_col[rows].t(), saved.x_col[rows])
        if db1 is not None:
            db1[g] = dh[rows].to(ACCUMULATE).sum(0).float()
        if db2 is not None:
            db2[g] = dy[rows].to(ACCUMULATE).sum(0).float()
    if weight_grad_out is not None:
        dw1, dw2 = weight_grad_out[0].add_(dw1), weight_grad_out[1].add_(dw2)
    return MLPGrads(dx=dx.to(torch.bfloat16), dprobs=dprobs, dw1=dw1.to(weight_grad_dtype), db1=db1,
                    dw2=dw2.to(weight_grad_dtype), db2=db2)
