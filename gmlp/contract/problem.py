"""``LayerProblem``: what every backend is asked about one layer call, as host-known facts.

The dispatcher builds it from a call's shapes and settings
(``gmlp.dispatch.plan_cache.layer_problem``); each provider's support rules
(``gmlp.dispatch.providers``, with the kernels' own ``problem_support``) read it and answer with a
``Reason`` or None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.mxfp8.problem import QuantizeProblem

__all__ = ["LayerProblem"]


@dataclass(frozen=True, kw_only=True)
class LayerProblem:
    """What the layer's per-op answers depend on: parameter dtype, recipe, sizes, the quantize calls."""

    param_dtype: torch.dtype
    mxfp8: bool
    bias: bool
    activation: str  # its name: "swiglu", "geglu", "qgeglu", "srelu"
    e5m2_grads: bool  # gradients quantized to E5M2 (the weights and activations stay E4M3)
    quantize_problems: dict[str, QuantizeProblem]  # site name -> its quantize call
    experts: int
    hidden: int  # H
    ffn: int  # F
    floor_scales: bool  # the recipe's scale mode is FLOOR (RCEIL otherwise)
    sm100_quantize_problems: dict[str, QuantizeProblem]  # site name -> its call in the SM100 composition
    tokens: int  # T's bound: the plan's token class (gmlp.dispatch.plan_cache.token_class)
    gate_up: GateUpLayout = GateUpLayout.HALVES  # how W1's gate and up are stored (HALVES for srelu)
    blockwise: bool = False  # the FP8 blockwise recipe (``mxfp8`` is then False)

    def blockwise_shape_reason(self) -> Reason | None:
        """Why the FP8 blockwise kernels cannot take these sizes (H and F multiples of 128), or None."""
        if self.hidden % 128 or self.ffn % 128:
            return Reason(ReasonKind.SHAPE, f"the FP8 blockwise recipe's 128-element blocks need H and F multiples of "
                                            f"128, got H={self.hidden}, F={self.ffn}")
        return None

    def bf16_operands_reason(self, kernels: str) -> Reason | None:
        """Why GEMM kernels on bf16 operands (Triton's, SM90's: ``kernels`` names them) cannot take
        the layer's parameters, or None."""
        dtype = self.param_dtype
        if dtype != torch.bfloat16 and not ((self.mxfp8 or self.blockwise) and dtype == torch.float32):
            mode = "MXFP8" if self.mxfp8 else "bf16 (recipe=None)"
            return Reason(ReasonKind.RECIPE, f"{mode} with {dtype} parameters: the {kernels} GEMMs take bf16 operands, "
                                             "which are the parameters themselves without a recipe, or their "
                                             "dequantized MXFP8 values (bf16 or float32 parameters)")
        return None
