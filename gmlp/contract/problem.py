"""``LayerProblem``: what every backend is asked about one layer call, as host-known facts.

The dispatcher (``gmlp.dispatch.sites``) builds it from a call's shapes and settings
(``gmlp.dispatch.plan_cache.layer_problem``); each backend's support rules
(``gmlp.cutedsl.sm90.support``, the SM100 and Triton reasons) read it and answer with a
``Reason`` or None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.contract.gate_up import GateUpLayout
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
