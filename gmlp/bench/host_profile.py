"""Where a step's host time goes: cProfile of warm steps, each function's self time put in a category.

A function's self time (cProfile's ``tottime``: time in its own code, not in the functions it
calls) counts once, in the first category whose rule matches its file and name (``category``),
so the categories, "other" included, sum to the profiled total. A call into C that cProfile does
not see as a call (a type's ``__call__`` slot, such as a compiled CuTeDSL function's) counts in
its caller's self time. cProfile's hooks cost every Python call, so Python-heavy code looks
heavier than it is: the profiled wall time against the unprofiled host time of the same step
says by how much.

On a CUDA device the steps are issued in loops behind a sleep kernel (``gmlp.bench.host_timing.held``),
the profiler on only while the host issues them, so that no launch waits on the device. Autograd
runs a CUDA backward in a thread of its own: Python 3.12's cProfile sees that thread (its time
nests under autograd's ``run_backward``), 3.11's does not (the backward's Python then counts as
autograd's self time; ``backward_seen`` says which).
"""

from __future__ import annotations

import cProfile
import functools
import pathlib
import pstats
import time
from collections.abc import Callable

import torch

import gmlp
from gmlp.bench.host_timing import held

__all__ = ["CATEGORIES", "NOTE", "TOP", "category", "markdown", "profile_steps"]

CATEGORIES = ("planning", "argument checks", "CuTeDSL launches", "Triton launches", "torch ops and allocations",
              "autograd", "saved state", "other gmlp Python", "other")
TOP = 20  # functions listed per side, by self time
NOTE = ("cProfile self times (tottime), us per step; its hooks cost every Python call, so Python-heavy code looks "
        "heavier than it is: compare the profiled wall time with the unprofiled host time")

_GMLP = pathlib.Path(gmlp.__file__).resolve().parent
_CHECK_MODULES = ("contract/operands.py", "mxfp8/problem.py", "cutedsl/sm90/_launch.py")  # argument checks
_BACKWARD = ("layer/autograd.py", "_backward_steps")  # gmlp's backward, whichever autograd.Function calls it
_C = "~"  # cProfile's file name of a function written in C


@functools.cache
def _gmlp_module(filename: str) -> str | None:
    """A file of the imported gmlp as its path in the package ("dispatch/plan.py"), else None."""
    if filename == _C or filename.startswith("<"):
        return None
    try:
        return pathlib.Path(filename).resolve().relative_to(_GMLP).as_posix()
    except ValueError:
        return None


def _gmlp_category(module: str, function: str) -> str:
    if module.startswith("bench/"):  # the bench's loop, and the torch layer's Python
        return "other"
    if module.startswith("dispatch/"):
        return "planning"
    if module == "layer/state.py":
        return "saved state"
    if module == "cutedsl/sm90/_launch.py" and function == "run":  # calls the compiled kernel
        return "CuTeDSL launches"
    if module in _CHECK_MODULES or function.lstrip("_").startswith(("check", "validate")):
        return "argument checks"
    return "other gmlp Python"


def category(filename: str, function: str) -> str:
    """The category of a cProfile entry (its file, "~" for C, and its function's name).

    gmlp's own files by module: ``gmlp.dispatch`` (the plan cache, the paths' adapters): planning;
    ``gmlp.layer.state``: saved state; ``gmlp.cutedsl.sm90._launch.run``: a CuTeDSL launch; the
    shared checks (``gmlp.contract.operands``, ``gmlp.mxfp8.problem``, the rest of ``_launch``) and
    every ``check*`` / ``validate*`` function: argument checks; ``gmlp.bench`` (the bench's loop,
    the torch layer's Python): other; the rest: other gmlp Python. Other files by a folder in their
    path, C functions by what their name says: torch's autograd (its Python, ``Tensor.backward``,
    the engine's ``run_backward``, ``Function.apply``), the rest of torch, CuTeDSL (cutlass,
    tvm_ffi, cuDNN frontend), Triton; else other.
    """
    module = _gmlp_module(filename)
    if module is not None:
        return _gmlp_category(module, function)
    folders = set(pathlib.PurePath(filename).parts[:-1])
    name = function if filename == _C else ""  # a C function's name says its type or module
    if ("torch" in folders and ("autograd" in folders or (filename.endswith("_tensor.py") and function == "backward"))
            or "_EngineBase" in name or "_FunctionBase" in name or name == "<built-in method apply>"):
        return "autograd"
    if "torch" in folders or "torch" in name:
        return "torch ops and allocations"
    if folders & {"cutlass", "tvm_ffi", "cudnn"} or "tvm_ffi" in name or "cutlass" in name:
        return "CuTeDSL launches"
    if "triton" in folders or "triton" in name:
        return "Triton launches"
    return "other"


def _label(filename: str, line: int, function: str) -> str:
    """A function as ``gmlp/dispatch/plan.py:12(plan_layer)``, a package's file from its
    site-packages folder on, a C function by its name."""
    if filename == _C:
        return function
    module = _gmlp_module(filename)
    parts = pathlib.PurePath(filename).parts
    if module is not None:
        filename = f"gmlp/{module}"
    elif "site-packages" in parts:
        filename = "/".join(parts[len(parts) - parts[::-1].index("site-packages"):])
    return f"{filename}:{line}({function})"


def profile_steps(step: Callable[[], object], steps: int, device: torch.device, *, iters: int, sleep_ms: float,
                  unprofiled_host_ms: float, gmlp_side: bool) -> dict:
    """cProfile of ``steps`` warm calls of ``step``, in loops of ``iters`` (on CUDA each behind a
    sleep of ``sleep_ms``), per step: ``categories_us`` (self time by ``CATEGORIES``), ``total_us``
    (their sum), ``profiled_wall_us`` (host time of the profiled loops), ``unprofiled_host_us``
    (``unprofiled_host_ms``, the same step timed without the profiler), ``calls``, the ``TOP``
    functions by self time (``top``: label, category, us and calls per step), ``sleep_ended_early``
    (CUDA; else None) and, for a gmlp side (``gmlp_side``), ``backward_seen`` (whether its
    backward's Python was profiled)."""
    if steps < 1 or iters < 1:
        raise ValueError(f"steps and iters must be positive, got steps={steps}, iters={iters}")
    profiler = cProfile.Profile()

    def issue(count: int) -> None:
        profiler.enable()
        try:
            for _ in range(count):
                step()
        finally:
            profiler.disable()

    wall_ms, ended_early = 0.0, False
    for first in range(0, steps, iters):
        count = min(iters, steps - first)
        if device.type == "cuda":
            loop = held(functools.partial(issue, count), sleep_ms)
            wall_ms, ended_early = wall_ms + loop.host_ms, ended_early or loop.sleep_ended_early
        else:
            began = time.perf_counter()
            issue(count)
            wall_ms += (time.perf_counter() - began) * 1e3
    # (file, line, function) -> (primitive calls, calls, tottime, cumtime, callers)
    stats = pstats.Stats(profiler).stats
    us = 1e6 / steps
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for (filename, _, function), (_, _, self_s, _, _) in stats.items():
        categories[category(filename, function)] += self_s * us
    top = sorted(stats.items(), key=lambda item: -item[1][2])[:TOP]
    result = {
        "steps": steps,
        "categories_us": {name: round(value, 3) for name, value in categories.items()},
        "total_us": round(sum(categories.values()), 3),
        "profiled_wall_us": round(wall_ms * 1e3 / steps, 3),
        "unprofiled_host_us": round(unprofiled_host_ms * 1e3, 3),
        "calls": sum(calls for _, calls, _, _, _ in stats.values()) / steps,
        "top": [{"function": _label(*key), "category": category(key[0], key[2]), "us": round(value[2] * us, 3),
                 "calls": value[1] / steps} for key, value in top],
        "sleep_ended_early": ended_early if device.type == "cuda" else None,
    }
    if gmlp_side:
        result["backward_seen"] = any((_gmlp_module(filename), function) == _BACKWARD
                                      for filename, _, function in stats)
    return result


def markdown(profiles: dict[str, dict]) -> str:
    """Profiles by side name as markdown: the categories (a column per side), then each side's top functions."""
    sides = list(profiles)

    def row(label: str, values) -> str:
        return f"| {label} | " + " | ".join(values) + " |"

    lines = [NOTE, "", row("us per step", sides), row("---", ["---:"] * len(sides))]
    lines += [row(name, [f"{profiles[side]['categories_us'][name]:.1f}" for side in sides]) for name in CATEGORIES]
    for label, key in (("total (self times)", "total_us"), ("profiled wall", "profiled_wall_us"),
                       ("unprofiled host", "unprofiled_host_us"), ("calls", "calls")):
        lines.append(row(label, [f"{profiles[side][key]:.1f}" for side in sides]))
    for side in sides:
        profile = profiles[side]
        lines += ["", f"{side}: top {len(profile['top'])} by self time ({profile['steps']} steps)"
                  + ("; the backward ran in autograd's thread, unprofiled: its Python counts as autograd"
                     if profile.get("backward_seen") is False else ""),
                  "", "| us | calls | category | function |", "| ---: | ---: | --- | --- |"]
        lines += [f"| {entry['us']:.1f} | {entry['calls']:g} | {entry['category']} | `{entry['function']}` |"
                  for entry in profile["top"]]
    return "\n".join(lines)
