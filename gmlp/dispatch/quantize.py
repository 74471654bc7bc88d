"""``quantize_mxfp8``: the public MXFP8 quantize, dispatched to the fastest path that can run it."""

from __future__ import annotations

from typing import Callable

import torch

from gmlp.contract.reasons import Reason
from gmlp.debug import active_settings as active_cross_check
from gmlp.dispatch.paths import Decision, Path, choose_path, next_path_down
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized

__all__ = ["quantize_mxfp8", "plan_quantize", "launcher"]

OP_NAME = "quantize_mxfp8"


def _problem_reason(problem: QuantizeProblem) -> Callable[[Path], Reason | None]:
    def reason(path: Path) -> Reason | None:
        if path is Path.CUTEDSL:
            from gmlp.cutedsl.quantize import problem_support
        elif path is Path.TRITON:
            from gmlp.triton_ref.quantize import problem_support
        else:
            return None
        return problem_support(problem)

    return reason


def launcher(path: Path) -> Callable[..., MXFP8Quantized]:
    """The ``quantize_mxfp8`` implementation of one path (same signature, no dispatch)."""
    if path is Path.CUTEDSL:
        from gmlp.cutedsl.quantize import quantize_mxfp8 as run
    elif path is Path.TRITON:
        from gmlp.triton_ref.quantize import quantize_mxfp8 as run
    else:
        from gmlp.mxfp8.reference import quantize_mxfp8_ref as run
    return run


def plan_quantize(x: torch.Tensor, *, strict: bool | None = None, **kwargs) -> Decision:
    """The path ``quantize_mxfp8(x, **kwargs)`` would take, and why faster ones would be skipped."""
    problem = validate_quantize_args(x, **_with_defaults(kwargs))
    return choose_path(OP_NAME, x.device, _problem_reason(problem), strict=strict)


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
    strict: bool | None = None,
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
        strict: raise instead of falling back to a slower path (default: GMLP_STRICT).

    Returns:
        ``MXFP8Quantized`` with ``rowwise`` and ``columnwise`` ``MXFP8Tensor`` (or None).
    """
    args = dict(rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes,
                element_format=element_format, scale_mode=scale_mode)
    decision = plan_quantize(x, strict=strict, **args)
    result = launcher(decision.path)(x, **args)
    settings = active_cross_check()
    if settings is not None and settings.covers_op(OP_NAME):
        _cross_check(x, args, decision.path, result, settings)
    return result


def _cross_check(x: torch.Tensor, args: dict, chosen: Path, result: MXFP8Quantized, settings) -> None:
    """Quantize again on the next path down and compare bit for bit (``gmlp.debug``)."""
    from gmlp.debug.compare import Comparison, bitwise
    from gmlp.debug.crosscheck import report, say_uncompared

    reference = next_path_down(chosen, x.device, _problem_reason(validate_quantize_args(x, **args)))
    if reference is None:
        say_uncompared(OP_NAME, chosen)
        return
    comparison = Comparison()
    bitwise(comparison, "out", result, launcher(reference)(x, **args))
    if comparison.mismatches:
        report(f"{OP_NAME} on {chosen.value} differs from {reference.value}", comparison, settings.action)
