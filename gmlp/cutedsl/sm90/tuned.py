"""The tuned table of the SM90 kernels' launch options: per op and tuned shape, the knobs that
``python -m gmlp.bench tune`` measured fastest on a GPU (the geometric mean of the ratio to torch's
``_grouped_mm`` over balanced and skewed routing), with the shape they were measured at.

The table is ``tuned_sm90.json`` beside this module, as the tuner wrote it (its measurements are
in ``bench_results/``); ``GMLP_SM90_TUNED`` names another table file instead (declared here in
``gmlp.system.env``: a file that is missing or not a table is an error wherever a plan is made,
on any machine). Each entry names its site, the recipe of its operands (``RECIPES``) and the card
it was measured on: a launch reads the entries of its own site (the grouped GEMM runs FC2 and FC1
dgrad, the weight gradient two sites), then of those its own recipe's, then its own card's
(``torch.cuda.get_device_name``); another site's, recipe's or card's only where there is none (the
choice's words name the site, recipe and card it came from). A launch's shape class is
the tuned shape nearest to it in log space over (N, K, rows per expert): each factor of 2 in one
of them counts 1, so a shape between two tuned ones takes the closer. The table gives
preferences only: ``gmlp.cutedsl.sm90.launch_options`` applies what the launch's variant fixes
and what ``GMLP_SM90_CONFIG`` forces. No cutlass-dsl import: the dispatcher reads it anywhere.

File format: ``{"commit", "date", "measurements", "entries": [{"device", "op", "site", "recipe",
"shape", "n", "k", "rows_per_expert", "options": {knob: value}, "ratios": {routing: ratio to
torch}}]}`` (a table-level ``"device"``, the older format, is the device of entries that name none;
an entry without ``"recipe"``, from before recipes were keys, was measured on bf16 operands).
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from gmlp.system.env import declare, setting

__all__ = ["ENV", "TABLE_FILE", "RECIPES", "TunedEntry", "Table", "read_table", "table", "lookup", "current_card"]

ENV = "GMLP_SM90_TUNED"
TABLE_FILE = Path(__file__).with_name("tuned_sm90.json")
# the operands an entry was measured with: bf16, or the MXFP8 layer's, where FC1 and FC2 dgrad
# quantize their outputs in the epilogue (the layer's other GEMMs run the bf16 kernels on
# dequantized values: the bf16 entries are theirs), or the FP8 blockwise recipe's (its own kernels)
RECIPES = ("bf16", "mxfp8", "fp8-blockwise")


@dataclass(frozen=True, eq=False)  # eq=False: hashed by identity (the lookup cache), dict fields
class TunedEntry:
    """The knobs measured fastest for ``op`` at ``site`` of the layer at a named design shape."""

    op: str
    site: str
    shape: str
    n: int
    k: int
    rows_per_expert: float
    options: dict[str, object]
    ratios: dict[str, float]
    device: str
    recipe: str = "bf16"

    def distance(self, n: int, k: int, rows_per_expert: float) -> float:
        """Squared log2 distance of a launch's (N, K, rows per expert) from this entry's."""
        return sum(math.log2(max(a, 1) / max(b, 1)) ** 2
                   for a, b in ((n, self.n), (k, self.k), (rows_per_expert, self.rows_per_expert)))

    def words(self) -> str:
        recipe = "" if self.recipe == "bf16" else f" ({self.recipe})"
        return (f"tuned on the {self.device} at {self.shape}'s {self.site}{recipe}: N={self.n}, K={self.k}, "
                f"{self.rows_per_expert:g} rows/expert")


@dataclass(frozen=True, eq=False)  # one object per file read: the lookup cache keys on it
class Table:
    """A tuned table: its entries (each naming its card) and the run that wrote it last."""

    commit: str
    date: str
    measurements: str
    entries: tuple[TunedEntry, ...]

    @property
    def devices(self) -> tuple[str, ...]:
        """The cards its entries were measured on, in order of first appearance."""
        return tuple(dict.fromkeys(entry.device for entry in self.entries))


def read_table(path: Path) -> Table:
    """The table in ``path``; raises naming the file and the field for a malformed one."""
    try:
        raw = json.loads(Path(path).read_text())
        entries = tuple(TunedEntry(op=e["op"], site=e["site"], shape=e["shape"], n=int(e["n"]), k=int(e["k"]),
                                   rows_per_expert=float(e["rows_per_expert"]), options=dict(e["options"]),
                                   ratios=dict(e["ratios"]), device=e.get("device") or raw["device"],
                                   recipe=e.get("recipe", "bf16"))
                        for e in raw["entries"])
        unknown = [entry.recipe for entry in entries if entry.recipe not in RECIPES]
        if unknown:
            raise ValueError(f"recipe {unknown[0]!r} is not one of {RECIPES}")
        return Table(raw["commit"], raw["date"], raw["measurements"], entries)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"the SM90 tuned table {path} cannot be read: {type(error).__name__}: {error}") from error


@functools.lru_cache(maxsize=1)
def _package_table() -> Table | None:
    return read_table(TABLE_FILE) if TABLE_FILE.exists() else None


def _named_table(path: str) -> Table:
    """The table in the file ``GMLP_SM90_TUNED`` names (its parser: read once per value)."""
    try:
        return read_table(Path(path))
    except ValueError as error:
        raise ValueError(f"environment variable {ENV}={path!r}: {error}; expected the path of a tuned table file "
                         "(python -m gmlp.bench tune --table PATH writes one), or unset for the package's") from error


declare(ENV, "read the SM90 kernels' launch knobs from this tuned table instead of the package's", _named_table)


def table() -> Table | None:
    """The table in use (``GMLP_SM90_TUNED``'s file, else ``TABLE_FILE``); None when the package
    has none yet. A named file that is missing or malformed raises."""
    named = setting(ENV)
    return named if named is not None else _package_table()


@functools.lru_cache(maxsize=256)
def _nearest(current: Table | None, op: str, n: int, k: int, rows_per_expert: float, site: str | None,
             recipe: str, card: str | None) -> TunedEntry | None:
    candidates = [entry for entry in (current.entries if current else ()) if entry.op == op]
    candidates = [entry for entry in candidates if entry.site == site] or candidates
    candidates = [entry for entry in candidates if entry.recipe == recipe] or candidates
    candidates = [entry for entry in candidates if entry.device == card] or candidates
    return min(candidates, key=lambda entry: entry.distance(n, k, rows_per_expert), default=None)


@functools.lru_cache(maxsize=16)
def _card_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def current_card() -> str | None:
    """The name of the current CUDA device (as the tuner records it), or None without CUDA."""
    import torch

    return _card_name(torch.cuda.current_device()) if torch.cuda.is_available() else None


def lookup(op: str, tokens: int, n: int, k: int, experts: int, *, site: str | None = None, recipe: str = "bf16",
           card: str | None = None) -> TunedEntry | None:
    """The entry of ``op`` nearest to a launch on ``tokens`` rows over ``experts`` groups with this
    (N, K): among the entries of ``site`` (None: any site) if there are any, of those among the
    ones of ``recipe`` (``RECIPES``) if there are any, and of those among the ones measured on
    ``card`` (default: ``current_card()``) if there are any; None when the table has none for
    ``op``."""
    card = card if card is not None else current_card()
    return _nearest(table(), op, n, k, tokens / max(experts, 1), site, recipe, card)
