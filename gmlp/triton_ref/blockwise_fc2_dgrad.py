"""Triton launcher: grouped FC2 dgrad of the FP8 blockwise recipe with the fused activation
backward (dprobs, Q_row(dh), Q_col(dh), db1). Twin of
``gmlp.contract.blockwise_reference.fc2_dgrad_blockwise_ref``."""

from __future__ import annotations

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.operands import token_scalars
from gmlp.contract.outputs import FC2DgradOutput
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.buffers import both_ways_buffers, wrap_both_ways
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat, enum_member
from gmlp.triton_ref._blockwise_fc2_dgrad_kernel import fc2_dgrad_blockwise_kernel
from gmlp.triton_ref.fc1 import ACTIVATION_CODES
from gmlp.triton_ref.quantize import search_steps
from gmlp.triton_ref.segment_sum import segment_sum

__all__ = ["fc2_dgrad_blockwise"]


def fc2_dgrad_blockwise(dy: FP8BlockwiseTensor, w2t: FP8BlockwiseTensor, c: torch.Tensor, split_sizes: torch.Tensor,
                        *, activation: Activation, grad_format: ElementFormat | str = ElementFormat.E4M3,
                        probs: torch.Tensor | None = None, bias_grad: bool = False, power_of_two: bool = True,
                        groups: DeviceGroups | None = None, num_warps: int = 16, num_stages: int = 3) -> FC2DgradOutput:
    """Steps 5-6 of the dataflow on Q_row(dy) (T, H) and W2^T (E, F, H) in 128 x 128 tiles, with
    the saved c (T, 2F | F) bf16: dprobs (deterministic), dh as Q_row(dh) and Q_col(dh) in
    ``grad_format``, db1 with ``bias_grad``; no host sync."""
    require_block_shape(dy, "dy", BlockShape.ROWWISE)
    require_block_shape(w2t, "w2t", BlockShape.TILE)
    grad_format = enum_member(ElementFormat, grad_format, "grad_format")
    tokens, hidden = dy.source_shape
    experts = split_sizes.numel()
    if w2t.data.dim() != 3 or w2t.data.shape[0] != experts or w2t.data.shape[2] != hidden or w2t.data.stride(2) != 1:
        raise ValueError(f"w2t must be (E={experts}, F, H={hidden}) contiguous along H, got {tuple(w2t.data.shape)}")
    ffn = w2t.data.shape[1]
    n1 = (2 if activation.gated else 1) * ffn
    if tuple(c.shape) != (tokens, n1) or c.dtype != torch.bfloat16:
        raise ValueError(f"c must be bf16 ({tokens}, {n1}), got {c.dtype} {tuple(c.shape)}")
    token_scalars("probs", probs, tokens)
    device = dy.data.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = layout.columnwise_blocks(tokens, experts)
    dprobs_partial = torch.zeros(tokens, ffn // BLOCK, dtype=torch.float32, device=device)
    dh_tile_sums = torch.zeros(num_tiles if bias_grad else 1, n1, dtype=torch.float32, device=device)
    buffers = both_ways_buffers(tokens, n1, experts, grad_format, device)
    dh, dh_scales, dh_col, dh_col_scales = buffers
    if num_tiles > 0 and ffn > 0:
        fc2_dgrad_blockwise_kernel[(num_tiles, ffn // BLOCK)](
            dy.data, dy.scale_inv, w2t.data, w2t.scale_inv, c, probs if probs is not None else c,
            groups.row_start, groups.tile_start, dprobs_partial, dh_tile_sums, dh, dh_scales, dh_col, dh_col_scales,
            tokens, hidden, ffn, dy.scale_inv.stride(0), dh_scales.stride(0), dh_col_scales.stride(0), dh_col.stride(0),
            w2t.data.stride(0), w2t.data.stride(1),
            GATED=activation.gated, HAS_PROBS=probs is not None, BIAS_GRAD=bias_grad,
            ACTIVATION=ACTIVATION_CODES[activation.kind], LIMIT=activation.limit, ALPHA=activation.alpha,
            OFFSET=activation.offset, FMAX=grad_format.max_normal, INPUT_MAX=torch.finfo(torch.float32).max,
            POWER_OF_TWO=power_of_two, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), N_FASTEST=False,
            num_warps=num_warps, num_stages=num_stages,
        )
    dh_quantized = wrap_both_ways(buffers, groups, grad_format, power_of_two, split_sizes, tokens)
    dprobs = dprobs_partial.sum(dim=1) if probs is not None else None  # fixed order: deterministic
    db1 = segment_sum(dh_tile_sums, groups.tile_start) if bias_grad else None
    return FC2DgradOutput(dprobs=dprobs, dh=None, db1=db1, dh_rowwise=dh_quantized.rowwise,
                          dh_columnwise=dh_quantized.columnwise)
