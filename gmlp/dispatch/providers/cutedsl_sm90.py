"""The CuTeDSL path's provider on Hopper (sm_90a): our TMA + wgmma grouped GEMM kernels
(``gmlp.cutedsl.sm90``), site by site, on bf16 operands (an MXFP8 layer's operands dequantized
first, or decoded in the kernel at ``gmlp.cutedsl.sm90.support.DECODING_SITES``), and the
CuTeDSL quantize."""

from __future__ import annotations

from typing import Callable

from gmlp.contract.reasons import Reason
from gmlp.dispatch.providers import Provider, cutedsl_common
from gmlp.dispatch.sites import Op, Site

__all__ = ["PROVIDER"]


def _supports(op: Op, problem, site: str | None) -> Reason | None:
    if op is Op.QUANTIZE:
        return cutedsl_common.quantize_support(problem)
    reason = cutedsl_common.no_kernel_reason(op)
    if reason is not None:
        return reason
    from gmlp.cutedsl.sm90.support import site_reason

    return problem.bf16_operands_reason("SM90 CuTeDSL") or site_reason(site, op.value, problem)


def _load(site: Site) -> Callable:
    if site.op is Op.QUANTIZE:
        return cutedsl_common.load_quantize()
    if cutedsl_common.no_kernel_reason(site.op) is not None:
        raise ValueError(f"{site.op.value} has no CuTeDSL implementation: {cutedsl_common.no_kernel_reason(site.op)}")
    from gmlp.cutedsl.sm90.support import launcher

    return launcher(site.op.value)


PROVIDER = Provider("sm_90a (Hopper)", (9,), cutedsl_common.system, _supports, _load)
