"""What a cross-check did: each op it ran on two paths, with every output's largest error against
its bound, and each op it could not compare, with the reason.

A ``cross_check`` block yields its ``CrossCheckReport``, filled as the layer's ops run (forward and
backward, in whichever thread autograd runs the backward); the checks of ``GMLP_CROSSCHECK`` fill
one report of the process (``gmlp.debug.environment_report``). Nothing is printed: ``str(report)``
(``summary``) is a table, and ``compared`` / ``uncompared`` are the records themselves.
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass, field

from gmlp.debug.compare import Comparison

__all__ = ["CrossCheckReport", "OpRecord", "OutputRecord", "UncomparedRecord"]


@dataclass
class OutputRecord:
    """One output of an op over the calls compared: its elements, how many of them were outside
    their bounds (bit-for-bit outputs: differed), and for an output compared within bounds the
    largest ``|got - want|`` and the largest fraction of its element's bound that an error took
    (``bound_used``, at most 1 within bounds); both None for an output compared bit for bit."""

    elements: int = 0
    mismatches: int = 0
    max_error: float | None = None
    bound_used: float | None = None

    @property
    def bitwise(self) -> bool:
        """Whether the output is compared bit for bit (the spec defines it to the bit)."""
        return self.bound_used is None


@dataclass
class OpRecord:
    """An op compared: its site (the standalone quantize: the op's name), its op, the path it ran
    on and the path it was compared with, the calls compared, and each output's record."""

    site: str
    op: str
    path: str
    reference: str
    calls: int = 0
    outputs: dict[str, OutputRecord] = field(default_factory=dict)

    @property
    def mismatches(self) -> int:
        """Elements outside their bounds (or differing, bit for bit), over every output and call."""
        return sum(output.mismatches for output in self.outputs.values())


@dataclass
class UncomparedRecord:
    """An op the cross-check covers but could not compare: where it ran, why, how many calls."""

    site: str
    op: str
    path: str
    reason: str
    calls: int = 0


def _larger(old: float | None, new: float) -> float:
    """The larger of two errors, NaN winning (a NaN error is a finding, never hidden by a later max)."""
    if old is None or math.isnan(new):
        return new
    return old if math.isnan(old) else max(old, new)


class CrossCheckReport:
    """The record of one cross-check (a block, or ``GMLP_CROSSCHECK``'s for the process): the ops
    compared (``compared``), in the order first seen, and those not compared (``uncompared``).
    Calls of an op at one site on the same two paths add up in one record. Safe to fill from
    several threads; reading gives copies, as of that moment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._compared: dict[tuple[str, str, str, str], OpRecord] = {}
        self._uncompared: dict[tuple[str, str, str, str], UncomparedRecord] = {}

    def add(self, site: str, op: str, path: str, reference: str, comparison: Comparison) -> None:
        """Record one call's comparison of ``op`` at ``site`` on ``path`` against ``reference``."""
        with self._lock:
            record = self._compared.setdefault((site, op, path, reference), OpRecord(site, op, path, reference))
            record.calls += 1
            for name, (count, shape, _, _) in comparison.outputs.items():
                output = record.outputs.setdefault(name, OutputRecord())
                output.elements += math.prod(shape)
                output.mismatches += count
                if name in comparison.errors:
                    error, used = comparison.errors[name]
                    output.max_error = _larger(output.max_error, error)
                    output.bound_used = _larger(output.bound_used, used)

    def add_uncompared(self, site: str, op: str, path: str, reason: str) -> None:
        """Record one call of ``op`` at ``site`` on ``path`` that nothing was compared with, and why."""
        with self._lock:
            record = self._uncompared.setdefault((site, op, path, reason), UncomparedRecord(site, op, path, reason))
            record.calls += 1

    @property
    def compared(self) -> list[OpRecord]:
        """The ops compared, in the order first seen."""
        with self._lock:
            return copy.deepcopy(list(self._compared.values()))

    @property
    def uncompared(self) -> list[UncomparedRecord]:
        """The ops covered but not compared, with the reason, in the order first seen."""
        with self._lock:
            return copy.deepcopy(list(self._uncompared.values()))

    @property
    def mismatches(self) -> int:
        """Elements outside their bounds (or differing, bit for bit), over every op compared."""
        return sum(record.mismatches for record in self.compared)

    def clear(self) -> None:
        """Forget everything recorded so far."""
        with self._lock:
            self._compared.clear()
            self._uncompared.clear()

    def summary(self) -> str:
        """A table: one row per output of each op compared (elements, mismatches, largest error
        and the largest fraction of its bound, or "bit for bit"), then the ops not compared."""
        compared, uncompared = self.compared, self.uncompared
        calls = sum(record.calls for record in compared)
        mismatches = sum(record.mismatches for record in compared)
        lines = [f"cross-check: {_count(len(compared), 'op')} compared ({_count(calls, 'call')}, "
                 f"{_count(mismatches, 'mismatching element')}), {len(uncompared)} not compared"]
        rows = [("site", "op", "path", "against", "calls", "output", "elements", "mismatches", "max |diff|",
                 "of bound")]
        for record in compared:
            head = (record.site, record.op, record.path, record.reference, str(record.calls))
            for name, output in record.outputs.items():
                error = ("bit for bit", "") if output.bitwise else (f"{output.max_error:.3g}", f"{output.bound_used:.3g}")
                rows.append((*head, name, str(output.elements), str(output.mismatches), *error))
                head = ("",) * len(head)  # the op's columns on its first output's row only
        if compared:
            lines += _table(rows, right={4, 6, 7, 8, 9})
        if uncompared:
            lines.append("not compared:")
            lines += _table([("site", "op", "path", "calls", "why")] + [
                (record.site, record.op, record.path, str(record.calls), record.reason) for record in uncompared],
                right={3})
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        compared, uncompared = self.compared, self.uncompared
        mismatches = sum(record.mismatches for record in compared)
        return (f"<CrossCheckReport: {_count(len(compared), 'op')} compared, "
                f"{_count(mismatches, 'mismatching element')}, {len(uncompared)} not compared>")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _table(rows: list[tuple[str, ...]], right: set[int]) -> list[str]:
    """Rows as lines of aligned columns (the ``right`` ones to the right, the rest to the left),
    indented by two spaces."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  " + "  ".join(cell.rjust(width) if column in right else cell.ljust(width)
                             for column, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]
