"""``python -m gmlp.bench memory``: where a training step's memory goes. For each side of ``bench
mlp`` (torch's eager bf16 layer, gmlp bf16, gmlp MXFP8, gmlp with the FP8 blockwise recipe), one
forward + backward under the CUDA caching allocator's history
(``torch.cuda.memory._record_memory_history``): the bytes allocated after every allocation and
free (the step's timeline above the memory resident before it), its peak, and the tensors alive
at the peak grouped by the line of gmlp that allocated them (or of the bench, for torch's layer;
"autograd engine" where no Python frame is recorded).

Results as JSON (each side's peak, its groups at the peak, its timeline downsampled) and, with
``--plot``, the timelines of every side as a PNG.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from gmlp.bench.common import PartialResults, add_out_argument, environment
from gmlp.bench.mlp import (
    BLOCKWISE,
    EAGER_ACT,
    SHAPES,
    add_shapes_argument,
    compiled_swiglu_probs,
    layer_runs,
    layer_tensors,
    make_layers,
    router_probs,
    split_sizes_for,
    training_step,
)

SIDES = (EAGER_ACT, "gmlp-bf16", "gmlp-mxfp8", BLOCKWISE)
TIMELINE_POINTS = 400  # the timeline kept in the JSON, evenly spaced over the step's allocator events
NO_FRAME = "autograd engine (no Python frame)"


def origin(frames: list[dict]) -> str:
    """Where an allocation was made: the innermost frame in gmlp's own code (not the benches),
    else the innermost Python frame outside torch, else ``NO_FRAME``."""
    python = [frame for frame in frames if frame.get("filename", "").endswith(".py")]
    for accept in (lambda name: "/gmlp/" in name and "/gmlp/bench/" not in name, lambda name: "/torch/" not in name):
        for frame in python:  # innermost first
            if accept(frame["filename"]):
                path = frame["filename"].split("/gmlp/", 1)[-1] if "/gmlp/" in frame["filename"] else frame["filename"]
                return f"{path}:{frame['line']} ({frame['name']})"
    return NO_FRAME


def replay(trace: list[dict]) -> dict:
    """The step's allocator trace replayed: bytes allocated after each event (``alloc`` adds,
    ``free_requested`` subtracts, as ``torch.cuda.memory_allocated`` counts), the peak and its
    event index, and the blocks alive at the peak grouped by ``origin`` (MB and count, largest
    first). A block freed but not allocated in the trace was resident before it: not counted."""
    live: dict[int, tuple[int, str]] = {}
    allocated, timeline, peak, peak_index, at_peak = 0, [], 0, -1, {}
    for entry in trace:
        action = entry["action"]
        if action == "alloc":
            live[entry["addr"]] = (entry["size"], origin(entry.get("frames", [])))
            allocated += entry["size"]
        elif action == "free_requested" and entry["addr"] in live:
            allocated -= live.pop(entry["addr"])[0]
        else:
            continue
        timeline.append(allocated)
        if allocated > peak:
            peak, peak_index, at_peak = allocated, len(timeline) - 1, dict(live)
    groups: dict[str, list[float]] = {}
    for size, where in at_peak.values():
        group = groups.setdefault(where, [0.0, 0])
        group[0] += size / 2**20
        group[1] += 1
    ranked = sorted(groups.items(), key=lambda item: -item[1][0])
    return dict(peak_mb=peak / 2**20, peak_event=peak_index, events=len(timeline),
                at_peak=[dict(origin=where, mb=round(mb, 1), tensors=count) for where, (mb, count) in ranked],
                timeline_mb=[round(timeline[round(i * (len(timeline) - 1) / (TIMELINE_POINTS - 1))] / 2**20, 1)
                             for i in range(TIMELINE_POINTS)] if timeline else [])


def recorded_step(forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor], dy: torch.Tensor) -> dict:
    """``replay`` of one training step (after a warm-up step, gradients cleared) on this device."""
    training_step(forward, leaves, dy)
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(stacks="python", clear_history=True)
    try:
        training_step(forward, leaves, dy)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    device = torch.cuda.current_device()
    return replay(snapshot["device_traces"][device])


def plot(rows: list[dict], path: str) -> None:
    """Each shape's timelines, one line per side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(row["shape"] for row in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for row in (row for row in rows if row["shape"] == shape):
            points = row["timeline_mb"]
            ax.plot([i / (len(points) - 1) for i in range(len(points))], points,
                    label=f"{row['side']} (peak {row['peak_mb']:.0f} MB)")
        ax.set(title=f"{shape}, {rows[0]['routing']}", xlabel="step progress (allocator events)",
               ylabel="MB above resident")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shapes_argument(parser, ",".join(SHAPES))
    parser.add_argument("--routing", default="balanced", choices=("balanced", "skewed"))
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {list(SIDES)}")
    parser.add_argument("--plot", default=None, help="write the timelines as a PNG here")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    sides = [side.strip() for side in args.sides.split(",")]
    if set(sides) - set(SIDES):
        parser.error(f"--sides: unknown {sorted(set(sides) - set(SIDES))}; the sides are {list(SIDES)}")
    device, env = torch.device("cuda"), environment()
    rows, results = [], PartialResults("memory", args.out)
    for shape in args.shapes.split(","):
        experts, tokens, hidden, ffn = SHAPES[shape]
        x, dy = layer_tensors(tokens, hidden, device)
        probs = router_probs(tokens, device)
        layers, torch_weights = make_layers(experts, hidden, ffn, device)
        split_sizes = split_sizes_for(args.routing, experts, tokens, device)
        runs = layer_runs(layers, torch_weights, x, probs, split_sizes, compiled_swiglu_probs(), tuple(sides))
        for side in sides:
            row = dict(shape=shape, routing=args.routing, side=side, **recorded_step(*runs[side], dy))
            rows.append(row)
            top = ", ".join(f"{group['origin']} {group['mb']:.0f}" for group in row["at_peak"][:4])
            print(f"  {shape} {side:>22}: peak {row['peak_mb']:8.0f} MB; at the peak (MB): {top}", flush=True)
            results.write(dict(environment=env, results=rows), complete=False)
        del layers, torch_weights, runs, x, dy, probs
        torch.cuda.empty_cache()
    print(f"wrote {results.write(dict(environment=env, results=rows), complete=True)}")
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
