"""Grouped MLP layer throughput: gmlp's GroupedMLP (MXFP8 and bf16) against torch's bf16 grouped GEMM.

Baseline, in the same process on the same data: ``torch._grouped_mm`` in bf16 for FC1 and FC2
with an eager SwiGLU between them, forward and backward through autograd (what a Hopper user has
today). Shapes (experts, routed rows T, hidden H, ffn F) are DESIGN.md's; routing balanced or
skewed (Zipf-like, with empty experts). TFLOP/s count the useful work only: 6 T H F per forward
(FC1 with 2F outputs, FC2), three times that for forward + backward. Every step starts without
gradients, as after ``optimizer.zero_grad()`` (set to None): no side pays an accumulating add into
an existing ``.grad`` (2.2 ms of a DeepSeek-like step, ``bench_results/profile-h200-*``).
``gmlp-mxfp8-reused-weights`` is a later micro-batch of a gradient-accumulation step: the
weights quantized by the first one (``weight_cache="reuse"``), the rest the same.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from gmlp.bench.common import add_out_argument, environment, median_ms, write_results
from gmlp.mlp import GroupedMLP
from gmlp.recipe import MXFP8Recipe

SHAPES = {
    "mixtral-8x7b": (8, 16384, 4096, 14336),
    "deepseek-v3-rank": (32, 32768, 7168, 2048),
    "qwen3-30b-a3b": (128, 65536, 2048, 768),
}


def split_sizes_for(routing: str, experts: int, tokens: int, device: torch.device) -> torch.Tensor:
    """Rows per expert: equal, or Zipf-like (weight 1/(rank+1)^1.2, the last tenth of experts empty)."""
    if routing == "balanced":
        sizes = torch.full((experts,), tokens // experts, dtype=torch.int64)
        sizes[: tokens - int(sizes.sum())] += 1
    else:
        weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 1.2
        weights[experts - max(1, experts // 10):] = 0
        sizes = torch.floor(weights / weights.sum() * tokens).to(torch.int64)
        sizes[0] += tokens - int(sizes.sum())
    return sizes.to(device=device, dtype=torch.int32)


def baseline_layer(x, w1, w2, offsets):
    """bf16 torch._grouped_mm FC1 -> eager SwiGLU -> FC2; w1 (E, 2F, H), w2 (E, H, F)."""
    h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offsets)
    gate, up = h.chunk(2, dim=-1)
    return torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offsets)


def add_shapes_argument(parser, default: str) -> None:
    """``--shapes``: comma-separated names of ``SHAPES``."""
    parser.add_argument("--shapes", default=default, help=f"comma-separated, of {list(SHAPES)}")


def layer_tensors(tokens: int, hidden: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's input x (a leaf that takes gradients) and output gradient dy, bf16, seeded."""
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    return x, torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)


def training_step(forward, leaves: list[torch.Tensor], dy: torch.Tensor) -> None:
    """One training step's forward + backward, starting without gradients."""
    for leaf in leaves:
        leaf.grad = None
    forward().backward(dy)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench mlp", description=__doc__)
    add_shapes_argument(parser, ",".join(SHAPES))
    parser.add_argument("--routing", default="balanced,skewed")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    env = environment()
    rows = []
    for shape_name in args.shapes.split(","):
        experts, tokens, hidden, ffn = SHAPES[shape_name]
        x, dy = layer_tensors(tokens, hidden, device)
        layers = {name: GroupedMLP(experts, hidden, ffn, recipe=recipe, device=device)
                  for name, recipe in (("gmlp-mxfp8", MXFP8Recipe()), ("gmlp-bf16", None))}
        w1 = layers["gmlp-bf16"].w1.detach().clone().requires_grad_()
        w2 = layers["gmlp-bf16"].w2.detach().clone().requires_grad_()
        for routing in args.routing.split(","):
            split_sizes = split_sizes_for(routing, experts, tokens, device)
            offsets = torch.cumsum(split_sizes, 0, dtype=torch.int32)
            runs = {"torch-grouped-mm-bf16": (lambda: baseline_layer(x, w1, w2, offsets), [x, w1, w2])}
            for name, layer in layers.items():
                runs[name] = (lambda layer=layer: layer(x, split_sizes), [x, *layer.parameters()])
            # a later micro-batch of a gradient-accumulation step: the weights quantized by the first
            mxfp8 = layers["gmlp-mxfp8"]
            mxfp8(x, split_sizes, weight_cache="update")
            runs["gmlp-mxfp8-reused-weights"] = (lambda: mxfp8(x, split_sizes, weight_cache="reuse"),
                                                 [x, *mxfp8.parameters()])
            useful = 6 * tokens * hidden * ffn
            results = {}
            for name, (forward, leaves) in runs.items():
                forward_ms = median_ms(lambda: forward())
                step_ms = median_ms(lambda: training_step(forward, leaves, dy))
                results[name] = (forward_ms, step_ms)
                print(f"  {shape_name} {routing:>8} {name:>22}: forward {forward_ms:8.3f} ms "
                      f"({useful / forward_ms / 1e9:6.0f} TFLOP/s), forward+backward {step_ms:8.3f} ms "
                      f"({3 * useful / step_ms / 1e9:6.0f} TFLOP/s)", flush=True)
            base_forward, base_step = results["torch-grouped-mm-bf16"]
            for name, (forward_ms, step_ms) in results.items():
                rows.append(dict(shape=shape_name, experts=experts, tokens=tokens, hidden=hidden, ffn=ffn, routing=routing,
                                 impl=name, forward_ms=forward_ms, step_ms=step_ms,
                                 forward_tflops=useful / forward_ms / 1e9, step_tflops=3 * useful / step_ms / 1e9,
                                 forward_ratio_to_baseline=base_forward / forward_ms,
                                 step_ratio_to_baseline=base_step / step_ms))
            print(f"  {shape_name} {routing:>8} forward+backward vs baseline: "
                  + ", ".join(f"{name} {base_step / step:.2f}" for name, (_, step) in results.items()), flush=True)
        del layers, x, dy, w1, w2
        torch.cuda.empty_cache()
    path = write_results("mlp", dict(environment=env, results=rows), args.out)
    print(f"wrote {path}")
