"""What the two CuTeDSL providers (``cutedsl_sm90``, ``cutedsl_sm100``) share: the package check,
the one-pass quantize kernel (``gmlp.cutedsl.quantize``, built for both architectures) and the
ops that have no CuTeDSL kernel."""

from __future__ import annotations

from typing import Callable

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.dispatch.sites import Op

__all__ = ["system", "supports", "no_kernel_reason", "load_quantize"]


def system(device_type: str, capability: tuple[int, int] | None, interpret: bool) -> Reason | None:
    """Whether the CuTeDSL kernel modules import (the device's architecture is the table's question)."""
    from gmlp.cutedsl import import_error

    return import_error()


def supports(op: Op, problem, gemms: Callable[[], Reason | None]) -> Reason | None:
    """What both CuTeDSL providers answer alike: the quantize kernel's rule for a ``QuantizeProblem``,
    no kernel for the dequantize and the per-expert sum; the GEMM ops get ``gemms()``, the
    architecture's own answer."""
    if op is Op.QUANTIZE:
        from gmlp.cutedsl.quantize import problem_support

        return problem_support(problem)
    return no_kernel_reason(op) or gemms()


def no_kernel_reason(op: Op) -> Reason | None:
    """Why ``op`` has no CuTeDSL kernel on either architecture, or None if it has one."""
    if op is Op.DEQUANTIZE:
        return Reason(ReasonKind.SYSTEM, "no CuTeDSL dequantize in gmlp: the SM100 steps read MXFP8 operands as "
                                         "they are, and on SM90 the operands are dequantized before the GEMMs")
    if op is Op.QUANTIZE_DEQUANTIZE:
        return Reason(ReasonKind.SYSTEM, "no CuTeDSL quantize-dequantize in gmlp: the Triton kernel runs at a device "
                                         "copy's speed rowwise")
    if op in (Op.BLOCKWISE_QUANTIZE, Op.BLOCKWISE_WEIGHTS):
        return Reason(ReasonKind.RECIPE, f"gmlp has no CuTeDSL kernel of the FP8 blockwise recipe's {op.value} (of the "
                                         "recipe, FC1, the grouped GEMM (FC2, FC1 dgrad), FC2 dgrad and the weight "
                                         "gradients have one, on SM90); its Triton kernel runs it")
    if op is Op.SEGMENT_SUM:
        return Reason(ReasonKind.SYSTEM, "no CuTeDSL per-expert sum in gmlp (bias gradients; the SM100 path takes "
                                         "no biases)")
    return None


def load_quantize() -> Callable:
    from gmlp.cutedsl.quantize import quantize_mxfp8

    return quantize_mxfp8
