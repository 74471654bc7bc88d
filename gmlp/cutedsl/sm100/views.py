"""The SM100 steps seen as gmlp's ops, for the cross-check: token rows instead of padded ones,
[gate | up] columns instead of interleaved ones, operands dequantized to bf16 as the Triton
layer's GEMMs read them. Each ``*_view`` gives what ``gmlp.debug``'s hook takes for a site: the
output as the site's op returns it, and the op's arguments, so that the next path down runs on
the same operands and the comparison rules of ``gmlp.debug.compare`` apply unchanged. Only the
cross-check builds these (they dequantize whole tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.outputs import FC1Output, FC2DgradOutput
from gmlp.cutedsl.sm100.layout import PaddedRows, deinterleave_gate_up, from_padded, split_interleaved
from gmlp.cutedsl.sm100.steps import KernelCall, as_matrix, d_col_of, d_row_of
from gmlp.mxfp8.routing import device_groups
from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["TokenRows", "fc1_view", "fc2_view", "fc2_dgrad_view", "fc1_dgrad_view", "wgrad_view"]


@dataclass(frozen=True)
class TokenRows:
    """A quantized output of padded rows as the compare reads one: values and block scales of the
    token rows (columns back in [gate | up] order if ``interleaved``)."""

    padded: MXFP8Tensor
    rows: PaddedRows
    interleaved: bool

    def _token_rows(self, t: torch.Tensor) -> torch.Tensor:
        t = from_padded(t, self.rows)
        return split_interleaved(t) if self.interleaved else t

    def dequantize(self) -> torch.Tensor:
        return self._token_rows(self.padded.dequantize())

    def element_scales(self) -> torch.Tensor:
        return self._token_rows(self.padded.element_scales())


def _bf16_rows(value: MXFP8Tensor, rows: PaddedRows, interleaved: bool = False) -> torch.Tensor:
    """A padded operand's token rows, dequantized to bf16 (what the Triton layer's GEMMs read)."""
    return TokenRows(value, rows, interleaved).dequantize().to(torch.bfloat16)


def _bf16_weight(value: MXFP8Tensor, experts: int, interleaved: bool) -> torch.Tensor:
    """A quantized (E * N, K) weight stack as (E, N, K) bf16 in gmlp's row order."""
    w = value.dequantize().to(torch.bfloat16).view(experts, -1, value.source_shape[1])
    return deinterleave_gate_up(w) if interleaved else w


def _c(fc1: KernelCall, rows: PaddedRows, activation: Activation) -> torch.Tensor:
    c = from_padded(as_matrix(fc1["c"]), rows)
    return split_interleaved(c) if activation.gated else c


def fc1_view(fc1: KernelCall, x_row: MXFP8Tensor, w1_row: MXFP8Tensor, rows: PaddedRows, split_sizes: torch.Tensor,
             probs: torch.Tensor | None, activation: Activation, recipe) -> tuple:
    """(output, args, kwargs) of the ``fc1`` site."""
    experts, tokens = split_sizes.numel(), rows.index.numel()
    got = FC1Output(c=_c(fc1, rows, activation), a=None, a_rowwise=TokenRows(d_row_of(fc1), rows, False),
                    a_columnwise=TokenRows(d_col_of(fc1), rows, False))
    args = (_bf16_rows(x_row, rows), _bf16_weight(w1_row, experts, activation.gated), split_sizes)
    kwargs = dict(ffn_hidden_size=got.c.shape[1] // (2 if activation.gated else 1), activation=activation,
                  recipe=recipe, b1=None, probs=probs, groups=device_groups(split_sizes, tokens))
    return got, args, kwargs


def fc2_view(fc2: KernelCall, a_row: MXFP8Tensor, w2_row: MXFP8Tensor, rows: PaddedRows,
             split_sizes: torch.Tensor) -> tuple:
    """(output, args, kwargs) of the ``fc2`` site."""
    args = (_bf16_rows(a_row, rows), _bf16_weight(w2_row, split_sizes.numel(), False), split_sizes)
    return from_padded(fc2["d"], rows), args, dict(bias=None, groups=device_groups(split_sizes, rows.index.numel()))


def fc2_dgrad_view(dgrad: KernelCall, dprobs: torch.Tensor | None, dy_row: MXFP8Tensor, w2_col: MXFP8Tensor,
                   fc1: KernelCall, rows: PaddedRows, split_sizes: torch.Tensor, probs: torch.Tensor | None,
                   activation: Activation, recipe) -> tuple:
    """(output, args, kwargs) of the ``fc2 dgrad`` site (W2 read transposed, as the Triton layer does)."""
    gated = activation.gated
    got = FC2DgradOutput(dprobs=dprobs, dh=None, dh_rowwise=TokenRows(d_row_of(dgrad, "d_row"), rows, gated),
                         dh_columnwise=TokenRows(d_col_of(dgrad), rows, gated))
    w2t = _bf16_weight(w2_col, split_sizes.numel(), False).transpose(1, 2)
    args = (_bf16_rows(dy_row, rows), w2t, _c(fc1, rows, activation), split_sizes)
    kwargs = dict(activation=activation, recipe=recipe, probs=probs, bias_grad=False,
                  groups=device_groups(split_sizes, rows.index.numel()))
    return got, args, kwargs


def fc1_dgrad_view(fc1_dgrad: KernelCall, dgrad: KernelCall, w1_col: MXFP8Tensor, rows: PaddedRows,
                   split_sizes: torch.Tensor, activation: Activation) -> tuple:
    """(output, args, kwargs) of the ``fc1 dgrad`` site."""
    w1t = _bf16_weight(w1_col, split_sizes.numel(), activation.gated).transpose(1, 2)
    args = (_bf16_rows(d_row_of(dgrad, "d_row"), rows, activation.gated), w1t, split_sizes)
    return from_padded(fc1_dgrad["d"], rows), args, dict(groups=device_groups(split_sizes, rows.index.numel()))


def wgrad_view(got: torch.Tensor, a_col: MXFP8Tensor, b_col: MXFP8Tensor, rows: PaddedRows, split_sizes: torch.Tensor,
               a_interleaved: bool, out: torch.Tensor | None) -> tuple:
    """(output, args, kwargs) of a weight-gradient site: ``got`` (E, M, N) fp32 in gmlp's row
    order, from the padded Q_col operands (A's columns interleaved when ``a_interleaved``);
    ``out``: the tensor it was added into, if any."""
    args = (_bf16_rows(a_col, rows, a_interleaved), _bf16_rows(b_col, rows), split_sizes)
    kwargs = dict(out=out, out_dtype=torch.float32, groups=device_groups(split_sizes, rows.index.numel()))
    return got, args, kwargs
