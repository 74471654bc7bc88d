"""CuTeDSL kernels: the production fast path (SM90 kernels of our own; SM100 adds cuDNN's).

Floor 4, on the format and the contract only (it imports no other backend); the dispatcher's
providers ``cutedsl_sm90`` and ``cutedsl_sm100`` load it.

Layer map:
- ``quantize``: launcher of the fused one-pass MXFP8 quantize (``quantize_mxfp8``, same contract
  as ``gmlp.mxfp8.reference.quantize_mxfp8_ref``), its ``problem_support``, and
  ``compile_quantize_kernel`` (ahead-of-time build for sm_90a / sm_100a, no GPU needed);
- ``_quantize_kernel``: the jit kernel code;
- ``sm100``: the SM100 path on cuDNN frontend's fused grouped kernels (its own package map:
  ``sm100.cudnn_kernels``, ``sm100.layout``, ``sm100.steps``, ``sm100.layer``, ``sm100.views``).

This package imports without cutlass-dsl: only the quantize modules import ``cutlass`` (and
cuDNN frontend is imported only when a kernel object is built), and
``import_error()`` says why they cannot be imported (the dispatcher's fallback reason).
"""

from __future__ import annotations

import functools
import importlib

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.system.versions import missing_package_hint, package_version, too_old

__all__ = ["import_error"]

_PACKAGE = "nvidia-cutlass-dsl"


@functools.lru_cache(maxsize=None)
def import_error() -> Reason | None:
    """None if the CuTeDSL kernel modules import, else what failed (package, version, error), a
    system reason."""
    old = too_old(_PACKAGE)
    if old:
        return Reason(ReasonKind.SYSTEM, old)
    try:
        importlib.import_module("gmlp.cutedsl.quantize")
    except Exception as error:  # any failure is a reason to fall back; it is reported, not hidden
        reason = (f"gmlp.cutedsl.quantize failed to import with {_PACKAGE} {package_version(_PACKAGE)}: "
                  f"{type(error).__name__}: {error}")
        hint = missing_package_hint(error)
        return Reason(ReasonKind.SYSTEM, f"{reason}; {hint}" if hint else reason)
    return None
