"""The grouped MLP's forward and backward on the Triton kernels (DESIGN.md dataflow, no host sync).

Same interface and saved state shape as the oracle (``gmlp.mlp_ref.grouped_mlp_forward_ref`` /
``grouped_mlp_backward_ref``), step for step:

forward:  quantize x (rowwise for FC1, columnwise kept for FC1 wgrad) -> ``fc1_forward`` (c, Q_row(a),
          Q_col(a)) -> ``grouped_gemm`` with Q_row(W2) -> y
backward: quantize dy (both ways, gradient format) -> ``fc2_dgrad`` with Q_col(W2) (dprobs,
          Q_row(dh), Q_col(dh)) -> ``grouped_gemm`` with Q_col(W1) -> dx; ``grouped_wgrad`` for
          dW2 = Q_col(dy)^T Q_col(a) and dW1 = Q_col(dh)^T Q_col(x)

MXFP8 operands are dequantized to bf16 once, just before the GEMM that reads them
(``dequantize``), and the GEMMs run on bf16: the same values the GEMMs would dequantize tile by
tile as they load them, without repeating that work in every tile that reads an operand. Only
the quantized tensors are kept for the backward. Each weight is quantized once per forward,
rowwise and columnwise in one pass over its (E * N, K) stack: Q_row(W) for the forward GEMM,
Q_col(W) for the backward one, which reads W_g^T as a transposed view of its dequantized values
(in bf16, of the weight itself). No weight is copied to be transposed. Bias gradients are fp32
per-expert sums (``segment_sum``: of dy for b2; of dh's per-tile sums from ``fc2_dgrad`` for b1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.activations import Activation
from gmlp.groups import DeviceGroups, device_groups
from gmlp.mlp_ref import MLPGrads
from gmlp.quantized import MXFP8Tensor
from gmlp.recipe import MXFP8Recipe
from gmlp.triton_ref.dequantize import dequantize_mxfp8
from gmlp.triton_ref.fc1 import fc1_forward
from gmlp.triton_ref.fc2_dgrad import fc2_dgrad
from gmlp.triton_ref.grouped_gemm import grouped_gemm
from gmlp.triton_ref.quantize import WEIGHT_QUANTIZE_CONFIG, quantize_mxfp8
from gmlp.triton_ref.segment_sum import segment_sum
from gmlp.triton_ref.wgrad import grouped_wgrad

__all__ = ["TritonSaved", "grouped_mlp_forward_triton", "grouped_mlp_backward_triton"]


@dataclass
class TritonSaved:
    """What the Triton forward keeps for the backward."""

    x_col: torch.Tensor | MXFP8Tensor  # (T, H) bf16, or Q_col(x)
    c: torch.Tensor  # (T, 2F | F) bf16
    a_col: torch.Tensor | MXFP8Tensor  # (T, F) bf16, or Q_col(a)
    probs: torch.Tensor | None
    w1_col: torch.Tensor | MXFP8Tensor  # (E, 2F | F, H) W1 (bf16), or Q_col(W1) of its (E * N1, H) stack
    w2_col: torch.Tensor | MXFP8Tensor  # (E, H, F) W2 (bf16), or Q_col(W2)
    split_sizes: torch.Tensor
    groups: DeviceGroups  # device prefix sums of split_sizes, computed once for every launcher
    has_b1: bool
    has_b2: bool


def _bf16(value: torch.Tensor | MXFP8Tensor, groups: DeviceGroups | None = None) -> torch.Tensor:
    """bf16 values of a GEMM operand: an MXFP8Tensor dequantized (source orientation), or itself.
    ``groups`` are the device prefix sums of a grouped operand's split sizes."""
    return dequantize_mxfp8(value, groups) if isinstance(value, MXFP8Tensor) else value


def _transposed_weight(w_col: torch.Tensor | MXFP8Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """W_g^T per expert, a (E, K, N) transposed view of the (E, N, K) weight's values (from Q_col)."""
    return _bf16(w_col).view(shape).transpose(1, 2)


def grouped_mlp_forward_triton(
    x: torch.Tensor, split_sizes: torch.Tensor, probs: torch.Tensor | None, w1: torch.Tensor, b1: torch.Tensor | None,
    w2: torch.Tensor, b2: torch.Tensor | None, activation: Activation, recipe: MXFP8Recipe | None,
) -> tuple[torch.Tensor, TritonSaved]:
    """y (T, H) bf16 and the saved state; same arguments as ``grouped_mlp_forward_ref``."""
    ffn = w2.shape[2]
    groups = device_groups(split_sizes, x.shape[0])
    if recipe is None:
        x_row = x_col = x
        w1_row, w1_col, w2_row, w2_col = w1, w1, w2, w2
    else:
        xq = quantize_mxfp8(x, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                            scale_mode=recipe.scale_mode)
        x_row, x_col = xq.rowwise, xq.columnwise
        w1q, w2q = (quantize_mxfp8(w.reshape(-1, w.shape[-1]), rowwise=True, columnwise=True, swizzle=False,
                                   scale_mode=recipe.scale_mode, config=WEIGHT_QUANTIZE_CONFIG) for w in (w1, w2))
        w1_row, w1_col, w2_row, w2_col = w1q.rowwise, w1q.columnwise, w2q.rowwise, w2q.columnwise
    fc1 = fc1_forward(_bf16(x_row), _bf16(w1_row).view(w1.shape), split_sizes, ffn_hidden_size=ffn,
                      activation=activation, recipe=recipe, b1=b1, probs=probs, groups=groups)
    a_row = fc1.a if recipe is None else fc1.a_rowwise
    y = grouped_gemm(_bf16(a_row), _bf16(w2_row).view(w2.shape), split_sizes, bias=b2, groups=groups)
    saved = TritonSaved(
        x_col=x_col, c=fc1.c, a_col=fc1.a if recipe is None else fc1.a_columnwise, probs=probs,
        w1_col=w1_col, w2_col=w2_col, split_sizes=split_sizes, groups=groups, has_b1=b1 is not None,
        has_b2=b2 is not None,
    )
    return y, saved


def grouped_mlp_backward_triton(dy: torch.Tensor, saved: TritonSaved, activation: Activation,
                                recipe: MXFP8Recipe | None, weight_grad_dtype: torch.dtype = torch.float32,
                                weight_grad_out: tuple[torch.Tensor, torch.Tensor] | None = None) -> MLPGrads:
    """Gradients for dy (T, H); same arguments as ``grouped_mlp_backward_ref``."""
    split_sizes, groups = saved.split_sizes, saved.groups
    if recipe is None:
        dy_row = dy_col = dy
    else:
        dyq = quantize_mxfp8(dy, rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes,
                             element_format=recipe.grad_format, scale_mode=recipe.scale_mode)
        dy_row, dy_col = dyq.rowwise, dyq.columnwise
    hidden = dy.shape[1]
    w2t = _transposed_weight(saved.w2_col, (split_sizes.numel(), hidden, -1))
    dgrad = fc2_dgrad(_bf16(dy_row), w2t, saved.c, split_sizes, activation=activation, recipe=recipe,
                      probs=saved.probs, bias_grad=saved.has_b1, groups=groups)
    dh_row = dgrad.dh if recipe is None else dgrad.dh_rowwise
    dh_col = dgrad.dh if recipe is None else dgrad.dh_columnwise
    w1t = _transposed_weight(saved.w1_col, (split_sizes.numel(), -1, hidden))
    dx = grouped_gemm(_bf16(dh_row), w1t, split_sizes, groups=groups)
    dw1_out, dw2_out = weight_grad_out if weight_grad_out is not None else (None, None)  # added to in the kernel
    dw2 = grouped_wgrad(_bf16(dy_col, groups), _bf16(saved.a_col, groups), split_sizes, out=dw2_out,
                        out_dtype=weight_grad_dtype, groups=groups)
    dw1 = grouped_wgrad(_bf16(dh_col, groups), _bf16(saved.x_col, groups), split_sizes, out=dw1_out,
                        out_dtype=weight_grad_dtype, groups=groups)
    db2 = segment_sum(dy, groups.row_start) if saved.has_b2 else None
    return MLPGrads(dx=dx, dprobs=dgrad.dprobs, dw1=dw1, db1=dgrad.db1, dw2=dw2, db2=db2)
