"""The cross-check of the public ``gmlp.quantize_mxfp8``: registered with the dispatcher
(``gmlp.dispatch.quantize.add_quantize_check``) when ``gmlp.debug`` is imported, it quantizes
again on the next path down and compares bit for bit while a cross-check covering the op is on,
recording the comparison in the cross-check's report."""

from __future__ import annotations

import torch

from gmlp.debug.compare import Comparison, bitwise
from gmlp.debug.crosscheck import last_path, report, say_uncompared
from gmlp.debug.settings import active_settings
from gmlp.dispatch.paths import Path, next_path_down
from gmlp.dispatch.quantize import OP_NAME, launcher, problem_reason
from gmlp.mxfp8.problem import validate_quantize_args
from gmlp.mxfp8.tensor import MXFP8Quantized

__all__ = ["check_quantize"]


def check_quantize(x: torch.Tensor, args: dict, chosen: Path, result: MXFP8Quantized) -> None:
    """Quantize ``x`` again on the path below ``chosen`` and compare, if the cross-check in force
    covers ``quantize_mxfp8``; nothing otherwise."""
    settings = active_settings()
    if settings is None or not settings.covers_op(OP_NAME):
        return
    reference = next_path_down(chosen, x.device, problem_reason(validate_quantize_args(x, **args), x.device))
    if reference is None:
        say_uncompared(OP_NAME, chosen)
        settings.report.add_uncompared(OP_NAME, OP_NAME, chosen.value, last_path(chosen))
        return
    comparison = Comparison()
    bitwise(comparison, "out", result, launcher(reference, x.device)(x, **args))
    settings.report.add(OP_NAME, OP_NAME, chosen.value, reference.value, comparison)
    if comparison.mismatches:
        report(f"{OP_NAME} on {chosen.value} differs from {reference.value}", comparison, settings.action)
