"""The CuTeDSL path's provider on Hopper (sm_90a): our TMA + wgmma grouped GEMM kernels
(``gmlp.cutedsl.sm90``), site by site, on bf16 operands (an MXFP8 layer's operands dequantized
first), and the CuTeDSL quantize."""

from __future__ import annotations

import functools
from typing import Callable

from gmlp.contract.reasons import Reason
from gmlp.dispatch.providers import Provider, cutedsl_common
from gmlp.dispatch.sites import Op, Site

__all__ = ["PROVIDER"]


def _supports(op: Op, problem, site: str | None) -> Reason | None:
    def gemms() -> Reason | None:
        from gmlp.cutedsl.sm90.support import site_reason

        return problem.bf16_operands_reason("SM90 CuTeDSL") or site_reason(site, op.value, problem)

    return cutedsl_common.supports(op, problem, gemms)


def _load(site: Site) -> Callable:
    if site.op is Op.QUANTIZE:
        return cutedsl_common.load_quantize()
    missing = cutedsl_common.no_kernel_reason(site.op)
    if missing is not None:
        raise ValueError(f"{site.op.value} has no CuTeDSL implementation: {missing}")
    from gmlp.cutedsl.sm90 import launch_options
    from gmlp.cutedsl.sm90.support import launcher

    if site.op.value not in launch_options.DEFAULTS:  # no launch knobs to choose
        return launcher(site.op.value)
    # the site picks its own tuned launch knobs (the grouped GEMM and the weight gradient serve two)
    return functools.partial(launcher(site.op.value), site=site.name)


PROVIDER = Provider("sm_90a (Hopper)", (9,), cutedsl_common.system, _supports, _load)
