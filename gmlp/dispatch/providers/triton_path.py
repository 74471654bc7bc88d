"""The Triton path's provider: ``gmlp.triton_ref``'s kernels on any CUDA GPU of compute capability
8.9 or newer, or in Triton's interpreter on any device (``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Callable

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.dispatch.providers import Provider
from gmlp.dispatch.sites import BLOCKWISE_OPS, GEMM_OPS, Op, Site
from gmlp.system.versions import package_version, too_old

__all__ = ["PROVIDER"]


def _system(device_type: str, capability: tuple[int, int] | None, interpret: bool) -> Reason | None:
    if interpret:
        if importlib.util.find_spec("numpy") is None:  # the interpreter computes with numpy arrays
            return Reason(ReasonKind.SYSTEM, "TRITON_INTERPRET=1, but Triton's interpreter needs numpy, which is "
                                             "not installed: pip install numpy")
        return None
    if device_type != "cuda":
        return Reason(ReasonKind.SYSTEM, f"tensors are on {device_type}; the Triton kernels need a CUDA GPU "
                                         "(or TRITON_INTERPRET=1 to run them in Triton's interpreter)")
    if capability < (8, 9):
        return Reason(ReasonKind.SYSTEM, f"compute capability {capability[0]}.{capability[1]} < 8.9: "
                                         "the fp8 conversions need sm_89 or newer")
    try:
        import triton  # noqa: F401
    except Exception as error:  # report any import failure, with the package version
        return Reason(ReasonKind.SYSTEM, f"triton {package_version('triton')} failed to import: {error!r}")
    old = too_old("triton")
    return Reason(ReasonKind.SYSTEM, old) if old else None


def _supports(op: Op, problem, site: str | None) -> Reason | None:
    """The quantize's own rule; for the GEMMs, bf16 operands and the launchers' shape rules
    (``gmlp.triton_ref.shapes``, which the launchers raise with); the FP8 blockwise ops, sizes in
    128-element blocks; the other ops take any sizes."""
    if op is Op.QUANTIZE:
        from gmlp.triton_ref.quantize import problem_support

        return problem_support(problem)
    if op is Op.QUANTIZE_DEQUANTIZE:
        from gmlp.triton_ref.quantize_dequantize import problem_support

        return problem_support(problem)
    if op in BLOCKWISE_OPS:
        return problem.blockwise_shape_reason()
    if op not in GEMM_OPS:
        return None
    from gmlp.triton_ref.shapes import fc1_shape_reason, fc2_dgrad_shape_reason

    reason = problem.bf16_operands_reason("Triton")
    if reason is None and op is Op.FC1:
        reason = fc1_shape_reason(problem.hidden, problem.ffn)
    if reason is None and op is Op.FC2_DGRAD:
        reason = fc2_dgrad_shape_reason(problem.ffn)
    return reason


def _load(site: Site) -> Callable:
    op = site.op
    if op is Op.QUANTIZE:
        from gmlp.triton_ref.quantize import DEFAULT_QUANTIZE_CONFIG, WEIGHT_QUANTIZE_CONFIG, quantize_mxfp8

        return functools.partial(quantize_mxfp8, config=WEIGHT_QUANTIZE_CONFIG if site.weight_stack else DEFAULT_QUANTIZE_CONFIG)
    return getattr(importlib.import_module(f"gmlp.triton_ref.{op.module}"), op.launcher)


PROVIDER = Provider("Triton", None, _system, _supports, _load)
