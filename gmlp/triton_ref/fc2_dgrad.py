"""Triton launcher: grouped FC2 dgrad with fused activation backward, dprobs and dh outputs."""

from __future__ import annotations

import torch
import triton

from gmlp.contract.activations import Activation
from gmlp.contract.operands import expert_operand, rowwise_operand, token_scalars
from gmlp.contract.outputs import FC2DgradOutput
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.buffers import compact_buffers
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ScaleMode
from gmlp.triton_ref._fc2_dgrad_kernel import fc2_dgrad_kernel
from gmlp.triton_ref.fc1 import ACTIVATION_CODES
from gmlp.triton_ref.quantize import search_steps
from gmlp.triton_ref.segment_sum import segment_sum
from gmlp.triton_ref.shapes import fc2_dgrad_shape_reason
from gmlp.triton_ref.tuning import FC2_DGRAD_TILING, GemmTiling

__all__ = ["fc2_dgrad"]


def fc2_dgrad(
    dy: torch.Tensor,  # (T, H) bf16
    w2t: torch.Tensor,  # W2_g^T per expert: bf16 (E, F, H), any strides (a transposed view of W2 is read in place)
    c: torch.Tensor,  # (T, 2F | F) bf16
    split_sizes: torch.Tensor,  # (E,) int, on the device
    *,
    activation: Activation,
    recipe: MXFP8Recipe | None,
    probs: torch.Tensor | None = None,  # (T,)
    bias_grad: bool = False,
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
    tiling: GemmTiling | None = None,
) -> FC2DgradOutput:
    """Steps 5-6 of the dataflow; no host sync; deterministic (dprobs partial sums are added in a
    fixed order). Twin of ``gmlp.contract.reference.fc2_dgrad_ref``; MXFP8 operands are dequantized first
    (``gmlp.triton_ref.dequantize``), ``recipe`` decides whether ``dh`` is written quantized."""
    # validate
    quantized = recipe is not None  # dh is written as Q_row(dh) and Q_col(dh)
    dy_data, (tokens, hidden) = rowwise_operand("dy", dy)
    experts = split_sizes.numel()
    w = expert_operand("w2t", w2t, experts)
    ffn = w.n
    fc1_outputs = (2 if activation.gated else 1) * ffn
    if w.k != hidden:
        raise ValueError(f"w2t must hold {experts} experts' (F, H={hidden}) matrices, got ({w.n}, {w.k}) each")
    if tuple(c.shape) != (tokens, fc1_outputs) or c.dtype != torch.bfloat16:
        raise ValueError(f"c must be bf16 ({tokens}, {fc1_outputs}), got {c.dtype} {tuple(c.shape)}")
    shape = fc2_dgrad_shape_reason(ffn)
    if shape is not None:
        raise ValueError(shape.message)
    token_scalars("probs", probs, tokens)
    tiling = tiling or FC2_DGRAD_TILING[quantized]
    device = dy_data.device

    # canonicalize
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = scale_layout.max_row_tiles(tokens, experts)
    num_col_blocks = scale_layout.max_column_blocks(tokens, experts)
    n_tiles = triton.cdiv(ffn, tiling.block_n)
    fmt = recipe.grad_format if quantized else None
    scale_mode = recipe.scale_mode if quantized else ScaleMode.RCEIL

    # allocate
    dprobs_partial = torch.zeros(tokens, n_tiles, dtype=torch.float32, device=device)
    dh_tile_sums = torch.zeros(num_tiles if bias_grad else 1, fc1_outputs, dtype=torch.float32, device=device)
    if quantized:
        quantized_dh = compact_buffers(tokens, fc1_outputs, experts, fmt, device)
        dh, dh_scales, dh_col, dh_col_scales = (quantized_dh.row_data, quantized_dh.row_scales, quantized_dh.col_data,
                                                quantized_dh.col_scales)
    else:
        dh = torch.empty(tokens, fc1_outputs, dtype=torch.bfloat16, device=device)
        dh_scales = dh_col = dh_col_scales = dh

    # launch
    if num_tiles > 0 and tokens > 0:
        fc2_dgrad_kernel[tiling.grid(num_tiles, ffn)](
            dy_data, w.data, c, probs if probs is not None else c,
            groups.row_start, groups.tile_start, groups.block_start,
            dprobs_partial, dh_tile_sums, dh, dh_scales, dh_col, dh_col_scales,
            tokens, hidden, ffn, num_col_blocks, *w.strides,
            QUANTIZED=quantized, GATED=activation.gated, HAS_PROBS=probs is not None, BIAS_GRAD=bias_grad,
            ACTIVATION=ACTIVATION_CODES[activation.kind], LIMIT=activation.limit, ALPHA=activation.alpha,
            OFFSET=activation.offset,
            RECIPROCAL_MAX=float(torch.tensor(1.0 / fmt.max_normal, dtype=torch.float32)) if quantized else 1.0,
            EMAX=fmt.emax if quantized else 0, FLOOR_MODE=scale_mode is ScaleMode.FLOOR,
            NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k,
            N_FASTEST=tiling.n_fastest,
            num_warps=tiling.num_warps, num_stages=tiling.num_stages,
        )
    dprobs = dprobs_partial.sum(dim=1) if probs is not None else None  # fixed order: deterministic
    db1 = segment_sum(dh_tile_sums, groups.tile_start) if bias_grad else None
    if not quantized:
        return FC2DgradOutput(dprobs=dprobs, dh=dh, dh_rowwise=None, dh_columnwise=None, db1=db1)
    dh_rowwise, dh_columnwise = quantized_dh.tensors(False, fmt, scale_mode, split_sizes)
    return FC2DgradOutput(dprobs=dprobs, dh=None, db1=db1, dh_rowwise=dh_rowwise, dh_columnwise=dh_columnwise)
