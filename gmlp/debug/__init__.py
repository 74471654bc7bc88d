"""Debugging the fused paths: the cross-check between two implementations of every op.

``GMLP_CROSSCHECK=1`` (warn) or ``GMLP_CROSSCHECK=raise``, or, in code::

    with gmlp.debug.cross_check(ops=["fc1", "quantize_mxfp8"], action="raise"):
        y = mlp(x, split_sizes, probs)
        y.backward(dy)

Every op of the layer then also runs on the next path down (CuTeDSL -> Triton -> torch) on the
same inputs; the outputs are compared bit for bit where the spec defines them to the bit, else
within bounds derived from the formats (``gmlp.debug.compare``). A mismatch names the site, the
op, each differing output and how many of its elements differ, and the first elements: index,
expert, both values, the bound, the block scale. The settings in force when the forward runs
apply to its backward too.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator

from gmlp.debug.crosscheck import CrossCheckError, CrossCheckSettings, CrossCheckWarning

__all__ = ["cross_check", "active_settings", "CrossCheckSettings", "CrossCheckError", "CrossCheckWarning"]

_SETTINGS: contextvars.ContextVar[CrossCheckSettings | None] = contextvars.ContextVar("gmlp_cross_check", default=None)


@contextlib.contextmanager
def cross_check(ops: Iterable[str] | None = None, action: str = "warn",
                tolerance: tuple[float, float] | None = None) -> Iterator[CrossCheckSettings]:
    """Cross-check the layer's ops inside the block.

    Args:
        ops: site names (``gmlp.layer_ops.SITES``: "fc1", "quantize x", ...) or op names
            ("grouped_gemm", "quantize_mxfp8", ...) to check; None checks all.
        action: "warn" (a ``CrossCheckWarning``, and the run goes on) or "raise" (``CrossCheckError``).
        tolerance: ``(rtol, atol)`` replacing the derived bounds of the non-bitwise comparisons.
    """
    settings = CrossCheckSettings(None if ops is None else frozenset(ops), action, tolerance)
    token = _SETTINGS.set(settings)
    try:
        yield settings
    finally:
        _SETTINGS.reset(token)


def active_settings() -> CrossCheckSettings | None:
    """The cross-check in force: the innermost ``cross_check`` block, else GMLP_CROSSCHECK
    ("1": warn, "raise": raise), else None."""
    settings = _SETTINGS.get()
    if settings is not None:
        return settings
    value = os.environ.get("GMLP_CROSSCHECK", "0").strip().lower()
    if value in ("", "0", "false"):
        return None
    if value not in ("1", "true", "warn", "raise"):
        raise ValueError(f"GMLP_CROSSCHECK must be 0, 1, warn or raise, got {value!r}")
    return CrossCheckSettings(action="raise" if value == "raise" else "warn")
