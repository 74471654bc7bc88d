"""The CuTeDSL path's provider on Blackwell (sm_100a): the layer's GEMM sites as one composition of
cuDNN frontend's fused block-scaled kernels (``gmlp.cutedsl.sm100``), all of them or none, and the
CuTeDSL quantize."""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.problem import LayerProblem
from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.dispatch.providers import Provider, cutedsl_common
from gmlp.dispatch.sites import Op, Site

__all__ = ["PROVIDER", "SM100_MAX_EXPERTS", "composition_reason"]

SM100_MAX_EXPERTS = 1024  # cuDNN frontend's grouped kernels


def composition_reason(problem: LayerProblem) -> Reason | None:
    """Why the layer's GEMMs cannot run as the SM100 composition (``gmlp.cutedsl.sm100.layer``) on
    an SM100 GPU whose packages import, or None. Its steps share padded layouts, so the GEMM
    sites take it together or not at all: every reason here applies to all of them."""
    if problem.blockwise:
        return Reason(ReasonKind.RECIPE, "the FP8 blockwise recipe: gmlp's SM100 path maps the MXFP8 recipe onto cuDNN "
                                         "frontend's block-scaled kernels; the blockwise recipe runs on Triton")
    if not problem.mxfp8:
        return Reason(ReasonKind.RECIPE, "bf16 (recipe=None): gmlp's SM100 path maps the MXFP8 recipe onto cuDNN "
                                         "frontend's block-scaled kernels; a bf16 layer runs on Triton")
    if problem.param_dtype not in (torch.bfloat16, torch.float32):
        return Reason(ReasonKind.RECIPE, f"{problem.param_dtype} parameters: the quantize takes bf16 or float32")
    if problem.floor_scales:
        return Reason(ReasonKind.RECIPE, "FLOOR scales: the kernels' epilogues quantize their outputs with RCEIL "
                                         "scales (cvt.rp.ue8m0)")
    if problem.e5m2_grads:
        return Reason(ReasonKind.RECIPE, "E5M2 gradients: cuDNN frontend's grouped kernels take one fp8 format for "
                                         "both operands, and the backward GEMMs' other operand is E4M3")
    if problem.bias:
        return Reason(ReasonKind.RECIPE, "biases: the dGLU kernel's bias gradient is bf16 and not deterministic with "
                                         "deterministic dprobs, where gmlp's bias gradients are fp32 sums")
    if problem.gate_up is not GateUpLayout.HALVES:
        return Reason(ReasonKind.SHAPE, f"W1's gate and up stored {problem.gate_up.storage}: the SM100 "
                                        "composition interleaves W1's (E, 2F, H) halves in its quantize")
    if problem.activation == "geglu":
        return Reason(ReasonKind.ACTIVATION, "cuDNN frontend's GLU kernels have no tanh-GELU GeGLU (their 'geglu' is "
                                             "the clamped GPT-OSS form, gmlp's qgeglu)")
    ffn_multiple = 128 if problem.activation == "srelu" else 64  # FC1's N (F or 2F) in 128-row scale tiles
    if problem.experts > SM100_MAX_EXPERTS or problem.hidden % 128 or problem.ffn % ffn_multiple:
        return Reason(ReasonKind.SHAPE, f"the SM100 kernels need at most {SM100_MAX_EXPERTS} experts, H a multiple of "
                                        f"128 and F of {ffn_multiple} ({problem.activation}), got E={problem.experts}, "
                                        f"H={problem.hidden}, F={problem.ffn}")
    return None


def _supports(op: Op, problem, site: str | None) -> Reason | None:
    def gemms() -> Reason | None:
        from gmlp.cutedsl.sm100.cudnn_kernels import import_error

        return import_error() or composition_reason(problem)

    return cutedsl_common.supports(op, problem, gemms)


def _load(site: Site) -> Callable:
    if site.op is Op.QUANTIZE:
        return cutedsl_common.load_quantize()
    raise ValueError(f"{site.name} ({site.op.value}) has no CuTeDSL op of its own on SM100: the GEMM sites run "
                     "together as the SM100 composition (gmlp.cutedsl.sm100.layer), which the layer calls itself")


PROVIDER = Provider("sm_100a (Blackwell)", (10,), cutedsl_common.system, _supports, _load)
