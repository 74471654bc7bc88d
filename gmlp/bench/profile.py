"""Where a layer step's device time goes: the kernels of one forward + backward, by the profiler.

For each shape and mode (``--modes``: MXFP8, bf16, the FP8 blockwise recipe), runs the
``GroupedMLP`` step a few times under ``torch.profiler`` and sums each kernel's device time per
step, grouped by kernel name (the Triton kernels carry their Python names; the rest are
torch's). Shows what bounds a mode: how much of the step the GEMMs take and how much quantizing
and dequantizing. Results as JSON.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from gmlp.bench.common import add_out_argument, environment, write_results
from gmlp.bench.mlp import SHAPES, add_shapes_argument, layer_tensors, split_sizes_for, training_step
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.layer.module import GroupedMLP
from gmlp.mxfp8.recipe import MXFP8Recipe

STEPS = 5
MODES = {"mxfp8": MXFP8Recipe, "bf16": lambda: None, "fp8-blockwise": FP8BlockwiseRecipe}  # mode -> recipe


def _kernel_times(step, steps: int) -> dict[str, float]:
    """Device ms per step of each kernel name over ``steps`` profiled calls of ``step``."""
    for _ in range(2):  # compile and warm up outside the profile
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / 1e3 / steps
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench profile", description=__doc__)
    add_shapes_argument(parser, "deepseek-v3-rank")
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--modes", default="mxfp8,bf16", help=f"comma-separated, of {list(MODES)}")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes: {unknown} not among {list(MODES)}")
    device = torch.device("cuda")
    rows = []
    for shape_name in args.shapes.split(","):
        experts, tokens, hidden, ffn = SHAPES[shape_name]
        x, dy = layer_tensors(tokens, hidden, device)
        split_sizes = split_sizes_for(args.routing, experts, tokens, device)
        for mode in modes:
            layer = GroupedMLP(experts, hidden, ffn, recipe=MODES[mode](), device=device)
            kernels = _kernel_times(lambda: training_step(lambda: layer(x, split_sizes), [x, *layer.parameters()], dy), STEPS)
            total = sum(kernels.values())
            print(f"{shape_name} {args.routing} {mode}: {total:.3f} ms of kernels per step", flush=True)
            for name, ms in kernels.items():
                if ms >= 0.01 * total:
                    print(f"  {ms:8.3f} ms {100 * ms / total:5.1f}%  {name[:100]}")
            rows.append(dict(shape=shape_name, routing=args.routing, mode=mode, kernel_ms_per_step=total,
                             kernels=kernels))
            del layer
        del x, dy
        torch.cuda.empty_cache()
    path = write_results("profile", dict(environment=environment(), results=rows), args.out)
    print(f"wrote {path}")
