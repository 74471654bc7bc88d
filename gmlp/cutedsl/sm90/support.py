"""What the SM90 kernels run at each GEMM site of the layer, and their launchers (for the
dispatcher's SM90 provider, ``gmlp.dispatch.providers.cutedsl_sm90``).

Each site's problem is the kernel's own ``problem_support`` at the layer's sizes (T is the plan's
token class, an upper bound of the call's rows). On SM90 the MXFP8 recipe's operands are
dequantized to bf16 before the GEMMs (the same values the spec's GEMM reads), so every site
takes bf16 operands; FC1 also writes the recipe's quantized outputs (Q_row and Q_col of a) from
its epilogue, bit for bit those of its Triton twin, and FC2 dgrad writes Q_row and Q_col of dh
from its own.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Callable

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.system.versions import missing_package_hint, package_version

if TYPE_CHECKING:
    from gmlp.contract.problem import LayerProblem

__all__ = ["KERNEL_MODULES", "FFN_OPS", "import_error", "launcher", "site_gemm", "site_reason"]

# op name (gmlp.dispatch.sites.Op's value) -> the kernel module of gmlp.cutedsl.sm90 and its launcher
KERNEL_MODULES = {
    "fc1_forward": ("fc1", "fc1_forward"),
    "grouped_gemm": ("grouped_gemm", "grouped_gemm"),
    "fc2_dgrad": ("fc2_dgrad", "fc2_dgrad"),
    "grouped_wgrad": ("wgrad", "grouped_wgrad"),
    "fc1_forward_blockwise": ("blockwise_fc1", "fc1_forward_blockwise"),
    "grouped_gemm_fp8_blockwise": ("blockwise_gemm", "grouped_gemm_fp8_blockwise"),
    "fc2_dgrad_blockwise": ("blockwise_fc2_dgrad", "fc2_dgrad_blockwise"),
    "grouped_wgrad_fp8_blockwise": ("blockwise_wgrad", "grouped_wgrad_fp8_blockwise"),
}
# the ops whose kernels' problem_support takes the layer's (T, H, F, E) (FC1 and FC2 dgrad, with
# their activation epilogues); the others take their GEMM's (T, N, K, E)
FFN_OPS = ("fc1_forward", "fc2_dgrad", "fc1_forward_blockwise", "fc2_dgrad_blockwise")

def _module(op: str):
    return importlib.import_module(f"gmlp.cutedsl.sm90.{KERNEL_MODULES[op][0]}")


@functools.lru_cache(maxsize=None)
def import_error() -> Reason | None:
    """None if every SM90 kernel module imports, else the first failure (module, package version,
    error), a system reason."""
    for op in KERNEL_MODULES:
        try:
            _module(op)
        except Exception as error:  # any failure is a reason to fall back; it is reported, not hidden
            name = f"gmlp.cutedsl.sm90.{KERNEL_MODULES[op][0]}"
            reason = (f"{name} failed to import with nvidia-cutlass-dsl {package_version('nvidia-cutlass-dsl')}: "
                      f"{type(error).__name__}: {error}")
            hint = missing_package_hint(error)
            return Reason(ReasonKind.SYSTEM, f"{reason}; {hint}" if hint else reason)
    return None


def launcher(op: str) -> Callable:
    """The SM90 launcher of ``op`` (the arguments of its Triton twin)."""
    return getattr(_module(op), KERNEL_MODULES[op][1])


def site_gemm(site: str, tokens: int, hidden: int, ffn: int, experts: int, *, gated: bool = True
              ) -> tuple[int, int, int, int]:
    """(T, N, K, E) of the GEMM at ``site`` of a layer (T rows, H, F, E), as its SM90 launcher
    sees it: FC1 N = 2F (F ungated), K = H; FC2 N = H, K = F; FC2 dgrad N = F, K = H; FC1 dgrad
    N = H, K = 2F | F; the weight gradients' (N, K) are dW's (M, N): FC2 (H, F), FC1 (2F | F, H)."""
    n1 = (2 if gated else 1) * ffn
    n, k = {"fc1": (n1, hidden), "fc2": (hidden, ffn), "fc2 dgrad": (ffn, hidden), "fc1 dgrad": (hidden, n1),
            "fc2 wgrad": (hidden, ffn), "fc1 wgrad": (n1, hidden)}[site]
    return tokens, n, k, experts


def site_reason(site: str, op: str, problem: LayerProblem) -> Reason | None:
    """Why the SM90 kernel of ``op`` cannot run ``site`` of the layer, or None (cutlass-dsl
    imports: ``import_error`` is checked first). Every ``gmlp.contract.gate_up`` layout runs: FC1
    reads gate and up through their own TMA descriptors, FC1 dgrad W1^T's two parts along K, the
    weight gradient writes dW1's gate and up rows apart (``split_rows``)."""
    error = import_error()
    if error is not None:
        return error
    if op not in KERNEL_MODULES:
        raise ValueError(f"{op} has no SM90 kernel")
    gated = problem.activation != "srelu"
    tokens, n, k, experts = site_gemm(site, problem.tokens, problem.hidden, problem.ffn, problem.experts, gated=gated)
    module = _module(op)
    if op in FFN_OPS:
        reason = module.problem_support(tokens, problem.hidden, problem.ffn, experts, gated=gated)
    else:  # the grouped GEMM's (T, N, K, E), the weight gradient's (T, M, N, E)
        reason = module.problem_support(tokens, n, k, experts)
    return None if reason is None else Reason(reason.kind, f"the SM90 {op} kernel: {reason.message}")
