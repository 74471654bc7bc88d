"""What the layer's fused ops return, shared by every backend's implementation of them (the Triton
and CuTeDSL launchers, the SM100 composition's views, the oracle): FC1's and FC2 dgrad's outputs,
and the gradients of a whole layer step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.fp8_blockwise.tensor import FP8BlockwiseTensor
from gmlp.mxfp8.tensor import MXFP8Tensor

__all__ = ["FC1Output", "FC2DgradOutput", "MLPGrads"]


@dataclass(frozen=True)
class FC1Output:
    """FC1 step's outputs: c = bf16(h) (T, 2F | F), and a = act(h) * probs as bf16 (T, F), or
    quantized both ways (compact scales) under MXFP8, or in 1 x 128 and 128 x 1 blocks under the
    FP8 blockwise recipe."""

    c: torch.Tensor
    a: torch.Tensor | None  # bf16 mode
    a_rowwise: MXFP8Tensor | FP8BlockwiseTensor | None  # quantized: FC2's forward operand
    a_columnwise: MXFP8Tensor | FP8BlockwiseTensor | None  # quantized: FC2's weight-gradient operand


@dataclass(frozen=True)
class FC2DgradOutput:
    """FC2 dgrad step's outputs: dprobs (T,) fp32 (None without probs), and dh = act'(c) applied
    to da * probs: bf16 (T, 2F | F), or quantized both ways in the gradient format (MXFP8 or the
    FP8 blockwise recipe's 1 x 128 and 128 x 1 blocks)."""

    dprobs: torch.Tensor | None
    dh: torch.Tensor | None  # bf16 mode
    dh_rowwise: MXFP8Tensor | FP8BlockwiseTensor | None  # quantized: FC1 dgrad operand
    dh_columnwise: MXFP8Tensor | FP8BlockwiseTensor | None  # quantized: FC1 wgrad operand
    db1: torch.Tensor | None = None  # (E, 2F | F) fp32 per-expert sums of dh, when asked (bias_grad)


@dataclass
class MLPGrads:
    """Gradients of the grouped MLP's inputs and parameters (None where there is no input)."""

    dx: torch.Tensor  # (T, H) bf16
    dprobs: torch.Tensor | None  # (T,) fp32
    # (E, 2F | F, H), fp32 sums stored as the backward's weight_grad_dtype; W1's gate and up stored
    # apart (gmlp.contract.gate_up): the pair of their (E, F, H) gradients
    dw1: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    db1: torch.Tensor | None  # (E, 2F | F) fp32
    dw2: torch.Tensor  # (E, H, F), as dw1
    db2: torch.Tensor | None  # (E, H) fp32
