"""The dispatch rules: which path runs each op, and why the faster ones could not (single source).

Paths, fastest first: ``cutedsl`` (CuTeDSL kernels), ``triton`` (Triton kernels), ``torch`` (the
spec, any device). ``PROVIDERS`` lists who serves each path (``gmlp.dispatch.providers``: one per
path and architecture); the device picks one of them. For each op, that provider is asked two
questions, each answered by ``None`` (yes) or a ``Reason``: can this system run it at all (cached
per device), and can it run this problem. The first path answering yes to both runs the op.

Environment (read at each call through ``gmlp.system.env.setting``; none of them changes which
path a setting-free run takes):

- ``GMLP_WARN_FALLBACK=1``: warn once per (op, path, reason) when an op skips a faster path.
- ``GMLP_STRICT=cutedsl|triton`` (or ``strict=``): raise ``FallbackError`` where an op runs below
  that path, the floor (``strict_floor``); ``GMLP_STRICT=1`` and ``strict=True`` are ``cutedsl``:
  any fallback raises.
- ``GMLP_BACKEND=cutedsl|triton|torch``: run that path or raise ``FallbackError``.
- ``TRITON_INTERPRET=1``: the Triton path runs in Triton's interpreter, on any device.
"""

from __future__ import annotations

import enum
import functools
import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.dispatch.caller import warn_at_caller
from gmlp.dispatch.providers import Provider, cutedsl_sm90, cutedsl_sm100, torch_path, triton_path
from gmlp.system.env import setting

__all__ = ["Path", "PATHS_FASTEST_FIRST", "PROVIDERS", "STRICT_FLOORS", "Strict", "FallbackError", "FallbackWarning",
           "Decision", "provider", "system_reason", "forced_path", "strict_floor", "choose_path", "next_path_down"]


class Path(enum.Enum):
    CUTEDSL = "cutedsl"
    TRITON = "triton"
    TORCH = "torch"


PATHS_FASTEST_FIRST = (Path.CUTEDSL, Path.TRITON, Path.TORCH)

# Who serves each path, by architecture (``Provider.architectures``; None: any device)
PROVIDERS: dict[Path, tuple[Provider, ...]] = {
    Path.CUTEDSL: (cutedsl_sm90.PROVIDER, cutedsl_sm100.PROVIDER),
    Path.TRITON: (triton_path.PROVIDER,),
    Path.TORCH: (torch_path.PROVIDER,),
}
_KERNELS = {Path.CUTEDSL: "CuTeDSL", Path.TRITON: "Triton", Path.TORCH: "torch"}  # in reasons
# strict's floors: an op on a slower path than its floor raises (torch, the last path, would be no floor)
STRICT_FLOORS = (Path.CUTEDSL, Path.TRITON)
Strict = bool | str | None  # strict=: True (= "cutedsl"), False, "cutedsl", "triton", or None (GMLP_STRICT)


class FallbackError(RuntimeError):
    """Raised in strict mode, or when a forced backend cannot run; the message gives every reason."""


class FallbackWarning(UserWarning):
    """Emitted under GMLP_WARN_FALLBACK=1 when an op does not take the fastest path."""


@dataclass(frozen=True)
class Decision:
    """The path an op takes and, for each faster path skipped, why."""

    op: str
    path: Path
    skipped: tuple[tuple[Path, Reason], ...] = field(default_factory=tuple)

    def explain(self) -> str:
        lines = [f"{self.op}: {self.path.value}"]
        lines += [f"  not {path.value}: {reason}" for path, reason in self.skipped]
        return "\n".join(lines)


def _triton_interpreter() -> bool:
    """Whether the Triton kernels run in Triton's interpreter (TRITON_INTERPRET)."""
    return setting("TRITON_INTERPRET")


def provider(path: Path, capability: tuple[int, int] | None) -> Provider | None:
    """The provider of ``path`` for a device of ``capability`` (None: not a GPU), or None if none serves it."""
    return next((candidate for candidate in PROVIDERS[path] if candidate.serves(capability)), None)


@functools.lru_cache(maxsize=None)
def _device_system_reason(path: Path, device_type: str, capability: tuple[int, int] | None, interpret: bool) -> Reason | None:
    chosen = provider(path, capability)
    if chosen is not None:
        return chosen.system(device_type, capability, interpret)
    if device_type != "cuda":
        return Reason(ReasonKind.SYSTEM, f"tensors are on {device_type}; the {_KERNELS[path]} kernels need a CUDA GPU")
    built = " and ".join(candidate.name for candidate in PROVIDERS[path])
    return Reason(ReasonKind.SYSTEM, f"compute capability {capability[0]}.{capability[1]}: the {_KERNELS[path]} "
                                     f"kernels are built for {built}")


def system_reason(path: Path, device: torch.device) -> Reason | None:
    """None if this system can run ``path`` for tensors on ``device``, else why not (cached)."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return _device_system_reason(path, device.type, capability, _triton_interpreter())


_warned: set[tuple[str, Path, Path, str]] = set()


def forced_path() -> Path | None:
    """The path named by GMLP_BACKEND, or None; an unknown name is an error."""
    name = setting("GMLP_BACKEND")
    return None if name is None else Path(name)


def strict_floor(strict: Strict) -> tuple[Path, str] | None:
    """The slowest path an op may take under ``strict`` and who asked for it ("strict=True",
    "GMLP_STRICT='triton'"), or None (no floor): True and "cutedsl" mean CuTeDSL (any fallback
    raises), "triton" Triton (an op on torch raises), False none; None reads GMLP_STRICT (the
    same words and boolean spellings). ValueError naming ``strict`` for anything else."""
    if strict is None:
        value = setting("GMLP_STRICT")
        asked = f"GMLP_STRICT={os.environ.get('GMLP_STRICT')!r}"
    elif isinstance(strict, bool) or strict in (floor.value for floor in STRICT_FLOORS):
        value, asked = strict, f"strict={strict!r}"
    else:
        raise ValueError(f"strict must be None (GMLP_STRICT), True, False or one of "
                         f"{tuple(floor.value for floor in STRICT_FLOORS)} (the slowest path an op may take; "
                         f"True = 'cutedsl'), got {strict!r}")
    if value is None or value is False:
        return None
    return (Path.CUTEDSL if value is True else Path(value)), asked


def choose_path(
    op: str,
    device: torch.device,
    problem_reason: Callable[[Path], Reason | None],
    *,
    strict: Strict = None,
    detail: str = "",
    where: str = "",
) -> Decision:
    """Pick the fastest path that can run ``op``; warn, raise or force as the settings say.

    ``problem_reason(path)`` says whether ``path`` can run this op's problem. ``detail`` (for
    example the activation) is added to warnings and errors to say which variant of the op, and
    is part of what makes a warning new; ``where`` (the call site) is only said.
    """
    label = f"{op}{f' ({detail})' if detail else ''}"
    said = f"{label}{f' at {where}' if where else ''}"
    skipped: list[tuple[Path, Reason]] = []
    forced = forced_path()
    for path in PATHS_FASTEST_FIRST:
        reason = system_reason(path, device) or problem_reason(path)
        if path is forced and reason is not None:
            raise FallbackError(f"GMLP_BACKEND={forced.value}: {said} cannot run on {forced.value}: {reason}")
        if reason is None and forced in (None, path):
            return _report(Decision(op, path, tuple(skipped)), label, said, strict)
        if reason is not None:
            skipped.append((path, reason))
    raise AssertionError(f"the torch path runs every validated problem, but {label} found none: {skipped}")


def next_path_down(chosen: Path, device: torch.device, problem_reason: Callable[[Path], Reason | None]) -> Path | None:
    """The fastest path below ``chosen`` that can run the problem (what the cross-check compares
    ``chosen`` with), or None when ``chosen`` is the last one."""
    lower = PATHS_FASTEST_FIRST[PATHS_FASTEST_FIRST.index(chosen) + 1:]
    return next((path for path in lower if (system_reason(path, device) or problem_reason(path)) is None), None)


def _report(decision: Decision, label: str, said: str, strict: Strict) -> Decision:
    """Raise (an op below the strict floor) or warn (GMLP_WARN_FALLBACK, once per op, detail, path
    and reason) about the faster paths a decision skipped."""
    skipped, chosen = decision.skipped, decision.path
    floor = strict_floor(strict)  # checked at every call, a fallback or not
    if forced_path() is not None:
        return decision
    if skipped:
        if floor is not None and PATHS_FASTEST_FIRST.index(chosen) > PATHS_FASTEST_FIRST.index(floor[0]):
            why = "; ".join(f"not {p.value}: {r}" for p, r in skipped)
            raise FallbackError(f"strict mode: {said} took the {chosen.value} path, below the {floor[0].value} floor "
                                f"({floor[1]}); {why}")
        if setting("GMLP_WARN_FALLBACK"):
            for path, reason in skipped:
                key = (label, path, chosen, str(reason))
                if key not in _warned:
                    _warned.add(key)
                    warn_at_caller(f"{said}: not {path.value} ({reason}); took {chosen.value}", FallbackWarning)
    return decision
