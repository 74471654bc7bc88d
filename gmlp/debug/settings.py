"""The cross-check's settings: the ``cross_check`` blocks and ``GMLP_CROSSCHECK``, which one is in
force, and where each records what it compared (a block's report, or the process's for the
environment setting)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator

from gmlp.debug.crosscheck import CrossCheckSettings
from gmlp.debug.record import CrossCheckReport
from gmlp.system.env import setting

__all__ = ["cross_check", "active_settings", "environment_report"]

_SETTINGS: contextvars.ContextVar[CrossCheckSettings | None] = contextvars.ContextVar("gmlp_cross_check", default=None)
# the open blocks of the process, innermost last: what a thread without a block of its own sees
# (autograd's backward threads)
_OPEN_BLOCKS: list[CrossCheckSettings] = []
# what the checks of GMLP_CROSSCHECK compared, over the process (each block has its own report)
_ENVIRONMENT_REPORT = CrossCheckReport()


@contextlib.contextmanager
def cross_check(ops: str | Iterable[str] | None = None, action: str = "warn",
                tolerance: tuple[float, float] | None = None) -> Iterator[CrossCheckReport]:
    """Cross-check the layer's ops inside the block; yields the block's ``CrossCheckReport``,
    which records every op compared (with each output's largest error against its bound) and
    every op not compared, with the reason, forward and backward: ``print(report)`` after the
    block shows the table. An eager backward run after the block, of a forward run inside it, is
    checked and recorded there too (a compiled backward takes the settings in force when it runs).

    Args:
        ops: a site name (``gmlp.dispatch.sites.SITES``: "fc1", "quantize x", ...) or op name
            ("grouped_gemm", "quantize_mxfp8", ...), or several of them, to check; None checks
            all. An unknown name is a ValueError.
        action: "warn" (a ``CrossCheckWarning``, and the run goes on) or "raise" (``CrossCheckError``).
        tolerance: ``(rtol, atol)`` replacing the derived bounds of the non-bitwise comparisons.
    """
    settings = CrossCheckSettings(_names(ops), action, tolerance)
    token = _SETTINGS.set(settings)
    _OPEN_BLOCKS.append(settings)
    try:
        yield settings.report
    finally:
        _OPEN_BLOCKS.remove(settings)
        _SETTINGS.reset(token)


def _names(ops: str | Iterable[str] | None) -> frozenset[str] | None:
    """The names ``cross_check`` was given, as a set: a single string is one name, not its letters."""
    if ops is None:
        return None
    return frozenset([ops] if isinstance(ops, str) else ops)


def active_settings() -> CrossCheckSettings | None:
    """The cross-check in force: the innermost ``cross_check`` block of this context, else the
    innermost open one of the process (a backward thread's case), else GMLP_CROSSCHECK
    ("warn" or a true boolean spelling such as "1" / "yes": warn; "raise": raise; unset, empty
    or a false spelling: off), else None."""
    settings = _SETTINGS.get()
    if settings is not None:
        return settings
    if _OPEN_BLOCKS:
        return _OPEN_BLOCKS[-1]
    value = setting("GMLP_CROSSCHECK")
    if value is None or value is False:
        return None
    return CrossCheckSettings(action="warn" if value is True else value, report=_ENVIRONMENT_REPORT)


def environment_report() -> CrossCheckReport:
    """The report of the cross-check that ``GMLP_CROSSCHECK`` turns on: every op it compared, or
    could not compare, in this process so far (``clear()`` starts it again). Ops checked inside a
    ``cross_check`` block are recorded in that block's report instead."""
    return _ENVIRONMENT_REPORT
