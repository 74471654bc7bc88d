"""Grouped MLP layer throughput: gmlp's GroupedMLP (MXFP8 and bf16) against torch's bf16 grouped GEMM.

Two baselines, in the same process on the same data and weights as gmlp's layers (every side
starts from one set of weights): ``torch._grouped_mm`` in bf16 for FC1 and FC2 with
``silu(gate) * up * probs[:, None]`` between them, forward and backward through autograd.
``torch-grouped-mm-bf16`` (the name of earlier results) runs that activation eagerly (what a
Hopper user has out of the box); ``torch-bf16-compiled-act`` runs it through ``torch.compile``
(what a careful one runs: inductor fuses it into one kernel forward and one backward, with static
shapes as a fixed-shape training run has). Every side gets the same router ``probs`` (T,), fp32, a
leaf that takes gradients: each multiplies the activation by it and computes dprobs in its
backward. Shapes (experts, routed rows T, hidden H, ffn F) are those of docs/design.md; routing balanced or
skewed (Zipf-like, with empty experts). TFLOP/s count the useful work only: 6 T H F per forward
(FC1 with 2F outputs, FC2), three times that for forward + backward. Every step starts without
gradients, as after ``optimizer.zero_grad()`` (set to None): no side pays an accumulating add into
an existing ``.grad`` (2.2 ms of a DeepSeek-like step, ``bench_results/profile-h200-*``).
``gmlp-mxfp8-reused-weights`` is a later micro-batch of a gradient-accumulation step: the
weights quantized by the first one (``weight_cache="reuse"``), the rest the same.
``gmlp-fp8-blockwise`` is the layer with the FP8 blockwise recipe (``--sides``; H and F multiples of
128); ``gmlp-fp8-blockwise-reused-weights`` (``--sides``) its later micro-batch: W's and W^T's
tiles quantized by the first (in one pass over each weight) and reused, so that it quantizes no
weight. ``gmlp-bf16-w1-apart`` is the bf16 layer with W1's gate and up as two (E, F, H) tensors, as
torchtitan keeps them (read in place: ``gmlp.contract.gate_up``). ``sonicmoe-bf16`` is SonicMoE on
the same rows (``gmlp.bench.sonicmoe``; ``--sides``, in a process of its own).
``torchao-fp8-rowwise`` is torchao's FP8 rowwise grouped GEMMs with the compiled activation
(``gmlp.bench.torchao_rowwise``; ``--sides``; every expert's rows a multiple of 16, so the
balanced routing only). ``te-fp8-blockwise`` is TransformerEngine's ``GroupedLinear`` with its
``Float8BlockScaling`` recipe, the FP8 blockwise recipe's reference, with the compiled activation
(``gmlp.bench.te_blockwise``; ``--sides``; TransformerEngine installed).

Before it is timed, each side runs one forward + backward (``torch.compile`` compiles the
activation's forward and backward there, gmlp's kernels compile on their first shape): its wall
time is reported as ``first_step_s``, outside the medians. Each row gives its forward and
forward + backward time as a ratio of both baselines of the same run: ``*_ratio_to_eager``
(``torch-grouped-mm-bf16`` over this side's time) and ``*_ratio_to_compiled_act``
(``torch-bf16-compiled-act`` over it). ``peak_step_mb`` is the device memory one training step
allocates at its peak above what was resident before it (parameters, inputs, a kept weight
cache), gradients included; ``peak_ratio_to_eager`` divides it by the eager baseline's.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
import torch.nn.functional as F

from gmlp.bench import sonicmoe, te_blockwise, torchao_rowwise
from gmlp.bench.common import (
    PartialResults,
    add_cold_cache_argument,
    add_out_argument,
    environment,
    median_ms,
    use_cold_cache,
)
from gmlp.contract.gate_up import GateUpLayout
from gmlp.dispatch.plan_cache import LayerConfig
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.layer import autograd
from gmlp.layer.module import GroupedMLP
from gmlp.mxfp8.recipe import MXFP8Recipe

SHAPES = {
    "mixtral-8x7b": (8, 16384, 4096, 14336),
    "deepseek-v3-rank": (32, 32768, 7168, 2048),
    "qwen3-30b-a3b": (128, 65536, 2048, 768),
}

EAGER_ACT = "torch-grouped-mm-bf16"
COMPILED_ACT = "torch-bf16-compiled-act"
W1_APART = "gmlp-bf16-w1-apart"  # gmlp bf16 with W1's gate and up as two tensors (torchtitan's layout)
BASELINES = {"eager": EAGER_ACT, "compiled_act": COMPILED_ACT}  # JSON ratio key suffix -> baseline
MXFP8_REUSED = "gmlp-mxfp8-reused-weights"
BLOCKWISE = "gmlp-fp8-blockwise"  # the FP8 blockwise recipe (gmlp.FP8BlockwiseRecipe), asked for with --sides
BLOCKWISE_REUSED = "gmlp-fp8-blockwise-reused-weights"  # its later micro-batch, asked for with --sides
REUSED = {MXFP8_REUSED: "gmlp-mxfp8", BLOCKWISE_REUSED: BLOCKWISE}  # a reused-weights side -> its layer
# the sides besides the baselines; SonicMoE (``gmlp.bench.sonicmoe``) needs a process of its own
DEFAULT_SIDES = ("gmlp-mxfp8", "gmlp-bf16", W1_APART, MXFP8_REUSED)
SIDES = (*DEFAULT_SIDES, BLOCKWISE, BLOCKWISE_REUSED, torchao_rowwise.SIDE, te_blockwise.SIDE, sonicmoe.SIDE)

ActivationFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (h (T, 2F), probs (T,)) -> (T, F)
Run = tuple[Callable[[], torch.Tensor], list[torch.Tensor]]  # a side's forward and the leaves it takes gradients of


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


def expert_offsets(split_sizes: torch.Tensor) -> torch.Tensor:
    """The cumulative rows per expert (E,) int32: ``torch._grouped_mm``'s ``offs`` for ``split_sizes``."""
    return torch.cumsum(split_sizes, 0, dtype=torch.int32)


def swiglu_probs(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up * probs[:, None]`` of FC1's output h (T, 2F) as [gate | up] halves, in h's
    dtype (fp32 probs promote the product; FC2 takes bf16)."""
    gate, up = h.chunk(2, dim=-1)
    return (F.silu(gate) * up * probs[:, None]).to(h.dtype)


def compiled_swiglu_probs() -> ActivationFn:
    """``swiglu_probs`` through ``torch.compile`` with static shapes (one specialization per shape,
    as a fixed-shape training run has); it compiles on its first call and first backward."""
    return torch.compile(swiglu_probs, dynamic=False)


def baseline_layer(x: torch.Tensor, probs: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, offsets: torch.Tensor,
                   activation: ActivationFn) -> torch.Tensor:
    """bf16 torch._grouped_mm FC1 -> activation(h, probs) -> FC2; w1 (E, 2F, H), w2 (E, H, F),
    offsets the cumulative rows per expert."""
    h = torch._grouped_mm(x, w1.transpose(1, 2), offs=offsets)
    return torch._grouped_mm(activation(h, probs), w2.transpose(1, 2), offs=offsets)


def make_layers(experts: int, hidden: int, ffn: int, device: torch.device
                ) -> tuple[dict[str, GroupedMLP], tuple[torch.Tensor, torch.Tensor]]:
    """gmlp's layers by name (MXFP8, bf16), and the torch baselines' (w1, w2): every side with the
    bf16 layer's weights (copies, leaves of their own)."""
    recipes = (("gmlp-mxfp8", MXFP8Recipe()), ("gmlp-bf16", None))
    if hidden % 128 == 0 and ffn % 128 == 0:  # the blockwise recipe's 128-element blocks
        recipes += ((BLOCKWISE, FP8BlockwiseRecipe()),)
    layers = {name: GroupedMLP(experts, hidden, ffn, recipe=recipe, device=device) for name, recipe in recipes}
    bf16 = layers["gmlp-bf16"]
    for name, layer in layers.items():
        if layer is not bf16:
            layer.load_state_dict(bf16.state_dict())
    return layers, (bf16.w1.detach().clone().requires_grad_(), bf16.w2.detach().clone().requires_grad_())


def layer_runs(layers: dict[str, GroupedMLP], torch_weights: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
               probs: torch.Tensor, split_sizes: torch.Tensor, compiled_act: ActivationFn,
               sides: tuple[str, ...] = DEFAULT_SIDES) -> dict[str, Run]:
    """The ``sides`` of one routing by name (the torch baselines always): gmlp's layers, the bf16
    layer with W1 apart, the MXFP8 and FP8 blockwise layers with the weights they quantize here
    (``weight_cache="update"``) reused, SonicMoE. All take x and probs."""
    for side in (BLOCKWISE, BLOCKWISE_REUSED):
        if side in sides and BLOCKWISE not in layers:
            raise ValueError(f"--sides {side}: the FP8 blockwise recipe needs H and F multiples of 128, got "
                             f"H={x.shape[1]}, F={layers['gmlp-bf16'].ffn_hidden_size}")
    w1, w2 = torch_weights
    offsets = expert_offsets(split_sizes)
    runs = {name: (lambda activation=activation: baseline_layer(x, probs, w1, w2, offsets, activation),
                   [x, probs, w1, w2])
            for name, activation in ((EAGER_ACT, swiglu_probs), (COMPILED_ACT, compiled_act))}
    for name, layer in layers.items():
        if name in sides:
            runs[name] = (lambda layer=layer: layer(x, split_sizes, probs), [x, probs, *layer.parameters()])
    if W1_APART in sides:
        runs[W1_APART] = w1_apart_run(layers["gmlp-bf16"], x, probs, split_sizes)
    for side, name in REUSED.items():
        if side in sides:
            runs[side] = reused_weights_run(layers[name], x, probs, split_sizes)
    if torchao_rowwise.SIDE in sides:
        reason = torchao_rowwise.unsupported_reason(split_sizes)
        if reason is None:
            runs[torchao_rowwise.SIDE] = torchao_rowwise.torchao_run(w1, w2, x, probs, offsets, compiled_act)
        else:
            print(f"  {torchao_rowwise.SIDE} skipped for this routing: {reason}", flush=True)
    if te_blockwise.SIDE in sides:
        runs[te_blockwise.SIDE] = te_blockwise.te_run(w1, w2, x, probs, split_sizes, compiled_act)
    if sonicmoe.SIDE in sides:
        runs[sonicmoe.SIDE] = sonicmoe.sonicmoe_run(w1, w2, x, probs, split_sizes)
    return runs


def reused_weights_run(layer: GroupedMLP, x: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor) -> Run:
    """A later micro-batch of a gradient-accumulation step: the weights quantized by the first
    (``weight_cache="update"``, run here once) and reused (``"reuse"``) at every step."""
    layer(x, split_sizes, probs, weight_cache="update")
    return (lambda: layer(x, split_sizes, probs, weight_cache="reuse"), [x, probs, *layer.parameters()])


def w1_apart_run(bf16: GroupedMLP, x: torch.Tensor, probs: torch.Tensor, split_sizes: torch.Tensor) -> Run:
    """The bf16 layer with W1's gate and up as two (E, F, H) tensors, as torchtitan keeps them
    (``GateUpLayout.SEPARATE``, read in place; the layer call of ``gmlp.integrations.torchtitan``):
    the bf16 layer's values in new leaves."""
    gate, up = (half.detach().contiguous().requires_grad_() for half in bf16.w1.chunk(2, dim=1))
    w2 = bf16.w2.detach().clone().requires_grad_()
    config = LayerConfig(activation=bf16.activation, recipe=None, bias=False, strict=None, weight_cache=None,
                         accumulate_main_grad=False, gate_up=GateUpLayout.SEPARATE).encode()
    return (lambda: autograd.grouped_mlp(x, split_sizes, probs, gate, None, w2, None, config, w3=up)[0],
            [x, probs, gate, up, w2])


def add_shapes_argument(parser, default: str) -> None:
    """``--shapes``: comma-separated names of ``SHAPES``."""
    parser.add_argument("--shapes", default=default, help=f"comma-separated, of {list(SHAPES)}")


def layer_tensors(tokens: int, hidden: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's input x (a leaf that takes gradients) and output gradient dy, bf16, seeded."""
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    return x, torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)


def router_probs(tokens: int, device: torch.device) -> torch.Tensor:
    """Router probabilities (T,), fp32 in [0, 1), a leaf that takes gradients (dprobs), seeded."""
    generator = torch.Generator(device=device).manual_seed(1)
    return torch.rand(tokens, device=device, generator=generator).requires_grad_()


def training_step(forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor], dy: torch.Tensor) -> None:
    """One training step's forward + backward, starting without gradients."""
    for leaf in leaves:
        leaf.grad = None
    forward().backward(dy)


def step_peak_mb(forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor], dy: torch.Tensor) -> float:
    """MB a training step allocates at its peak above the memory resident before it (gradients
    cleared first, so the last step's do not count)."""
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    training_step(forward, leaves, dy)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - resident) / 2**20


def time_side(forward: Callable[[], torch.Tensor], leaves: list[torch.Tensor], dy: torch.Tensor) -> dict[str, float]:
    """A side's median forward and forward + backward device ms, after one untimed first step
    (compilation included) whose wall time is reported apart as ``first_step_s``, and the peak
    memory of a step (``step_peak_mb``)."""
    start = time.perf_counter()
    training_step(forward, leaves, dy)
    torch.cuda.synchronize()
    first_step_s = time.perf_counter() - start
    return dict(forward_ms=median_ms(forward), step_ms=median_ms(lambda: training_step(forward, leaves, dy)),
                first_step_s=first_step_s, peak_step_mb=step_peak_mb(forward, leaves, dy))


def bench_shape(shape_name: str, routings: list[str], compiled_act: ActivationFn, device: torch.device,
                sides: tuple[str, ...] = DEFAULT_SIDES) -> list[dict]:
    """The JSON rows of one shape: every side under each routing, with its ratios to both baselines."""
    experts, tokens, hidden, ffn = SHAPES[shape_name]
    x, dy = layer_tensors(tokens, hidden, device)
    probs = router_probs(tokens, device)
    layers, torch_weights = make_layers(experts, hidden, ffn, device)
    useful = 6 * tokens * hidden * ffn
    rows = []
    for routing in routings:
        split_sizes = split_sizes_for(routing, experts, tokens, device)
        results = {}
        for name, (forward, leaves) in layer_runs(layers, torch_weights, x, probs, split_sizes, compiled_act,
                                                           sides).items():
            print(f"  {shape_name} {routing:>8} {name:>25}: ", end="", flush=True)  # a hang shows where it is
            result = results[name] = time_side(forward, leaves, dy)
            print(f"forward {result['forward_ms']:8.3f} ms "
                  f"({useful / result['forward_ms'] / 1e9:6.0f} TFLOP/s), forward+backward {result['step_ms']:8.3f} ms "
                  f"({3 * useful / result['step_ms'] / 1e9:6.0f} TFLOP/s), first step {result['first_step_s']:6.2f} s, "
                  f"peak {result['peak_step_mb']:8.0f} MB", flush=True)
        for name, result in results.items():
            ratios = {}
            for key, baseline in BASELINES.items():
                ratios[f"forward_ratio_to_{key}"] = results[baseline]["forward_ms"] / result["forward_ms"]
                ratios[f"step_ratio_to_{key}"] = results[baseline]["step_ms"] / result["step_ms"]
            ratios["peak_ratio_to_eager"] = result["peak_step_mb"] / results[EAGER_ACT]["peak_step_mb"]
            rows.append(dict(shape=shape_name, experts=experts, tokens=tokens, hidden=hidden, ffn=ffn, routing=routing,
                             impl=name, **result, forward_tflops=useful / result["forward_ms"] / 1e9,
                             step_tflops=3 * useful / result["step_ms"] / 1e9, **ratios))
        for baseline in BASELINES.values():
            print(f"  {shape_name} {routing:>8} forward+backward vs {baseline}: "
                  + ", ".join(f"{name} {results[baseline]['step_ms'] / result['step_ms']:.2f}"
                              for name, result in results.items()), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench mlp", description=__doc__)
    add_shapes_argument(parser, ",".join(SHAPES))
    parser.add_argument("--routing", default="balanced,skewed")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                        help=f"comma-separated, of {list(SIDES)}, beside the two torch baselines; "
                             f"{sonicmoe.SIDE} needs its own process and site directory (gmlp.bench.sonicmoe)")
    add_out_argument(parser)
    add_cold_cache_argument(parser)
    args = parser.parse_args(argv)
    sides = tuple(side.strip() for side in args.sides.split(",") if side.strip())
    if set(sides) - set(SIDES):
        parser.error(f"--sides: unknown {sorted(set(sides) - set(SIDES))}; the sides are {list(SIDES)}")
    use_cold_cache(args.cold_cache)
    device = torch.device("cuda")
    env = environment()
    compiled_act = compiled_swiglu_probs()
    rows, results = [], PartialResults("mlp", args.out)
    for shape_name in args.shapes.split(","):
        rows += bench_shape(shape_name, args.routing.split(","), compiled_act, device, sides)
        results.write(dict(environment=env, results=rows), complete=False)  # each shape kept as it ends
        torch.cuda.empty_cache()  # the shape's tensors went with bench_shape's frame
    print(f"wrote {results.write(dict(environment=env, results=rows), complete=True)}")
