"""Host overhead of a small GroupedMLP call: what Python and the planning cost per forward + backward.

On a layer small enough that the GPU is not the bottleneck (default E=8, T=256, H=F=256), for
the MXFP8 recipe and bf16 (recipe=None):

- ``fwd_bwd_host_ms``: wall time per ``y = mlp(x, split_sizes, probs); y.backward(dy)``, the
  leaves' gradients set to None first (as after ``zero_grad``), over loops of ``--iters`` calls
  with no synchronization inside (the stream is drained before a loop starts, not waited for at
  its end): the host's time to issue one step; median of ``--repeats`` loops.
- ``fwd_host_ms``: the same for the forward alone.
- ``device_ms`` (CUDA only): the device time of the same step, by CUDA events around a loop whose
  stream is held by a sleep kernel until the host has queued the whole loop, so the events time
  the kernels back to back, not the host (``device_queued`` says whether the loop was queued in
  time; a host sync inside the step makes that impossible: ``host_syncs_per_step`` counts them by
  ``torch.cuda.set_sync_debug_mode``). ``device_wall_ms``: events around a synchronized loop
  without the hold, i.e. what a step costs when the host issues it: about the larger of the two.
- ``plan_ms``: one planning call as the forward makes it: ``gmlp.dispatch.plan_cache.cached_plan``
  with the arguments ``gmlp.layer.autograd._plan`` passes, a cache hit; the op calls it in the
  forward and again in the backward (``plan_calls_per_step`` 2). For comparison
  ``plan_uncached_ms``: ``plan_layer(layer_problem(...), device, strict=...)``, what each forward
  paid before the cache. ``plans_made_per_step`` counts the ``plan_layer`` calls one warm step
  makes (0: the plan is cached).

On the CPU the torch path runs (the Triton kernels only run in the interpreter there), and
synchronously: the host times include the computation itself, and there is no device time.

``--before`` an earlier run's JSON prints this run's ratios to it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time
import warnings
from typing import Callable

import torch

import gmlp
from gmlp.bench.common import add_out_argument, environment, write_results
from gmlp.dispatch import plan_cache
from gmlp.dispatch.plan import plan_layer

RECIPES = ("mxfp8", "bf16")
DEFAULT_SHAPE = (8, 256, 256, 256)  # experts, tokens, hidden, ffn


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Case:
    """One layer and its inputs: x (T, H) bf16 and probs (T,) fp32 take gradients, balanced routing."""

    def __init__(self, recipe_name: str, experts: int, tokens: int, hidden: int, ffn: int, device: torch.device):
        recipe = gmlp.MXFP8Recipe() if recipe_name == "mxfp8" else None
        torch.manual_seed(0)
        self.mlp = gmlp.GroupedMLP(experts, hidden, ffn, recipe=recipe, device=device, dtype=torch.bfloat16)
        self.x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
        self.dy = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
        self.probs = torch.rand(tokens, device=device).requires_grad_()
        sizes = torch.full((experts,), tokens // experts, dtype=torch.int32)
        sizes[: tokens - int(sizes.sum())] += 1
        self.split_sizes = sizes.to(device)
        self.leaves = [self.x, self.probs, *self.mlp.parameters()]
        self.device = torch.device(device)

    def forward(self) -> torch.Tensor:
        return self.mlp(self.x, self.split_sizes, self.probs)

    def step(self) -> None:
        """One forward + backward, starting without gradients."""
        for leaf in self.leaves:
            leaf.grad = None
        self.forward().backward(self.dy)


def host_ms(fn: Callable[[], object], device: torch.device, iters: int, repeats: int) -> list[float]:
    """Host wall time per fn() call (ms), one sample per loop of ``iters`` calls: the queue is
    drained before each loop, and nothing inside or at the end of the loop waits for the device."""
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) * 1e3 / iters)
        _sync(device)
    return samples


def device_ms(fn: Callable[[], object], iters: int, repeats: int, host_estimate_ms: float) -> tuple[list[float], bool]:
    """Device time per fn() call (ms) by CUDA events around ``iters`` calls queued behind a sleep
    kernel that holds the stream while the host issues them; and whether every loop was queued
    before the device reached it (else the sample includes host time)."""
    samples, queued = [], True
    # cycles at about 2 GHz for three times the host's time to issue the loop, at least 1 ms
    cycles = int(max(3 * host_estimate_ms * iters, 1.0) * 2e6)
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        queued = queued and not start.query()  # the sleep still ran when the last call was queued
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return samples, queued


def device_wall_ms(fn: Callable[[], object], iters: int, repeats: int) -> list[float]:
    """Per call (ms), CUDA events around a synchronized loop of ``iters`` calls, the stream not held."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return samples


def host_syncs(fn: Callable[[], object]) -> int:
    """Synchronizing calls one fn() makes, as ``torch.cuda.set_sync_debug_mode("warn")`` reports them."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(warning.message) for warning in caught)


def plan_calls(case: Case) -> dict[str, Callable[[], object]]:
    """The planning calls by result key: ``plan`` as the forward makes it (a cache hit once the
    forward has run), ``plan_uncached`` the full plan the cache saves."""
    mlp, x = case.mlp, case.x
    config = mlp.layer_config()  # as the forward op decodes it
    w1, w2 = mlp.w1, mlp.w2
    # gmlp.layer.autograd._plan's arguments
    args = (config, x.shape[0], w1.shape[0], w2.shape[1], w2.shape[2], w1.dtype, x.dtype, x.device)

    def uncached():
        tokens, *rest = args[1:]
        return plan_layer(plan_cache.layer_problem(config, plan_cache.token_class(tokens), *rest), x.device,
                          strict=config.strict)

    return {"plan": lambda: plan_cache.cached_plan(*args), "plan_uncached": uncached}


def plans_made(case: Case) -> int:
    """``plan_layer`` calls one step makes (``gmlp.dispatch.plan_cache.plan_layer``, which the
    forward's ``cached_plan`` calls on a miss, wrapped)."""
    original, count = plan_cache.plan_layer, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    plan_cache.plan_layer = counting
    try:
        case.step()
    finally:
        plan_cache.plan_layer = original
    _sync(case.device)
    return count[0]


def _summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "samples": samples}


def bench_recipe(recipe_name: str, shape: tuple[int, int, int, int], device: torch.device, *, iters: int,
                 repeats: int, plan_iters: int, warmup: int) -> dict:
    """The result row of one recipe (see the module docstring for the keys)."""
    case = Case(recipe_name, *shape, device)
    start = time.perf_counter()
    case.step()
    _sync(device)
    first_step_s = time.perf_counter() - start
    for _ in range(warmup):
        case.step()
    _sync(device)
    planners = plan_calls(case)
    row = {"recipe": recipe_name, "first_step_s": first_step_s, "plan_calls_per_step": 2,
           "plans_made_per_step": plans_made(case)}
    step = _summary(host_ms(case.step, device, iters, repeats))
    fwd = _summary(host_ms(case.forward, device, iters, repeats))
    row.update(fwd_bwd_host_ms=step["median"], fwd_host_ms=fwd["median"], fwd_bwd_host=step, fwd_host=fwd)
    if device.type == "cuda":
        # few calls per loop: all of them must fit in the launch queue behind the sleep
        samples, queued = device_ms(case.step, min(iters, 10), repeats, step["median"])
        row.update(device_ms=statistics.median(samples), device_queued=queued,
                   device_wall_ms=statistics.median(device_wall_ms(case.step, iters, repeats)),
                   host_syncs_per_step=host_syncs(case.step))
    else:
        row.update(device_ms=None, device_queued=None, device_wall_ms=None, host_syncs_per_step=None)
    for key, fn in planners.items():
        fn()
        row[f"{key}_ms"] = statistics.median(host_ms(fn, torch.device("cpu"), plan_iters, repeats))
    row["plan_per_step_ms"] = row["plan_ms"] * row["plan_calls_per_step"]
    row["plan_paths"] = {site: d.path.value for site, d in planners["plan"]().decisions.items()}
    return row


def run(shape: tuple[int, int, int, int] = DEFAULT_SHAPE, recipes: tuple[str, ...] = RECIPES,
        device: torch.device | str | None = None, *, iters: int | None = None, repeats: int | None = None,
        plan_iters: int = 200, warmup: int = 3) -> dict:
    """The bench's results: environment, settings and one row per recipe (``iters`` and ``repeats``
    default to 50 and 7 on a GPU, 5 and 3 on the CPU, where a step computes for a few hundred ms)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    iters = iters or (5 if device.type == "cpu" else 50)
    repeats = repeats or (3 if device.type == "cpu" else 7)
    rows = {name: bench_recipe(name, shape, device, iters=iters, repeats=repeats, plan_iters=plan_iters,
                               warmup=warmup) for name in recipes}
    experts, tokens, hidden, ffn = shape
    paths = sorted({path for row in rows.values() for path in row["plan_paths"].values()})
    note = (f"CPU: the {'/'.join(paths) or 'planned'} path{'s' if len(paths) > 1 else ''} (Triton only in its "
            "interpreter), synchronous: host times include the computation; no device time"
            if device.type == "cpu" else "CUDA: host times are the time to issue the calls (no sync in the loop)")
    return {"bench": "host", **environment(device),
            "shape": {"experts": experts, "tokens": tokens, "hidden": hidden, "ffn": ffn},
            "iters": iters, "repeats": repeats, "plan_iters": plan_iters, "note": note, "recipes": rows}


def table(results: dict) -> str:
    """The results as a few lines of text: the run's checkout and device, then a row per recipe."""

    def ms(value) -> str:
        return "-" if value is None else f"{value:.4f}"

    lines = [f"gmlp {results['commit'][:12]}{' (dirty)' if results['dirty'] else ''} ({results['gmlp_path']}), "
             f"{results['device']}, torch {results['torch']}, triton {results['triton']}",
             f"shape {results['shape']}; {results['note']}",
             f"{'recipe':<6} {'fwd+bwd host':>12} {'fwd host':>9} {'device':>8} {'dev wall':>8} {'plan':>8} "
             f"{'plan uncached':>13} {'plan/step':>9} {'plans made':>10} {'syncs':>5}  (ms per call)"]
    for name, row in results["recipes"].items():
        syncs = row["host_syncs_per_step"]
        device = ms(row["device_ms"]) + ("" if row["device_queued"] in (None, True) else "*")
        lines.append(f"{name:<6} {ms(row['fwd_bwd_host_ms']):>12} {ms(row['fwd_host_ms']):>9} {device:>8} "
                     f"{ms(row['device_wall_ms']):>8} {ms(row['plan_ms']):>8} {ms(row['plan_uncached_ms']):>13} "
                     f"{ms(row['plan_per_step_ms']):>9} {row['plans_made_per_step']:>10} "
                     f"{'-' if syncs is None else syncs:>5}")
    if any(row["device_queued"] is False for row in results["recipes"].values()):
        lines.append("* the loop was not all queued behind the sleep: that device time includes host time")
    return "\n".join(lines)


def compare(results: dict, before: dict) -> dict:
    """Per recipe, this run's figures over the earlier run's (after / before)."""
    ratios = {}
    for name, row in results["recipes"].items():
        old = before["recipes"].get(name)
        if old is None:
            continue
        ratios[name] = {key: row[key] / old[key] for key in ("fwd_bwd_host_ms", "fwd_host_ms", "plan_per_step_ms")
                        if row.get(key) and old.get(key)}
        ratios[name]["fwd_bwd_host_saved_ms"] = old["fwd_bwd_host_ms"] - row["fwd_bwd_host_ms"]
    return {"commit": before.get("commit"), "device": before.get("device"), "after_over_before": ratios}


def main(argv: list[str] | None = None) -> None:
    """``python -m gmlp.bench host``: run, print the table (and the ratios to ``--before``), write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=",".join(map(str, DEFAULT_SHAPE)), help="experts,tokens,hidden,ffn")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, of {list(RECIPES)}")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--iters", type=int, default=None, help="calls per timed loop (default 50; CPU 5)")
    parser.add_argument("--repeats", type=int, default=None, help="timed loops, the median reported (default 7; CPU 3)")
    parser.add_argument("--plan-iters", type=int, default=200, help="planning calls per timed loop")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    parser.add_argument("--before", default=None, help="an earlier run's JSON: print this run's ratios to it")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    shape = tuple(int(n) for n in args.shape.split(","))
    if len(shape) != 4:
        parser.error(f"--shape takes experts,tokens,hidden,ffn, got {args.shape!r}")
    recipes = tuple(name for name in args.recipes.split(",") if name)
    if unknown := set(recipes) - set(RECIPES):
        parser.error(f"unknown recipes {sorted(unknown)}; of {list(RECIPES)}")
    results = run(shape, recipes, args.device, iters=args.iters, repeats=args.repeats, plan_iters=args.plan_iters,
                  warmup=args.warmup)
    print(table(results))
    if args.before:
        results["compared_to"] = compare(results, json.loads(pathlib.Path(args.before).read_text()))
        results["compared_to"]["path"] = args.before
        for name, ratios in results["compared_to"]["after_over_before"].items():
            print(f"{name}: after / before " + ", ".join(f"{key} {value:.3f}" for key, value in ratios.items()))
    print(f"wrote {write_results('host', results, args.out)}")
