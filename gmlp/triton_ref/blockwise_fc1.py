"""Triton launcher: grouped FC1 of the FP8 blockwise recipe with the fused forward epilogue (c,
Q_row(a), Q_col(a)). Twin of ``gmlp.contract.blockwise_reference.fc1_forward_blockwise_ref``."""

from __future__ import annotations

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.operands import token_scalars
from gmlp.contract.outputs import FC1Output
from gmlp.fp8_blockwise import layout
from gmlp.fp8_blockwise.buffers import both_ways_buffers, wrap_both_ways
from gmlp.fp8_blockwise.spec import BLOCK
from gmlp.fp8_blockwise.tensor import (
    BlockShape,
    FP8BlockwiseTensor,
    require_block_shape,
)
from gmlp.mxfp8.routing import DeviceGroups, device_groups
from gmlp.mxfp8.spec import ElementFormat
from gmlp.triton_ref._blockwise_fc1_kernel import fc1_blockwise_kernel
from gmlp.triton_ref.fc1 import ACTIVATION_CODES
from gmlp.triton_ref.quantize import search_steps

__all__ = ["fc1_forward_blockwise"]


def fc1_forward_blockwise(x: FP8BlockwiseTensor, w1: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                          ffn_hidden_size: int, activation: Activation, b1: torch.Tensor | None = None,
                          probs: torch.Tensor | None = None, power_of_two: bool = True,
                          groups: DeviceGroups | None = None, num_warps: int = 8, num_stages: int = 3) -> FC1Output:
    """FC1 of every expert on Q_row(x) (T, H) and W1 (E, 2F | F, H) in 128 x 128 tiles ([gate; up]
    halves), with c = bf16(h) and a = act(h) * probs written as Q_row(a) and Q_col(a) (E4M3,
    ``power_of_two`` scales); no host sync."""
    require_block_shape(x, "x", BlockShape.ROWWISE)
    require_block_shape(w1, "w1", BlockShape.TILE)
    tokens, hidden = x.source_shape
    experts, ffn = split_sizes.numel(), ffn_hidden_size
    n1 = (2 if activation.gated else 1) * ffn
    if ffn % BLOCK:
        raise ValueError(f"ffn_hidden_size must be a multiple of {BLOCK} (a's 1 x {BLOCK} blocks), got {ffn}")
    if tuple(w1.data.shape) != (experts, n1, hidden) or w1.data.stride(2) != 1:
        raise ValueError(f"w1 must be ({experts}, {n1}, {hidden}) contiguous along H for {activation.name} with "
                         f"F={ffn}, got {tuple(w1.data.shape)}")
    token_scalars("probs", probs, tokens)
    device = x.data.device
    groups = groups if groups is not None else device_groups(split_sizes, tokens)
    num_tiles = layout.columnwise_blocks(tokens, experts)
    c = torch.empty(tokens, n1, dtype=torch.bfloat16, device=device)
    buffers = both_ways_buffers(tokens, ffn, experts, ElementFormat.E4M3, device)
    a, a_scales, a_col, a_col_scales = buffers
    if num_tiles > 0 and ffn > 0:
        fc1_blockwise_kernel[(num_tiles, ffn // BLOCK)](
            x.data, x.scale_inv, w1.data, w1.scale_inv, b1 if b1 is not None else c, probs if probs is not None else c,
            groups.row_start, groups.tile_start, c, a, a_scales, a_col, a_col_scales,
            tokens, hidden, ffn, x.scale_inv.stride(0), a_scales.stride(0), a_col_scales.stride(0), a_col.stride(0),
            w1.data.stride(0), w1.data.stride(1),
            GATED=activation.gated, HAS_BIAS=b1 is not None, HAS_PROBS=probs is not None,
            ACTIVATION=ACTIVATION_CODES[activation.kind], LIMIT=activation.limit, ALPHA=activation.alpha,
            OFFSET=activation.offset, FMAX=ElementFormat.E4M3.max_normal, INPUT_MAX=torch.finfo(torch.float32).max,
            POWER_OF_TWO=power_of_two, NUM_GROUPS=experts, SEARCH_STEPS=search_steps(experts), N_FASTEST=False,
            num_warps=num_warps, num_stages=num_stages,
        )
    quantized = wrap_both_ways(buffers, groups, ElementFormat.E4M3, power_of_two, split_sizes, tokens)
    return FC1Output(c=c, a=None, a_rowwise=quantized.rowwise, a_columnwise=quantized.columnwise)
