"""The environment variables gmlp reads: each declared once, with its parser and what it means.

Every variable is read through ``setting(name)``, which parses its value once per value (cached)
and raises ``ValueError`` naming the variable, the value given and the accepted values. The
dispatcher calls ``check_environment()`` wherever a plan is made (a layer's first call with a
new shape or a new environment, ``explain``, ``quantize_mxfp8``), so that a typo is an error on
any machine, also where the path that reads it (a GPU's, a fallback's) never runs; ``report()``
is what ``python -m gmlp doctor`` prints. ``TRITON_INTERPRET`` is also read at the import of
``gmlp.triton_ref``, which decides there whether the interpreter fixes are installed.

The variables (declared below, but for the two SM90 ones, which their modules declare):

- ``GMLP_STRICT`` (boolean, or ``cutedsl`` | ``triton``; ``gmlp.dispatch.paths``): raise
  ``FallbackError`` where an op runs below the path named (true: ``cutedsl``, any fallback).
- ``GMLP_WARN_FALLBACK`` (boolean, ``gmlp.dispatch.paths``): warn once per (op, path, reason) when an
  op skips a faster path.
- ``GMLP_BACKEND`` (``cutedsl`` | ``triton`` | ``torch``, ``gmlp.dispatch.paths``): run that path or
  raise ``FallbackError``.
- ``GMLP_CROSSCHECK`` (``warn`` | ``raise`` or boolean, true = ``warn``, ``gmlp.debug``):
  cross-check every op against the next path down.
- ``GMLP_VALIDATE`` (boolean, ``gmlp.mxfp8.routing``): check split sizes on the host, at the cost of
  a sync, where tensors are on a GPU, and raise ``ValueError`` with them (the layer checks them
  on the device without it; CPU tensors are always checked on the host).
- ``TRITON_INTERPRET`` (boolean, Triton's own; read by ``gmlp.dispatch.paths``, ``gmlp.layer`` and
  ``gmlp.triton_ref``): the Triton kernels run in Triton's interpreter.
- ``GMLP_CACHE_DIR`` (any path, ``gmlp.cutedsl.compile_cache``): where compiled CuTeDSL kernels are
  kept (default ``$XDG_CACHE_HOME/gmlp`` or ``~/.cache/gmlp``); one the cache cannot write to is
  reported by a warning where a kernel is compiled, not an error.
- ``GMLP_COMPILE_CACHE`` (boolean, ``gmlp.cutedsl.compile_cache``): keep and load compiled CuTeDSL
  kernels (default on).
- ``GMLP_SM90_CONFIG`` (``op.knob=value,...`` or ``knob=value,...``,
  ``gmlp.cutedsl.sm90.launch_options``): force the SM90 kernels' launch knobs; its syntax, ops,
  knobs and values are checked on any machine, a knob a launch cannot take where it launches.
- ``GMLP_SM90_TUNED`` (the path of a tuned table, ``gmlp.cutedsl.sm90.tuned``): read it instead of
  the package's table (``python -m gmlp.bench tune`` writes one).
- ``GMLP_COMMIT`` (any text, ``gmlp.bench``): the commit recorded in benchmark results.

Boolean values: ``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``, in any case, as
are words; unset or empty (or blank) means the default; anything else is a ``ValueError`` (a
typo must not silently flip a mode: ``GMLP_STRICT=no`` is not strict).
"""

from __future__ import annotations

import difflib
import functools
import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

__all__ = ["TRUE_WORDS", "FALSE_WORDS", "PREFIX", "Variable", "SetVariable", "declare", "variables", "parse_setting",
           "setting", "raw_values", "check_environment", "report"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
PREFIX = "GMLP_"  # a set variable with it that gmlp does not read is reported as unknown (a misspelt name?)


def parse_setting(name: str, raw: str, words: tuple[str, ...] = (), booleans: bool = True) -> bool | str | None:
    """``raw``, the value of variable ``name``: None when empty or blank, one of ``words``
    (lower-case; compared lower-cased), else (with ``booleans``) the value of a boolean spelling.

    Raises ValueError naming the variable, its value and the accepted spellings for anything else.
    """
    value = raw.strip().lower()
    if not value:
        return None
    if value in words:
        return value
    if booleans and value in TRUE_WORDS:
        return True
    if booleans and value in FALSE_WORDS:
        return False
    spellings = (f"{yes}/{no}" for yes, no in zip(TRUE_WORDS, FALSE_WORDS)) if booleans else ()
    accepted = ", ".join((*words, *spellings))
    raise ValueError(f"environment variable {name}={raw!r}: expected one of {accepted} (any case), "
                     "or unset / empty for the default")


@dataclass(frozen=True)
class Variable:
    """An environment variable gmlp reads: what it does (``meaning``, as the doctor says it),
    ``parse`` of a set, non-blank value (ValueError naming the variable, the value and what is
    accepted), and the value when unset or blank (``default``)."""

    name: str
    meaning: str
    parse: Callable[[str], object]
    default: object = None


_VARIABLES: dict[str, Variable] = {}


def declare(name: str, meaning: str, parse: Callable[[str], object], default: object = None) -> None:
    """Declare the variable ``name`` (once; the module that reads it, at its import)."""
    if name in _VARIABLES:
        raise ValueError(f"environment variable {name} is declared twice")
    _VARIABLES[name] = Variable(name, meaning, parse, default)


def variables() -> tuple[Variable, ...]:
    """Every declared variable, in the order of declaration."""
    return tuple(_VARIABLES.values())


def setting(name: str) -> object:
    """The parsed value of the declared variable ``name`` (its default when unset or blank),
    parsed once per value; ValueError naming it for a value its parser does not accept."""
    return _parsed(name, os.environ.get(name, ""))


@functools.lru_cache(maxsize=256)  # read at every call of the layer's ops: parsed once per value
def _parsed(name: str, raw: str) -> object:
    variable = _VARIABLES.get(name)
    if variable is None:
        raise KeyError(f"environment variable {name} is not declared in gmlp.system.env "
                       f"(declared: {tuple(_VARIABLES)})")
    return variable.default if not raw.strip() else variable.parse(raw)


def raw_values() -> tuple[str | None, ...]:
    """The values of every declared variable as set (None: unset), in the order of declaration:
    what a cache of anything made from the environment keys on."""
    return tuple(map(os.environ.get, _VARIABLES))


def check_environment() -> None:
    """Parse every declared variable that is set; the first one that does not parse raises its
    ValueError. Checked once per set of values."""
    _checked(raw_values())


@functools.lru_cache(maxsize=16)  # a raise is not cached: a bad environment raises at every check
def _checked(values: tuple[str | None, ...]) -> None:
    for name, raw in zip(_VARIABLES, values):
        if raw is not None:
            _parsed(name, raw)


class SetVariable(NamedTuple):
    """A set variable, as the doctor reports it: its value, what it means, and the error its
    value raises (None when valid)."""

    name: str
    value: str
    meaning: str
    error: str | None


def report() -> list[SetVariable]:
    """Every set variable gmlp reads, and every set ``GMLP_*`` one it does not (meaning "unknown"),
    sorted by name; an invalid value is reported with its error, never raised."""
    found = []
    for name in sorted(n for n in os.environ if n in _VARIABLES or n.startswith(PREFIX)):
        raw = os.environ[name]
        variable = _VARIABLES.get(name)
        if variable is None:
            close = difflib.get_close_matches(name, _VARIABLES, n=1, cutoff=0.8)
            guess = f" (misspelt {close[0]}?)" if close else ""
            found.append(SetVariable(name, raw, f"unknown: gmlp reads no variable of this name{guess}", None))
            continue
        try:
            _parsed(name, raw)
            found.append(SetVariable(name, raw, variable.meaning, None))
        except ValueError as error:
            found.append(SetVariable(name, raw, variable.meaning, str(error)))
    return found


def _choice(name: str, words: tuple[str, ...] = (), booleans: bool = True) -> Callable[[str], object]:
    """The parser of variable ``name``'s words and (with ``booleans``) boolean spellings."""
    return functools.partial(parse_setting, name, words=words, booleans=booleans)


declare("GMLP_STRICT", "raise FallbackError where an op runs below the path named (cutedsl, triton; true = cutedsl: "
        "any fallback) instead of falling back", _choice("GMLP_STRICT", ("cutedsl", "triton")))
declare("GMLP_WARN_FALLBACK", "warn once per (op, path, activation, reason) when an op skips a faster path",
        _choice("GMLP_WARN_FALLBACK"), default=False)
declare("GMLP_BACKEND", "run every op on this path (cutedsl, triton, torch), or raise FallbackError where it cannot",
        _choice("GMLP_BACKEND", ("cutedsl", "triton", "torch"), booleans=False))
declare("GMLP_CROSSCHECK", "cross-check every op against the next path down (warn, raise; true = warn)",
        _choice("GMLP_CROSSCHECK", ("warn", "raise")))
declare("GMLP_VALIDATE", "check split sizes on the host on a GPU too (a sync per call), raising ValueError",
        _choice("GMLP_VALIDATE"), default=False)
declare("TRITON_INTERPRET", "Triton's own: run the Triton kernels in Triton's interpreter (on a CPU)",
        _choice("TRITON_INTERPRET"), default=False)
# any path: one the cache cannot write to is reported by a warning where a kernel is compiled (compile_cache)
declare("GMLP_CACHE_DIR", "the directory of the compiled CuTeDSL kernels (default $XDG_CACHE_HOME/gmlp or "
        "~/.cache/gmlp)", str)
declare("GMLP_COMPILE_CACHE", "keep and load compiled CuTeDSL kernels (default on; false: every process compiles)",
        _choice("GMLP_COMPILE_CACHE"), default=True)
declare("GMLP_COMMIT", "the commit benchmark results record (where the checkout's git metadata is missing)", str.strip)
