"""The oracle of the FP8 blockwise recipe's fused steps, in plain PyTorch (any device, syncs freely).

The same dataflow as ``gmlp.contract.reference`` (docs/design.md), the quantizations those of
``gmlp.fp8_blockwise``: token operands in 1 x 128 blocks for the forward and dgrad GEMMs and
128 x 1 blocks per expert for the weight gradients, weights in 128 x 128 tiles. The GEMMs sum in
fp64 (``gmlp.fp8_blockwise.gemm``); what the dataflow keeps in fp32 is rounded there. A fused
epilogue quantizes its fp32 values (the largest fp32 stands in for an overflowed scale).
"""

from __future__ import annotations

import torch

from gmlp.contract.activations import Activation
from gmlp.contract.outputs import FC1Output, FC2DgradOutput
from gmlp.fp8_blockwise.gemm import grouped_gemm_blockwise_ref
from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref
from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["fc1_forward_blockwise_ref", "fc2_dgrad_blockwise_ref"]


def fc1_forward_blockwise_ref(x: FP8BlockwiseTensor, w1: FP8BlockwiseTensor, split_sizes: torch.Tensor, *,
                              ffn_hidden_size: int, activation: Activation, b1: torch.Tensor | None = None,
                              probs: torch.Tensor | None = None, power_of_two: bool = True) -> FC1Output:
    """FC1 (dataflow steps 2-3) on Q_row(x) (T, H) and W1 (E, 2F | F, H) in 128 x 128 tiles ([gate;
    up] halves): h in fp32, c = bf16(h), a = act(h) * probs quantized both ways (E4M3); twin of
    ``gmlp.triton_ref.blockwise_fc1.fc1_forward_blockwise``."""
    h = grouped_gemm_blockwise_ref(x, w1, split_sizes, bias=b1, out_dtype=torch.float32)
    a = activation.forward(h)
    if probs is not None:
        a = a * probs.float()[:, None]
    if a.shape[1] != ffn_hidden_size:
        raise ValueError(f"w1 holds {h.shape[1]} outputs: {activation.name} with F={ffn_hidden_size} needs "
                         f"{(2 if activation.gated else 1) * ffn_hidden_size}")
    q = quantize_fp8_blockwise_ref(a, columnwise=True, split_sizes=split_sizes, power_of_two=power_of_two)
    return FC1Output(c=h.bfloat16(), a=None, a_rowwise=q.rowwise, a_columnwise=q.columnwise)


def fc2_dgrad_blockwise_ref(dy: FP8BlockwiseTensor, w2t: FP8BlockwiseTensor, c: torch.Tensor,
                            split_sizes: torch.Tensor, *, activation: Activation,
                            grad_format: ElementFormat | str = ElementFormat.E4M3, probs: torch.Tensor | None = None,
                            bias_grad: bool = False, power_of_two: bool = True) -> FC2DgradOutput:
    """FC2 dgrad (dataflow steps 5-6) on Q_row(dy) (T, H) and W2^T (E, F, H) in 128 x 128 tiles:
    da in fp32; dprobs = sum_f da * act(c); dh = act'(c) applied to da * probs, quantized both
    ways in ``grad_format``; db1 the fp32 per-expert sums of dh; twin of
    ``gmlp.triton_ref.blockwise_fc2_dgrad.fc2_dgrad_blockwise``."""
    da = grouped_gemm_blockwise_ref(dy, w2t, split_sizes, out_dtype=torch.float32)
    c = c.float()
    dprobs = None
    if probs is not None:
        dprobs = (da.double() * activation.forward(c).double()).sum(-1).float()
        da = da * probs.float()[:, None]
    dh = activation.backward(c, da)
    db1 = None
    if bias_grad:
        sizes = [int(m) for m in split_sizes.tolist()]
        db1 = torch.stack([part.double().sum(0).float() for part in dh.split(sizes)])
    q = quantize_fp8_blockwise_ref(dh, columnwise=True, split_sizes=split_sizes, element_format=grad_format,
                                   power_of_two=power_of_two)
    return FC2DgradOutput(dprobs=dprobs, dh=None, dh_rowwise=q.rowwise, dh_columnwise=q.columnwise, db1=db1)
