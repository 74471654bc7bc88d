"""Host overhead of a GroupedMLP step against torch's eager layer: what Python, planning and launches cost.

Per shape (``--shapes``), on the same data and weights (balanced routing; x (T, H) bf16 and
probs (T,) fp32 take gradients): torch's eager layer (bf16 ``torch._grouped_mm`` FC1, SwiGLU
times probs, ``torch._grouped_mm`` FC2, autograd: ``gmlp.bench.mlp.baseline_layer``), then
gmlp's layer per recipe (MXFP8, bf16, FP8 blockwise) and path (``--paths``): ``default``, whatever the
dispatcher picks (``plan_paths``: each site's path), ``stub``, the dispatcher's plan with every
op replaced by a stub that only allocates its outputs (``gmlp.bench.host_stubs``: the layer's own
Python and autograd, no kernel; on the CPU the one host figure without computation in it), or a
path forced by GMLP_BACKEND while that row is built and timed (a ``FallbackError`` is recorded
as the row's ``reason``). A row without
figures (a baseline that cannot run here, a forced path, a failed compile) says why in ``reason``.

Per row, a step is ``y = layer(...); y.backward(dy)`` with the leaves' gradients set to None
first (as after ``zero_grad``):

- ``fwd_bwd_host_ms`` / ``fwd_host_ms``: the host's time to issue a warm step / forward, median
  of ``--repeats`` loops of ``--iters`` calls. On CUDA the stream is held by a sleep kernel while
  the host issues a loop (a few calls, so that its launches fit in the launch queue), so the host
  never waits on the device; ``sleep_ended_early`` says the sleep ran out before a loop was issued
  (a host sync in the step, or a sleep too short): that sample is not pure host time (``*`` in the
  table). On the CPU the step computes as it is issued (synchronously): the times include it.
- ``fwd_bwd_host_over_torch`` / ``fwd_host_over_torch``: gmlp's host ms over torch eager's (None
  without a baseline); above 1, gmlp's host is slower.
- ``device_ms`` (CUDA): device time per step, CUDA events around the held loops (the kernels back
  to back). ``device_wall_ms``: events around a synchronized loop without the hold: what a step
  costs when the host issues it, about the larger of the two. ``host_syncs_per_step``: syncs one
  step makes (``torch.cuda.set_sync_debug_mode``). ``launches_per_step``: the kernels, memsets
  and copies one step issues (``torch.profiler``), each a launch the host pays for.
  ``first_step_s``: the cold first step.
- gmlp rows: ``plan_ms``, one planning call as the forward makes it
  (``gmlp.dispatch.plan_cache.cached_plan``, a cache hit; the forward and the backward call it:
  ``plan_calls_per_step`` 2, ``plan_per_step_ms``), ``plan_uncached_ms`` (``plan_layer``, what
  the cache saves), ``plans_made_per_step`` (``plan_layer`` calls in a warm step: 0 when cached).
- ``reduce_overhead``: the same host and device figures (forward + backward) with the layer's
  forward compiled by ``torch.compile(..., mode="reduce-overhead")`` (CUDA graphs; gmlp's module,
  torch's layer function), its ratio to torch's compiled layer, ``cudagraph_skips`` (graphs
  inductor ran without CUDA graphs) and ``first_step_s`` (compilation included). CUDA only;
  ``--no-compile`` skips it.
- ``profile`` (``--profile``): cProfile of ``--profile-steps`` warm steps, the self time per step
  sorted into categories (planning, argument checks, CuTeDSL launches, Triton launches, torch
  ops and allocations, autograd, saved state, other gmlp Python, other;
  ``gmlp.bench.host_profile`` has the rules), the top functions with their calls per step, and
  the unprofiled host time of the same step: cProfile inflates Python-heavy code.

Shapes are presets (``torchtitan-debug`` 64,65536,256,768; ``small`` 8,2048,1024,1024;
``qwen3`` 128,65536,2048,768) or E,T,H,F, separated by ``;``. Defaults: on a GPU every preset,
paths default and triton, 5 calls a loop, 15 loops; on the CPU, where runs test the bench, the
tiny shape 8,256,256,256, the default path only (Triton runs only in its interpreter there),
5 calls a loop, 3 loops. The JSON (``--out``) is rewritten after every shape (``"complete":
false`` until the end) with one entry per shape. ``--before`` an earlier run's JSON prints this
run's ratios to it, per shape and side (a JSON of the bench before ``--shapes``: its rows as the
default path's).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch

from gmlp.bench.common import (
    PartialResults,
    add_cold_cache_argument,
    add_out_argument,
    environment,
    synchronize,
    use_cold_cache,
)
from gmlp.bench.host_profile import profile_steps
from gmlp.bench.host_report import SHAPE_KEYS, compare, table
from gmlp.bench.host_stubs import stubbed_ops
from gmlp.bench.host_timing import cpu_loop_ms, hold_ms, step_figures
from gmlp.bench.mlp import (
    SHAPES,
    Run,
    baseline_layer,
    expert_offsets,
    layer_tensors,
    make_layers,
    router_probs,
    split_sizes_for,
    swiglu_probs,
    training_step,
)
from gmlp.dispatch import plan_cache
from gmlp.dispatch.paths import FallbackError, Path
from gmlp.dispatch.plan import plan_layer
from gmlp.layer.module import GroupedMLP

Shape = tuple[int, int, int, int]  # experts, tokens, hidden, ffn

RECIPES = ("mxfp8", "bf16", "fp8-blockwise")  # gmlp.bench.mlp.make_layers' "gmlp-<recipe>" layers
# default: the dispatcher's choice; stub: every op only allocates its outputs (gmlp.bench.host_stubs);
# else GMLP_BACKEND
PATHS = ("default", *(path.value for path in Path), "stub")
PRESETS: dict[str, Shape] = {
    "torchtitan-debug": (64, 65536, 256, 768),
    "small": (8, 2048, 1024, 1024),
    "qwen3": SHAPES["qwen3-30b-a3b"],  # a design shape
}
DEFAULT_SHAPE: Shape = (8, 256, 256, 256)  # the CPU's: runs there test the bench
PROFILE_HOLD_MARGIN = 8.0  # the profiled host is several times slower: a longer sleep for its loops


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a run times its rows (``run``'s arguments; ``profile_steps`` 0: no profile)."""

    device: torch.device
    iters: int
    repeats: int
    plan_iters: int = 200
    warmup: int = 3
    profile_steps: int = 0
    compile: bool = True


def parse_shapes(text: str) -> list[tuple[str, Shape]]:
    """(name, shape) of each ``;``-separated item of ``--shapes``: a preset's name, or E,T,H,F
    (named by itself). ``argparse.ArgumentTypeError`` names the item that is neither."""
    shapes = []
    for item in (part.strip() for part in text.split(";")):
        if item in PRESETS:
            shapes.append((item, PRESETS[item]))
            continue
        try:
            sizes = tuple(int(size) for size in item.split(","))
        except ValueError:
            sizes = ()
        if len(sizes) != 4 or min(sizes) < 1:
            raise argparse.ArgumentTypeError(f"each ';'-separated shape must be a preset ({', '.join(PRESETS)}) or "
                                             f"four positive integers E,T,H,F; got {item!r}")
        shapes.append((",".join(map(str, sizes)), sizes))
    return shapes


def comma_names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names, each one of ``allowed``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        unknown = [name for name in names if name not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"expected comma-separated names of {list(allowed)}, got {text!r}")
        return names

    return parse


@contextlib.contextmanager
def forced_backend(path: str) -> Iterator[None]:
    """GMLP_BACKEND=``path`` inside (the plan cache keys on it), restored after; ``default``
    leaves the environment as it is; ``stub`` runs the dispatcher's plan with every op stubbed
    (``gmlp.bench.host_stubs``)."""
    if path in ("default", "stub"):
        with stubbed_ops() if path == "stub" else contextlib.nullcontext():
            yield
        return
    previous = os.environ.get("GMLP_BACKEND")
    os.environ["GMLP_BACKEND"] = path
    try:
        yield
    finally:
        if previous is None:
            del os.environ["GMLP_BACKEND"]
        else:
            os.environ["GMLP_BACKEND"] = previous


def torch_layer(x: torch.Tensor, probs: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:
    """torch's eager layer (``gmlp.bench.mlp.baseline_layer`` with the eager SwiGLU times probs)."""
    return baseline_layer(x, probs, w1, w2, offsets, swiglu_probs)


class ShapeCase:
    """One shape's data, shared by every side: x and probs (leaves that take gradients), dy,
    balanced routing, gmlp's layer per recipe and torch's weights, all with the same weights."""

    def __init__(self, shape: Shape, device: torch.device):
        experts, tokens, hidden, ffn = shape
        self.x, self.dy = layer_tensors(tokens, hidden, device)
        self.probs = router_probs(tokens, device)
        self.split_sizes = split_sizes_for("balanced", experts, tokens, device)
        self.offsets = expert_offsets(self.split_sizes)
        layers, weights = make_layers(experts, hidden, ffn, device)
        # parameters, as gmlp's are: a CUDA graph reads them in place (other inputs are copied at each replay)
        self.torch_weights = tuple(torch.nn.Parameter(weight.detach()) for weight in weights)
        self.layers: dict[str, GroupedMLP] = {recipe: layers[f"gmlp-{recipe}"] for recipe in RECIPES
                                              if f"gmlp-{recipe}" in layers}  # FP8 blockwise: H, F % 128 == 0

    def gmlp_run(self, recipe: str, compiled: bool = False) -> Run:
        """gmlp's forward (the module, or ``torch.compile(module, mode="reduce-overhead")``) and its leaves."""
        mlp = self.layers[recipe]
        call = torch.compile(mlp, mode="reduce-overhead") if compiled else mlp
        return (lambda: call(self.x, self.split_sizes, self.probs)), [self.x, self.probs, *mlp.parameters()]

    def torch_run(self, compiled: bool = False) -> Run:
        """torch's eager layer (or its function compiled with ``mode="reduce-overhead"``) and its leaves."""
        call = torch.compile(torch_layer, mode="reduce-overhead") if compiled else torch_layer
        w1, w2 = self.torch_weights
        return (lambda: call(self.x, self.probs, w1, w2, self.offsets)), [self.x, self.probs, w1, w2]

    def step(self, run: Run) -> Callable[[], None]:
        """One forward + backward of ``run`` from no gradients."""
        forward, leaves = run
        return lambda: training_step(forward, leaves, self.dy)


def plan_calls(mlp: GroupedMLP, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The planning calls by result key: ``plan`` as the forward makes it (a cache hit once the
    forward has run), ``plan_uncached`` the full plan the cache saves."""
    config = mlp.layer_config()  # as the forward op decodes it
    w1, w2 = mlp.w1, mlp.w2
    # gmlp.layer.autograd._plan's arguments
    args = (config, x.shape[0], w1.shape[0], w2.shape[1], w2.shape[2], w1.dtype, x.dtype, x.device)

    def uncached():
        tokens, *rest = args[1:]
        return plan_layer(plan_cache.layer_problem(config, plan_cache.token_class(tokens), *rest), x.device,
                          strict=config.strict)

    return {"plan": lambda: plan_cache.cached_plan(*args), "plan_uncached": uncached}


def plans_made(step: Callable[[], object], device: torch.device) -> int:
    """``plan_layer`` calls one ``step()`` makes (``gmlp.dispatch.plan_cache.plan_layer``, which the
    forward's ``cached_plan`` calls on a miss, wrapped)."""
    original, count = plan_cache.plan_layer, [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    plan_cache.plan_layer = counting
    try:
        step()
    finally:
        plan_cache.plan_layer = original
    synchronize(device)
    return count[0]


def first_step_s(step: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one step, waited for (the cold one: compilations included)."""
    start = time.perf_counter()
    step()
    synchronize(device)
    return time.perf_counter() - start


def side_figures(step: Callable[[], object], forward: Callable[[], object] | None, settings: Settings, *,
                 gmlp_side: bool) -> dict:
    """A side's timing figures after ``settings.warmup`` steps, and its profile when asked for."""
    for _ in range(settings.warmup):
        step()
    synchronize(settings.device)
    figures = step_figures(step, forward, settings.device, iters=settings.iters, repeats=settings.repeats)
    if settings.profile_steps:
        sleep_ms = hold_ms(figures["device_wall_ms"] or 0.0, settings.iters, margin=PROFILE_HOLD_MARGIN)
        figures["profile"] = profile_steps(step, settings.profile_steps, settings.device, iters=settings.iters,
                                           sleep_ms=sleep_ms, unprofiled_host_ms=figures["fwd_bwd_host_ms"],
                                           gmlp_side=gmlp_side)
    return figures


def reduce_overhead(case: ShapeCase, make_run: Callable[[], Run], settings: Settings) -> dict:
    """The figures of a forward compiled with ``mode="reduce-overhead"`` (``make_run`` compiles
    it) and its backward, or the reason there are none (no CUDA, ``--no-compile``, the exception
    the compile or a CUDA graph raised)."""
    if settings.device.type != "cuda":
        return {"reason": "needs CUDA (CUDA graphs)"}
    if not settings.compile:
        return {"reason": "not run (--no-compile)"}
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    torch.compiler.reset()  # no graph of an earlier side or path is replayed
    try:
        step = case.step(make_run())

        def graphed_step() -> None:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs may be overwritten
            step()

        row = {"first_step_s": first_step_s(graphed_step, settings.device)}
        # CUDA graph trees warm up, record, then replay: three steps at least before timing
        row.update(side_figures(graphed_step, None, dataclasses.replace(settings, warmup=max(settings.warmup, 3),
                                                                        profile_steps=0), gmlp_side=False))
    except Exception as error:  # noqa: BLE001 (any failure is recorded in the row; the other rows go on)
        return {"reason": f"torch.compile(mode='reduce-overhead'): {type(error).__name__}: {error}"}
    finally:
        torch.compiler.reset()
    row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips
    return row


def torch_row(case: ShapeCase, settings: Settings) -> dict:
    """The torch eager layer's row, or its ``reason`` where ``torch._grouped_mm`` fails here."""
    run = case.torch_run()
    step = case.step(run)
    try:
        first = first_step_s(step, settings.device)
    except (RuntimeError, NotImplementedError, AttributeError) as error:
        return {"reason": f"torch._grouped_mm (bf16) on {settings.device.type}: {type(error).__name__}: {error}"}
    return {"first_step_s": first, **side_figures(step, run[0], settings, gmlp_side=False),
            "reduce_overhead": reduce_overhead(case, lambda: case.torch_run(compiled=True), settings)}


def plan_figures(mlp: GroupedMLP, x: torch.Tensor, step: Callable[[], object], settings: Settings) -> dict:
    """The planning keys of a gmlp row (see the module docstring)."""
    planners = plan_calls(mlp, x)
    figures = {"plan_calls_per_step": 2, "plans_made_per_step": plans_made(step, settings.device)}
    for key, fn in planners.items():
        fn()
        figures[f"{key}_ms"] = statistics.median(cpu_loop_ms(fn, settings.plan_iters, settings.repeats))
    figures["plan_per_step_ms"] = figures["plan_ms"] * figures["plan_calls_per_step"]
    figures["plan_paths"] = {site: decision.path.value for site, decision in planners["plan"]().decisions.items()}
    return figures


def gmlp_row(case: ShapeCase, recipe: str, path: str, settings: Settings) -> dict:
    """gmlp's row of one recipe on one path (``forced_backend``), or its ``reason`` where that
    path cannot run (the ``FallbackError``)."""
    row = {"recipe": recipe, "path": path}
    if recipe not in case.layers:
        return {**row, "reason": f"the {recipe} recipe cannot take this shape (H and F must be multiples of 128)"}
    run = case.gmlp_run(recipe)
    step = case.step(run)
    with forced_backend(path):
        try:
            row["first_step_s"] = first_step_s(step, settings.device)
        except FallbackError as error:
            return {**row, "reason": f"FallbackError: {error}"}
        row.update(side_figures(step, run[0], settings, gmlp_side=True))
        row.update(plan_figures(case.layers[recipe], case.x, step, settings))
        row["reduce_overhead"] = reduce_overhead(case, lambda: case.gmlp_run(recipe, compiled=True), settings)
    return row


def _over(row: dict, baseline: dict, key: str) -> float | None:
    return row[key] / baseline[key] if row.get(key) and baseline.get(key) else None


def add_ratios(entry: dict) -> None:
    """Each gmlp row's host ms over torch eager's, in the same mode (None without a baseline)."""
    baseline = entry["torch_eager"]
    for row in (row for paths in entry["recipes"].values() for row in paths.values() if "reason" not in row):
        row["fwd_bwd_host_over_torch"] = _over(row, baseline, "fwd_bwd_host_ms")
        row["fwd_host_over_torch"] = _over(row, baseline, "fwd_host_ms")
        graphed = row["reduce_overhead"]
        if "reason" not in graphed:
            graphed["fwd_bwd_host_over_torch"] = _over(graphed, baseline.get("reduce_overhead", {}), "fwd_bwd_host_ms")


def bench_shape(name: str, shape: Shape, recipes: tuple[str, ...], paths: tuple[str, ...], settings: Settings) -> dict:
    """One shape's entry: its sizes, the torch eager row and gmlp's rows by recipe and path."""
    case = ShapeCase(shape, settings.device)
    entry = {"name": name, **dict(zip(SHAPE_KEYS, shape)), "recipes": {recipe: {} for recipe in recipes}}
    print(f"{name}: torch eager", file=sys.stderr, flush=True)  # progress; a hang shows where it is
    entry["torch_eager"] = torch_row(case, settings)
    for recipe in recipes:
        for path in paths:
            print(f"{name}: gmlp {recipe} {path}", file=sys.stderr, flush=True)
            entry["recipes"][recipe][path] = gmlp_row(case, recipe, path, settings)
    add_ratios(entry)
    return entry


def run(shapes: list[tuple[str, Shape]] | None = None, recipes: tuple[str, ...] = RECIPES,
        paths: tuple[str, ...] | None = None, device: torch.device | str | None = None, *, iters: int = 5,
        repeats: int | None = None, plan_iters: int = 200, warmup: int = 3, profile_steps: int = 0,
        compile: bool = True, on_shape: Callable[[dict], object] | None = None) -> dict:
    """The bench's results: environment, settings and one entry per shape (``on_shape(results)``
    after each). Defaults by device (the module docstring): shapes, paths, ``repeats`` (15 loops
    on a GPU, 3 on the CPU)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    shapes = shapes or ([*PRESETS.items()] if cuda else [(",".join(map(str, DEFAULT_SHAPE)), DEFAULT_SHAPE)])
    paths = paths or (("default", "triton") if cuda else ("default",))
    settings = Settings(device, iters, repeats or (15 if cuda else 3), plan_iters, warmup, profile_steps, compile)
    note = (f"CUDA: host times to issue loops of {iters} calls while a sleep kernel holds the stream; device_ms: "
            "the same loops' kernels" if cuda else
            "CPU: synchronous, host times include the computation; no device time; Triton only in its interpreter")
    timing = {field.name: getattr(settings, field.name) for field in dataclasses.fields(settings)[1:]}  # not device
    results = {"bench": "host", **environment(device), **timing, "paths": list(paths), "note": note, "shapes": []}
    for name, shape in shapes:
        results["shapes"].append(bench_shape(name, shape, recipes, paths, settings))
        if on_shape is not None:
            on_shape(results)
        if cuda:
            torch.cuda.empty_cache()  # the shape's tensors went with bench_shape's frame
    return results


def main(argv: list[str] | None = None) -> None:
    """``python -m gmlp.bench host``: run, print the table (and the ratios to ``--before``), write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench host", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help=f"';'-separated presets ({', '.join(PRESETS)}) or E,T,H,F (default: every preset on a "
                             f"GPU, {','.join(map(str, DEFAULT_SHAPE))} on the CPU)")
    parser.add_argument("--recipes", type=comma_names(RECIPES), default=RECIPES,
                        help=f"comma-separated, of {list(RECIPES)}")
    parser.add_argument("--paths", type=comma_names(PATHS), default=None,
                        help=f"comma-separated, of {list(PATHS)} (default: default,triton on a GPU; default on the "
                             "CPU)")
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--iters", type=int, default=5, help="calls per timed loop (default 5)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed loops, the median reported (default 15; CPU 3)")
    parser.add_argument("--plan-iters", type=int, default=200, help="planning calls per timed loop")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile(mode='reduce-overhead') rows")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile each side's warm steps (categories, top functions)")
    parser.add_argument("--profile-steps", type=int, default=20, help="steps profiled per side (default 20)")
    parser.add_argument("--before", default=None, help="an earlier run's JSON: print this run's ratios to it")
    add_out_argument(parser)
    add_cold_cache_argument(parser)
    args = parser.parse_args(argv)
    use_cold_cache(args.cold_cache)
    for name in ("iters", "repeats", "plan_iters", "profile_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    results_file = PartialResults("host", args.out)
    results = run(args.shapes, args.recipes, args.paths, args.device, iters=args.iters, repeats=args.repeats,
                  plan_iters=args.plan_iters, warmup=args.warmup,
                  profile_steps=args.profile_steps if args.profile else 0, compile=not args.no_compile,
                  on_shape=lambda partial: results_file.write(partial, complete=False))
    print(table(results))
    if args.before:
        results["compared_to"] = {**compare(results, json.loads(pathlib.Path(args.before).read_text())),
                                  "path": args.before}
        for side, ratios in results["compared_to"]["after_over_before"].items():
            print(f"{side}: after / before " + ", ".join(f"{key} {value:.3f}" for key, value in ratios.items()))
    print(f"wrote {results_file.write(results, complete=True)}")
