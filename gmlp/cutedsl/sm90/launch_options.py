"""The SM90 kernels' launch options, chosen in one place: each kernel's knobs (the tile width, the
epilogue's store, the weight gradient's K tail, clusters; the FP8 blockwise kernels' 256-column
items, clusters and pipelined promotion), from its defaults, the tuned table, a forced choice, and what the launch's
variant allows.

A launcher given None for a knob takes ``choose``'s value, built in four steps:

1. the kernel's default (``DEFAULTS``);
2. the tuned table's entry for the nearest tuned shape of the op (``gmlp.cutedsl.sm90.tuned``);
3. ``GMLP_SM90_CONFIG``'s items for the op;
4. what the variant fixes (``_fixes``): a knob the launch's variant does not take (an MXFP8
   output, a bias, 256-column items where the columns are not a multiple of 256, the pipelined
   promotion beside 256-column items) takes the one value it allows. A
   tuned choice so replaced is said in the choice's notes; a forced one is an error naming both,
   never a silent change.

``describe`` is the same choice in words for ``LayerPlan.explain``. The module imports no
cutlass-dsl: the dispatcher reads it on any machine.

``GMLP_SM90_CONFIG``: items separated by commas, each ``op.knob=value``, or ``knob=value`` for every
op that has the knob: ``store=regs``, ``grouped_gemm.tile_n=128,grouped_gemm.cluster=2``. The
module declares it (``gmlp.system.env``), so that its syntax, ops, knobs and values are checked
wherever a plan is made, on any machine; a forced knob a launch's variant does not take is an
error where the launch is chosen (``choose``).
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass

from gmlp.cutedsl.sm90 import tuned
from gmlp.system.env import FALSE_WORDS, TRUE_WORDS, declare, setting

__all__ = ["ENV", "STORES", "CLUSTERS", "TILE_WIDTHS", "QUANTIZED_TILE_N", "WIDE_COLUMNS",
           "PIPELINED_HALVES_REASON", "DEFAULTS",
           "BLOCKWISE_OPS", "LaunchChoice", "check_store", "check_cluster", "recipe_of", "forced_options", "candidates",
           "choose", "launch_options", "describe"]

ENV = "GMLP_SM90_CONFIG"
STORES = ("regs", "tma")
CLUSTERS = (1, 2)  # CTAs a cluster (along M) of the token-row kernels: alone, or paired (_cluster.PairedTile)
TILE_WIDTHS = (128, 256)
QUANTIZED_TILE_N = 128  # FC2 dgrad's quantizing epilogue: the MXFP8 block tile's columns (fc2_dgrad.py)
WIDE_COLUMNS = 256  # the FP8 blockwise GEMMs' wide items: two 128-column halves (the recipe's blocks)
# why the FP8 blockwise token-row kernels' pipelined promotion (_blockwise_k_loops) takes one half only
PIPELINED_HALVES_REASON = ("its second fp32 partial fragment fits a consumer thread's 232 registers beside one "
                           "128-column half's accumulators, not two")

# op -> its knobs and their defaults (the faster on the H200 where the table has no entry:
# bench gemm, docs/performance.md). The TMA store is every op's default where it applies.
DEFAULTS: dict[str, dict[str, object]] = {
    "grouped_gemm": dict(tile_n=256, store="tma", cluster=1),
    "fc1_forward": dict(store="tma", cluster=1),
    "fc2_dgrad": dict(tile_n=256, store="tma", cluster=1),
    "grouped_wgrad": dict(tile_n=256, ragged_tma=True, store="tma", cluster=1),
    # the FP8 blockwise recipe's kernels (wide: 256-column items where the columns allow; pipelined:
    # the promotion beside the next k-tile's wgmmas, chosen nowhere on the H100; the TMA store
    # chosen at every site and shape on the H100, 2026-12-07)
    "fc1_forward_blockwise": dict(cluster=1),
    "grouped_gemm_fp8_blockwise": dict(wide=True, cluster=1, pipelined=False, store="tma"),
    "fc2_dgrad_blockwise": dict(cluster=1, pipelined=False),
    "grouped_wgrad_fp8_blockwise": dict(wide=True, cluster=1, store="tma"),
}
BLOCKWISE_OPS = ("fc1_forward_blockwise", "grouped_gemm_fp8_blockwise", "fc2_dgrad_blockwise",
                 "grouped_wgrad_fp8_blockwise")
_BOOLEANS = {**dict.fromkeys(TRUE_WORDS, True), **dict.fromkeys(FALSE_WORDS, False)}


def check_store(store: str, bias_dtype=None) -> None:
    """Raises for a kernel config's ``store`` that is not one of ``STORES``, or that is "tma"
    beside a bias (``bias_dtype`` not None; the TMA-store epilogue adds none)."""
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")
    if store == "tma" and bias_dtype is not None:
        raise ValueError(f"store='tma' needs no bias (the TMA-store epilogue has none yet), got bias_dtype={bias_dtype}")


def check_cluster(cluster: int) -> None:
    """Raises for a kernel config's ``cluster`` that is not one of ``CLUSTERS``."""
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {CLUSTERS}, got {cluster}")


def recipe_of(op: str, quantized: bool = False) -> str:
    """The recipe (``tuned.RECIPES``) of a launch of ``op``: the FP8 blockwise kernels' own, else
    mxfp8 where the kernel writes MXFP8 outputs (``quantized``), else bf16."""
    if op in BLOCKWISE_OPS:
        return "fp8-blockwise"
    return "mxfp8" if quantized else "bf16"


@dataclass(frozen=True)
class LaunchChoice:
    """A launch's knobs (``options``, keyword arguments of the op's launcher), where they come from
    (``source``: "defaults" or the tuned entry's words), the knobs forced by ``GMLP_SM90_CONFIG``,
    and a note for each tuned or default knob the variant replaced, with why."""

    options: dict[str, object]
    source: str
    forced: tuple[str, ...]
    notes: tuple[str, ...]


def forced_options(value: str | None = None) -> dict[str, dict[str, object]]:
    """op -> {knob: value} forced by ``GMLP_SM90_CONFIG`` (or ``value``); empty when unset. Raises
    naming the variable, its value and the item for bad syntax or an unknown op, knob or value."""
    return {op: dict(items) for op, items in (setting(ENV) if value is None else _parsed(value))}


@functools.lru_cache(maxsize=8)  # parsed once per value of the variable
def _parsed(value: str) -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
    try:
        return _items(value)
    except ValueError as error:
        raise ValueError(f"environment variable {ENV}={value!r}: {error}") from None


def _items(value: str) -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
    forced: dict[str, dict[str, object]] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, equals, text = item.partition("=")
        op, _, knob = name.strip().rpartition(".")
        if not equals:
            raise ValueError(f"{item!r} is not knob=value or op.knob=value (items separated by commas)")
        if op and op not in DEFAULTS:
            raise ValueError(f"{item!r} names op {op!r}; the ops are {tuple(DEFAULTS)}")
        ops = [op] if op else [o for o, knobs in DEFAULTS.items() if knob in knobs]
        if not ops or knob not in DEFAULTS[ops[0]]:
            known = tuple(DEFAULTS[op]) if op else tuple(dict.fromkeys(k for ks in DEFAULTS.values() for k in ks))
            raise ValueError(f"{item!r} names knob {knob!r}; the knobs{f' of {op}' if op else ''} are {known}")
        parsed = _knob_value(knob, text.strip(), item)
        for o in ops:
            forced.setdefault(o, {})[knob] = parsed
    return tuple((op, tuple(items.items())) for op, items in forced.items())


def _knob_value(knob: str, text: str, item: str) -> object:
    if knob == "store":
        if text not in STORES:
            raise ValueError(f"{item!r} asks for store {text!r}; the stores are {STORES}")
        return text
    if knob == "tile_n":
        if text not in map(str, TILE_WIDTHS):
            raise ValueError(f"{item!r} asks for tile_n {text!r}; the widths are {TILE_WIDTHS}")
        return int(text)
    if knob == "cluster":
        if text not in map(str, CLUSTERS):
            raise ValueError(f"{item!r} asks for cluster {text!r}; the clusters are {CLUSTERS}")
        return int(text)
    if text.lower() not in _BOOLEANS:
        raise ValueError(f"{item!r}: {knob} takes one of {tuple(_BOOLEANS)}, got {text!r}")
    return _BOOLEANS[text.lower()]


declare(ENV, "force the SM90 kernels' launch knobs (op.knob=value or knob=value, comma-separated; ops: "
        f"{', '.join(DEFAULTS)})", _parsed, default=())


def _fixes(op: str, options: dict[str, object], *, bias: bool, quantized: bool,
           columns: int | None = None) -> dict[str, tuple[object, str]]:
    """knob -> (the only value the variant takes, why) for the knobs the launch's variant fixes,
    given the ``options`` chosen so far; ``columns``: the output columns the blockwise kernels'
    wide items split (None: any)."""
    fixed: dict[str, tuple[object, str]] = {}
    if "wide" in DEFAULTS[op] and columns is not None and columns % WIDE_COLUMNS:
        fixed["wide"] = (False, f"{columns} columns are not a multiple of {WIDE_COLUMNS} (two 128-column halves an "
                                "item)")
    if "pipelined" in DEFAULTS[op] and options.get("wide") and "wide" not in fixed:
        fixed["pipelined"] = (False, f"wide items have two halves: {PIPELINED_HALVES_REASON}")
    if quantized:
        fixed["store"] = ("regs", f"{op}'s TMA store does not take MXFP8 outputs yet")
        if op == "fc2_dgrad":
            fixed["tile_n"] = (QUANTIZED_TILE_N, "the quantizing epilogue's tile is 128 columns wide")
    if bias and op in ("grouped_gemm", "grouped_gemm_fp8_blockwise"):
        fixed["store"] = ("regs", f"{op}'s TMA store does not take a bias yet")
    return fixed


def candidates(op: str, *, quantized: bool = False) -> list[dict[str, object]]:
    """Every combination of ``op``'s knobs that a bf16 launch (with ``quantized``, one writing
    MXFP8 outputs; a blockwise op's, its recipe's) takes as it is (none of them fixed by the
    variant): the tuner's candidates, the defaults first (where the variant takes them)."""
    values = {"tile_n": TILE_WIDTHS, "store": STORES, "cluster": CLUSTERS}  # the others are booleans
    knobs = list(DEFAULTS[op])
    combos = [dict(zip(knobs, combo)) for combo in itertools.product(*(values.get(k, (False, True)) for k in knobs))]
    consistent = [c for c in combos
                  if all(c[k] == v for k, (v, _) in _fixes(op, c, bias=False, quantized=quantized).items())]
    return sorted(consistent, key=lambda c: c != DEFAULTS[op])


def choose(op: str, tokens: int, n: int, k: int, experts: int, *, given: tuple[tuple[str, object], ...] = (),
           bias: bool = False, quantized: bool = False, site: str | None = None) -> LaunchChoice:
    """The knobs of a launch of ``op`` on a (tokens x k) by (k x n) product per expert group (the
    weight gradient: its (n, k) are dW's (M, N)), for the variant the flags give. ``given``: the
    knobs the caller set, kept as they are (the kernel's config checks them). ``site``: the layer's
    site of the launch (``gmlp.dispatch.sites``), whose tuned entries come first. Raises when
    ``GMLP_SM90_CONFIG`` forces a knob the variant does not take."""
    if op not in DEFAULTS:
        raise ValueError(f"op must be one of {tuple(DEFAULTS)}, got {op!r}")
    entry = tuned.lookup(op, tokens, n, k, experts, site=site, recipe=recipe_of(op, quantized))
    options = dict(DEFAULTS[op])
    from_table = {}
    if entry is not None:
        from_table = {knob: value for knob, value in entry.options.items() if knob in options}
        options.update(from_table)
    forced = forced_options().get(op, {})
    options.update(forced)
    options.update(given)
    notes = []
    columns = k if op == "grouped_wgrad_fp8_blockwise" else n  # a weight gradient's (n, k): dW's (M, N)
    given_knobs = dict(given)
    for knob, (value, why) in _fixes(op, options, bias=bias, quantized=quantized, columns=columns).items():
        if options[knob] == value or knob in given_knobs:
            continue
        if knob in forced:
            raise ValueError(f"{ENV} forces {op}.{knob}={forced[knob]}, but {why} ({knob}={value})")
        was = f"the table's {from_table[knob]}" if knob in from_table else f"the default {options[knob]}"
        notes.append(f"{knob}={value}, not {was}: {why}")
        options[knob] = value
    source = "defaults" if entry is None else entry.words()
    return LaunchChoice(options, source, tuple(forced), tuple(notes))


@functools.lru_cache(maxsize=256)  # the layer's launches repeat the same shapes and variants
def _cached_choice(op: str, tokens: int, n: int, k: int, experts: int, given: tuple[tuple[str, object], ...],
                   environment: tuple[str | None, str | None], site: str | None, **variant: bool) -> LaunchChoice:
    return choose(op, tokens, n, k, experts, given=given, site=site, **variant)


def launch_options(op: str, tokens: int, n: int, k: int, experts: int, given: dict[str, object], *,
                   site: str | None = None, **variant: bool) -> dict[str, object]:
    """A launcher's knobs: those it was ``given`` (not None) as they are, the others ``choose``'s
    (cached per shape, variant, and values of ``GMLP_SM90_CONFIG`` and ``GMLP_SM90_TUNED``)."""
    if all(value is not None for value in given.values()):
        return given
    fixed = tuple((knob, value) for knob, value in given.items() if value is not None)
    environment = (os.environ.get(ENV), os.environ.get(tuned.ENV))
    return _cached_choice(op, tokens, n, k, experts, fixed, environment, site, **variant).options


def describe(op: str, tokens: int, n: int, k: int, experts: int, *, site: str | None = None, **variant: bool) -> str:
    """``choose``'s knobs and where they come from, in words: "tile_n=256, store=tma (tuned: ...)"."""
    try:
        choice = choose(op, tokens, n, k, experts, site=site, **variant)
    except ValueError as error:
        return f"{ENV} fails: {error}"
    knobs = ", ".join(f"{knob}={value}" for knob, value in choice.options.items())
    parts = [choice.source] + [f"{knob} forced by {ENV}" for knob in choice.forced] + list(choice.notes)
    return f"{knobs} ({'; '.join(parts)})"
