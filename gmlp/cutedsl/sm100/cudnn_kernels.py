"""cuDNN frontend's CuTeDSL grouped GEMM kernels for SM100: the ones the layer's SM100 path maps
its fused steps onto, and whether they import with the installed cutlass-dsl.

A cutlass-dsl release once renamed an import these kernels used, and every grouped MLP ran
unfused, visible only as a slowdown. So the import is checked here, its error text becomes the
dispatcher's reason, and ``TESTED_TOGETHER`` pins the versions known to work together
(``tests/cutedsl/sm100/test_cudnn_kernels.py`` fails when an installed combination breaks the import).
"""

from __future__ import annotations

import functools
import importlib

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.system.versions import missing_package_hint, package_version

__all__ = ["KERNELS", "TESTED_TOGETHER", "import_error", "kernel_class"]

# fused step of the layer -> (module, class) in nvidia-cudnn-frontend
KERNELS = {
    "fc1_glu": ("cudnn.gemm.cutedsl.grouped.glu.api", "GroupedGemmGluSm100"),  # FC1 + swiglu / clamped geglu
    "fc1_srelu": ("cudnn.gemm.cutedsl.grouped.srelu.api", "GroupedGemmSreluSm100"),
    "fc2_dgrad_glu": ("cudnn.gemm.cutedsl.grouped.dglu.api", "GroupedGemmDgluSm100"),  # + dprobs
    "fc2_dgrad_srelu": ("cudnn.gemm.cutedsl.grouped.dsrelu.api", "GroupedGemmDsreluSm100"),
    "grouped_gemm": ("cudnn.gemm.cutedsl.grouped.quant.api", "GroupedGemmQuantSm100"),  # FC2, FC1 dgrad
    "wgrad": ("cudnn.gemm.cutedsl.grouped.wgrad.api", "GroupedGemmWgradSm100"),
}
TESTED_TOGETHER = {"nvidia-cutlass-dsl": "4.8.1", "nvidia-cudnn-frontend": "1.32.0"}


def _versions() -> str:
    return ", ".join(f"{name} {package_version(name)}" for name in TESTED_TOGETHER)


@functools.lru_cache(maxsize=None)
def import_error() -> Reason | None:
    """None if every kernel class imports, else the first failure (module, versions, error), a
    system reason."""
    for module, name in KERNELS.values():
        try:
            getattr(importlib.import_module(module), name)
        except Exception as error:  # any failure is a fallback reason; it is reported, not hidden
            reason = f"{module}.{name} failed to import with {_versions()}: {type(error).__name__}: {error}"
            hint = missing_package_hint(error)
            return Reason(ReasonKind.SYSTEM, f"{reason}; {hint}" if hint else reason)
    return None


def kernel_class(step: str) -> type:
    """The cuDNN frontend class of a fused step (``KERNELS``); raises ImportError with the reason."""
    error = import_error()
    if error is not None:
        raise ImportError(error.message)
    module, name = KERNELS[step]
    return getattr(importlib.import_module(module), name)
