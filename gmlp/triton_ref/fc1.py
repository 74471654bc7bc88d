"""Triton launcher: grouped FC1 + activation + probs, with c and a (bf16 or Q_row/Q_col) outputs."""

from __future__ import annotations

import torch

from gmlp.contract.activations import Activation, ActivationKind
from gmlp.contract.gate_up import GateUp
from gmlp.contract.operands import expert_operand, rowwise_operand, token_scalars
from gmlp.contract.outputs import FC1Output
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.buffers import compact_buffers
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.triton_ref._fc1_kernel import fc1_forward_kernel
from gmlp.triton_ref.quantize import search_steps
from gmlp.triton_ref.shapes import fc1_shape_reason
from gmlp.triton_ref.tuning import FC1_TILING, GemmTiling

__all__ = ["fc1_forward", "ACTIVATION_CODES"]

ACTIVATION_CODES = {ActivationKind.SWIGLU: 0, ActivationKind.GEGLU: 1, ActivationKind.QGEGLU: 2, ActivationKind.SRELU: 3}


def _gate_and_up(w1: torch.Tensor | GateUp, experts: int, hidden: int, ffn: int, gated: bool) -> tuple:
    """W1's gate and up operands (srelu: W1 itself twice), each checked to hold (F, H) per expert.
    A plain W1 is sliced here rather than through ``GateUp``, whose views need contiguous rows:
    the twin reads any strides."""
    if isinstance(w1, GateUp):
        if not gated:
            raise ValueError("w1 is a GateUp (gate and up weights) but the activation is not gated")
        gate, up = w1.gate, w1.up
    else:
        w = expert_operand("w1", w1, experts)
        n1 = (2 if gated else 1) * ffn
        if (w.n, w.k) != (n1, hidden):
            raise ValueError(f"w1 must hold {experts} experts' ({n1}, {hidden}) matrices, got ({w.n}, {w.k}) each")
        gate, up = (w1[:, :ffn], w1[:, ffn:]) if gated else (w1, w1)
    operands = expert_operand("w1's gate", gate, experts), expert_operand("w1's up", up, experts)
    if (operands[0].n, operands[0].k) != (ffn, hidden):
        raise ValueError(f"w1's gate and up must hold {experts} experts' ({ffn}, {hidden}) matrices, got "
                         f"({operands[0].n}, {operands[0].k}) each")
    return operands


def fc1_forward(
    x: torch.Tensor,  # (T, H) bf16
    w1: torch.Tensor | GateUp,  # W1_g (N1, H) per expert: bf16 (E, N1, H), any strides; or its gate and up views
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    ffn_hidden_size: int,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    b1: torch.Tensor | None = None,  # (E, N1)
    probs: torch.Tensor | None = None,  # (T,)
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: GemmTiling | None = None,
) -> FC1Output:
    """FC1 of every expert with the fused forward epilogue; no host sync. Twin of
    ``gmlp.contract.reference.fc1_forward_ref`` (same arguments and outputs).

    The operands are bf16: the bf16 layer's, or MXFP8 operands dequantized beforehand
    (``gmlp.triton_ref.dequantize``); ``recipe`` decides whether ``a`` is written quantized. A
    gated W1 may come in any ``gmlp.contract.gate_up`` layout, as the two views of a ``GateUp``."""
    # validate
    quantized = recipe is not None  # a is written as Q_row(a) and Q_col(a)
    experts, ffn = split_sizes.numel(), ffn_hidden_size
    fc1_outputs = (2 if activation.gated else 1) * ffn
    x_data, (tokens, hidden) = rowwise_operand("x", x)
    gate, up = _gate_and_up(w1, experts, hidden, ffn, activation.gated)
    shape = fc1_shape_reason(hidden, ffn)
    if shape is not None:
        raise ValueError(shape.message)
    token_scalars("probs", probs, tokens)
    tiling = tiling or FC1_TILING[quantized]
    device = x_data.device

    # canonicalize
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    num_col_blocks = scale_layout.max_column_blocks(tokens, experts)
    fmt = ElementFormat.E4M3
    scale_mode = recipe.scale_mode if quantized else ScaleMode.RCEIL

    # allocate
    c = torch.empty(tokens, fc1_outputs, dtype=torch.bfloat16, device=device)
    if quantized:
        quantized_a = compact_buffers(tokens, ffn, experts, fmt, device)
        a, a_scales, a_col, a_col_scales = (quantized_a.row_data, quantized_a.row_scales, quantized_a.col_data,
                                            quantized_a.col_scales)
    else:
        a = torch.empty(tokens, ffn, dtype=torch.bfloat16, device=device)
        a_scales = a_col = a_col_scales = a

    # launch
    if num_tiles > 0 and tokens > 0:
        grid = tiling.grid(num_tiles, ffn)
        fc1_forward_kernel[grid](
            x_data, gate.data, up.data,
            b1 if b1 is not None else c, probs if probs is not None else c,
            groups.row_start, groups.tile_start, groups.block_start,
            c, a, a_scales, a_col, a_col_scales,
            tokens, hidden, ffn, num_col_blocks, *gate.strides, *up.strides,
            QUANTIZED=quantized, GATED=activation.gated, HAS_BIAS=b1 is not None, HAS_PROBS=probs is not None,
            ACTIVATION=ACTIVATION_CODES[activation.kind], LIMIT=activation.limit, ALPHA=activation.alpha,
            OFFSET=activation.offset,
            RECIPROCAL_MAX=float(torch.tensor(1.0 / fmt.max_normal, dtype=torch.float32)), EMAX=fmt.emax,
            FLOOR_MODE=scale_mode is ScaleMode.FLOOR,
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
            N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    if not quantized:
        return FC1Output(c=c, a=a, a_rowwise=None, a_columnwise=None)
    a_rowwise, a_columnwise = quantized_a.tensors(False, fmt, scale_mode, split_sizes)
    return FC1Output(c=c, a=None, a_rowwise=a_rowwise, a_columnwise=a_columnwise)
