"""``quantize_mxfp8``: the public MXFP8 quantize, dispatched to the fastest path that can run it.

Checks registered with ``add_quantize_check`` see every call and its result: that is how the
cross-check (``gmlp.debug``, a floor above this one) compares the quantize with the next path down,
without this module importing it.
"""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.contract.reasons import Reason
from gmlp.dispatch.paths import Decision, Path, Strict, choose_path, provider
from gmlp.dispatch.plan import implementation
from gmlp.dispatch.sites import Op, Site
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized
from gmlp.system.env import check_environment

__all__ = ["quantize_mxfp8", "plan_quantize", "launcher", "problem_reason", "add_quantize_check", "QuantizeCheck"]

OP_NAME = "quantize_mxfp8"
_PUBLIC = Site(OP_NAME, Op.QUANTIZE)  # not a layer site: the quantize's default launch settings

# (x, the call's quantize arguments, the path that ran, its result)
QuantizeCheck = Callable[[torch.Tensor, dict, Path, MXFP8Quantized], None]
_checks: list[QuantizeCheck] = []


def add_quantize_check(check: QuantizeCheck) -> None:
    """Run ``check`` after every ``quantize_mxfp8`` call (once, however often it is added)."""
    if check not in _checks:
        _checks.append(check)


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def problem_reason(problem: QuantizeProblem, device: torch.device) -> Callable[[Path], Reason | None]:
    """Whether each path's provider for ``device`` runs ``problem`` (asked after its system check)."""
    capability = _capability(device)  # once, not per path asked

    def reason(path: Path) -> Reason | None:
        return provider(path, capability).supports(Op.QUANTIZE, problem, None)

    return reason


def launcher(path: Path, device: torch.device) -> Callable[..., MXFP8Quantized]:
    """The ``quantize_mxfp8`` implementation of one path for ``device`` (same signature, no dispatch)."""
    return implementation(_PUBLIC, path, _capability(device))


def plan_quantize(x: torch.Tensor, *, strict: Strict = None, **kwargs) -> Decision:
    """The path ``quantize_mxfp8(x, **kwargs)`` would take, and why faster ones would be skipped
    (every gmlp environment variable checked first: ``gmlp.system.env.check_environment``)."""
    check_environment()
    problem = validate_quantize_args(x, **_with_defaults(kwargs))
    return choose_path(OP_NAME, x.device, problem_reason(problem, x.device), strict=strict)


def _with_defaults(kwargs: dict) -> dict:
    defaults = dict(rowwise=True, columnwise=False, swizzle=True, split_sizes=None,
                    element_format=ElementFormat.E4M3, scale_mode=ScaleMode.RCEIL)
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"unknown quantize_mxfp8 arguments: {sorted(unknown)}")
    return {**defaults, **kwargs}


def quantize_mxfp8(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    swizzle: bool = True,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat | str = ElementFormat.E4M3,
    scale_mode: ScaleMode | str = ScaleMode.RCEIL,
    strict: Strict = None,
) -> MXFP8Quantized:
    """Quantize x (M, K), bf16 or fp32, to MXFP8 in one pass over x.

    Args:
        x: (M, K) contiguous, K a multiple of 32. Rows grouped by expert when split_sizes is given.
        rowwise: write 1x32 blocks along K: data (M, K), scales (M, K/32).
        columnwise: write 32x1 blocks along M (per expert): data transposed (K, M), scales
            (K, n_blocks); see ``gmlp.mxfp8.scale_layout``.
        swizzle: write scales in the swizzled (cuBLAS / tcgen05) layout instead of compact.
        split_sizes: (E,) int tensor on x's device, rows per expert (zeros allowed); stays on
            the device. None: x is one group. Sizes that are negative or do not sum to M are
            checked eagerly on the CPU or under GMLP_VALIDATE=1 (ValueError); on a GPU,
            without that setting, they make every scale byte 0xFF (NaN) instead (no host sync).
        element_format: E4M3 (default) or E5M2 elements: a ``gmlp.ElementFormat`` or its value
            ("e4m3", "e5m2").
        scale_mode: RCEIL (default) or FLOOR: a ``gmlp.ScaleMode`` or its value ("rceil", "floor").
        strict: raise ``FallbackError`` instead of running below a path: True or "cutedsl" below
            CuTeDSL (any fallback), "triton" below Triton (on torch), False never; None (the
            default): GMLP_STRICT.

    Returns:
        ``MXFP8Quantized`` with ``rowwise`` and ``columnwise`` ``MXFP8Tensor`` (or None).
    """
    args = dict(rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes,
                element_format=element_format, scale_mode=scale_mode)
    decision = plan_quantize(x, strict=strict, **args)
    result = launcher(decision.path, x.device)(x, **args)
    for check in _checks:
        check(x, args, decision.path, result)
    return result
