"""``python -m gmlp.bench torchtitan``: a torchtitan MoE model (by default qwen3's debug model)
trained with each experts backend, the same weights and tokens: loss per step, tokens/s, MFU and
the experts' share of a profiled step (JSON), then a plot.

``--model`` picks torchtitan's registry flavor (``gmlp.bench.torchtitan_models.MODELS``: the
debug model, Qwen3-30B-A3B, DeepSeek-V3-16B); ``--layers N`` keeps its first N blocks, ``--layers
auto`` as many as ``--gpu-memory-gb`` holds by ``torchtitan_models.layers_that_fit``.

The runs differ only in the ``--override.imports`` flag (parsed by torchtitan's own
``parse_cli_imports`` and applied by its ``apply_overrides``, as its trainer does):

- ``stock``: torchtitan's ``GroupedExperts`` (three bf16 ``torch._grouped_mm`` calls);
- ``torchtitan-fused``: torchtitan's own ``fused_grouped_experts`` override (one GEMM over an
  interleaved w13, a fused SiLU-and-mul): the same model as stock, rounded differently, so its
  distance from stock is the bf16 noise that the gmlp bf16 run is judged against;
- ``gmlp-bf16``, ``gmlp-mxfp8``, ``gmlp-fp8-blockwise``: gmlp's experts
  (``gmlp.integrations.torchtitan``) in each recipe;
- ``torchao-fp8-rowwise`` (not in the default ``--runs``): no flag but torchtitan's model converter
  ``Float8GroupedExpertsConverter`` (torchao's FP8 rowwise grouped GEMMs, token groups padded to
  16 rows), applied by the model registry as the trainer applies converters; needs torchao and
  an SM89+ GPU, and runs eager here, as every run does (torchao recommends compiling it).

The attention is torchtitan's attention block with a causal SDPA core (``causal_sdpa``, an
override of ``FlexAttention.Config`` in this module, in every run): torchtitan 0.3.0's own cores
need what the H200 machine lacks (flex: a mask builder of torch newer than 2.11; varlen: the FA3
package on Hopper). Each sequence is one document, so causal attention is what flex computes.

Every run starts from the stock model's initial weights (loaded through each module's state-dict
hooks) and sees the same synthetic tokens: sequences of a fixed random Markov chain (each token
has a few likely successors), so the loss falls towards the chain's entropy, which is recorded.
The loop is plain PyTorch around torchtitan's model (AdamW with torchtitan's default settings,
linear warm-up, cross-entropy): torchtitan's trainer needs a tokenizer and a dataset that its
wheel does not ship (and packages the GPU machine lacks). ``--plot`` draws the curves of a JSON, ``--table`` the markdown table of several
(``gmlp.bench.torchtitan_report``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torchtitan.config import derive, override
from torchtitan.models.common.attention import FlexAttention
from torchtitan.protocols.module import Module

from gmlp.bench.common import (
    PartialResults,
    add_cold_cache_argument,
    add_out_argument,
    device_label,
    environment,
    is_gpu_kernel,
    single_process_rendezvous,
    synchronize,
    use_cold_cache,
)
from gmlp.bench.torchtitan_models import (
    EXPERT_KERNELS,
    MODELS,
    describe,
    expert_share,
    meta_counts,
    mfu,
    registry_spec,
    resolve_layers,
)
from gmlp.bench.torchtitan_report import bars, curves, parts_table, plot, plot_seeds, summary, table
from gmlp.system.versions import package_version

RUNS = {
    "stock": [],
    "torchtitan-fused": ["torchtitan.overrides.fused_swiglu.fused_grouped_experts"],
    "gmlp-bf16": ['gmlp.integrations.torchtitan.gmlp_experts={"recipe": "bf16"}'],
    "gmlp-mxfp8": ["gmlp.integrations.torchtitan.gmlp_experts"],
    "gmlp-fp8-blockwise": ['gmlp.integrations.torchtitan.gmlp_experts={"recipe": "fp8_blockwise"}'],
}
TORCHAO_RUN = "torchao-fp8-rowwise"
KNOWN_RUNS = [*RUNS, TORCHAO_RUN]
FLAVOR = MODELS["debug"][1]  # the default model's flavor (qwen3's MoE debug model)
SUCCESSORS = 4  # likely next tokens per token in the synthetic Markov chain
CHAIN_VOCAB = 8192  # the chain's tokens are the model's first ones: its dense transition table is vocab^2 floats


def torch_shims() -> list[str]:
    """Placeholders for names that torchtitan's model packages import from a newer torch than this
    one, and that this bench never uses; each is named in the results. torchtitan 0.3.0's qwen3
    package imports its FSDP helpers, which import ``torch.distributed.fsdp.DataParallelMeshDims``
    (not in torch 2.11); this bench applies ``fully_shard`` itself, without them."""
    import torch.distributed.fsdp as fsdp

    shims = []
    if not hasattr(fsdp, "DataParallelMeshDims"):
        version = torch.__version__

        class DataParallelMeshDims:
            def __init__(self, *args, **kwargs):
                raise NotImplementedError(f"torch {version} has no torch.distributed.fsdp.DataParallelMeshDims: "
                                          "torchtitan's FSDP helpers need a newer torch")

        fsdp.DataParallelMeshDims = DataParallelMeshDims
        shims.append("torch.distributed.fsdp.DataParallelMeshDims: a placeholder that raises if used (imported by "
                     "torchtitan's FSDP helpers, which this bench does not call)")
    return shims


def torchao_shims(runs: list[str]) -> list[str]:
    """Aliases that let torchao's FP8 rowwise run import beside gmlp's CuTeDSL; each is named in the
    results. torchao 0.17's MoE training package imports its CuTeDSL utilities (its MXFP8 kernels
    for SM100, which the FP8 rowwise run never calls) whenever CuTeDSL's packages are installed,
    from ``cutlass.base_dsl._mlir_helpers``, which the CuTeDSL that gmlp pins (4.8.1) has as
    ``cutlass._mlir_helpers``: without the alias the torchao run fails at the model's build."""
    import importlib
    import importlib.util

    if TORCHAO_RUN not in runs or importlib.util.find_spec("cutlass") is None:
        return []
    import cutlass.base_dsl

    old, new = "cutlass.base_dsl._mlir_helpers", "cutlass._mlir_helpers"
    if importlib.util.find_spec(old) is not None or importlib.util.find_spec(new) is None:
        return []
    helpers = importlib.import_module(new)
    sys.modules[old] = helpers
    cutlass.base_dsl._mlir_helpers = helpers
    return [f"{old}: an alias of {new} (CuTeDSL {package_version('nvidia-cutlass-dsl')}), imported by torchao's MoE "
            "training package, whose CuTeDSL kernels the FP8 rowwise run does not call"]


class CausalSDPAttention(Module):
    """torchtitan's inner-attention contract (q, k, v as (B, L, N, H), returns (B, L, N, H)) on
    ``F.scaled_dot_product_attention`` with a causal mask: one document per sequence."""

    @dataclass(kw_only=True, slots=True)
    class Config(Module.Config):
        pass

    def __init__(self, config: Config):
        super().__init__()

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa=False,
                out_transform=None, **kwargs):
        if attention_masks is not None or out_transform is not None or kwargs:
            raise NotImplementedError("causal_sdpa: one causal document per sequence only (no masks, no "
                                      f"out_transform, no {sorted(kwargs)})")
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                                             is_causal=True, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


@override(target=FlexAttention.Config, description="causal SDPA core (one document per sequence)")
def causal_sdpa(cfg: FlexAttention.Config) -> CausalSDPAttention.Config:
    return derive(cfg, CausalSDPAttention.Config)  # keeps the sharding config torchtitan gave the core


ATTENTION = "gmlp.bench.torchtitan.causal_sdpa"


def run_recipe(name: str) -> tuple[list[str], list]:
    """A run's override flags and torchtitan model converter configs."""
    if name == TORCHAO_RUN:
        from torchtitan.components.quantization import Float8GroupedExpertsConverter

        return [], [Float8GroupedExpertsConverter.Config()]
    return RUNS[name], []


def model_spec(flags: list[str], prepare: Callable | None = None, *, model: str = "debug", layers: int | None = None,
               converters: list | None = None):
    """torchtitan's spec of ``model`` (a key of ``MODELS``; its first ``layers`` blocks if given;
    ``converters`` applied by its registry) with the causal SDPA core and the override flags,
    applied by torchtitan; ``prepare(model_config)`` first if given (as the trainer sets the
    sharding configs before it applies overrides)."""
    from torchtitan.config.override import OverrideConfig, apply_overrides, parse_cli_imports

    spec = registry_spec(model, layers, converters)
    if prepare is not None:
        prepare(spec.model)
    applied = apply_overrides(OverrideConfig(imports=parse_cli_imports([ATTENTION, *flags])), spec)
    print("\n".join(line for line in applied if ATTENTION not in line), flush=True)
    return spec


def build_model(flags: list[str], device: torch.device, state: dict | None, seed: int, *, model: str = "debug",
                layers: int | None = None, converters: list | None = None):
    """The model on ``device``: built on meta, materialized and initialized as torchtitan's trainer
    does (``to_empty``, ``init_states``), then given ``state`` (the stock model's) if any."""
    spec = model_spec(flags, model=model, layers=layers, converters=converters)
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_states()
    if state is not None:
        model.load_state_dict(copy.deepcopy(state))
    return model


def fully_sharded(model, device: torch.device):
    """The model under FSDP2 on this one device, sharded as torchtitan shards it (each block, then
    the root) with its default mixed precision: bf16 parameters in the forward, fp32 reductions."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        single_process_rendezvous()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (1,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


class MarkovTokens:
    """Sequences of a fixed random Markov chain over the vocabulary, made once for the whole run
    (so that no step times their making): each token's successors are ``SUCCESSORS`` tokens with
    random weights; step ``i``'s batch is the same in every run."""

    def __init__(self, vocab: int, steps: int, batch: int, length: int, seed: int, device: torch.device):
        generator = torch.Generator().manual_seed(seed)
        successors = torch.randint(vocab, (vocab, SUCCESSORS), generator=generator)
        weights = torch.rand(vocab, SUCCESSORS, generator=generator) + 0.1
        table = torch.zeros(vocab, vocab).scatter_add_(1, successors, weights)
        table /= table.sum(1, keepdim=True)
        stationary = torch.full((vocab,), 1.0 / vocab)
        for _ in range(200):
            stationary = stationary @ table
        logs = torch.where(table > 0, table.log(), torch.zeros(()))
        self.entropy = float(-(stationary[:, None] * table * logs).sum())  # nats per token, the loss floor
        table, rows = table.to(device), steps * batch
        on_device = torch.Generator(device=device).manual_seed(seed)
        tokens = torch.empty(rows, length + 1, dtype=torch.long, device=device)
        tokens[:, 0] = torch.randint(vocab, (rows,), generator=on_device, device=device)
        for i in range(length):
            tokens[:, i + 1] = torch.multinomial(table[tokens[:, i]], 1, generator=on_device).squeeze(1)
        self.table, self.tokens, self.batch_size, self.device = table, tokens, batch, device  # table[a, b]: P(b | a)

    def batch(self, step: int) -> torch.Tensor:
        return self.tokens[step * self.batch_size:(step + 1) * self.batch_size]


def optimizer_and_schedule(model, args):
    """AdamW with torchtitan's default settings (``default_adamw``, and its default
    ``implementation="fused"``: one kernel per tensor group, where torch's own default, foreach,
    passes over the states several times) and a linear warm-up."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup))


GC_EVERY = 50  # torchtitan's training.gc_freq default


def at_least_one(text: str) -> int:
    """An argparse type: an int of 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def add_gc_argument(parser: argparse.ArgumentParser) -> None:
    """``--gc-every``, the training benches' garbage collection (``trainer_garbage_collection``)."""
    parser.add_argument("--gc-every", type=at_least_one, default=GC_EVERY,
                        help="Python's garbage collection as torchtitan's trainer runs it: automatic collection off, "
                             "a collection every N steps (its training.gc_freq)")


@contextlib.contextmanager
def trainer_garbage_collection(every: int):
    """Python's garbage collection as torchtitan's trainer runs it (``GarbageCollection``): automatic
    collection off, a generation-1 collection first and then at every ``every``-th step, so that no
    step stalls on a collection the trainer would not make (an automatic full collection costs a
    step tens of ms of host time, in whichever process it happens). Yields the per-step call
    (the step's number from 1, as the trainer counts); automatic collection is back on after,
    as it was, since this bench trains several sides in one process."""
    from torchtitan.tools.utils import GarbageCollection

    was_enabled = gc.isenabled()
    handler = GarbageCollection(gc_freq=every)
    try:
        yield handler.run
    finally:
        if was_enabled:
            gc.enable()


def training_step(model, optimizer, schedule, tokens: torch.Tensor, micro_batch: int) -> torch.Tensor:
    """One step on ``tokens`` (rows, seq_len + 1) in micro-batches of ``micro_batch`` rows, their
    gradients accumulated as torchtitan's trainer accumulates them (each micro-batch's mean
    next-token cross-entropy over their count), then clipped AdamW; the step's mean loss."""
    chunks = tokens.split(micro_batch)
    total = None
    for chunk in chunks:
        positions = torch.arange(chunk.shape[1] - 1, device=chunk.device).expand(chunk.shape[0], -1)  # one document each
        logits = model(chunk[:, :-1], positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten()) / len(chunks)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def profiled_kernels(step: Callable[[], object], device: torch.device) -> list[tuple[str, float]]:
    """Run ``step`` under torch.profiler; each GPU kernel name and its launches' device ms (none
    on a CPU; ``common.is_gpu_kernel``: annotations are left out)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        step()
        synchronize(device)
    totals: dict[str, float] = {}
    for event in profile.events():
        if is_gpu_kernel(event):
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / 1000
    return list(totals.items())


def train(name: str, model, data: MarkovTokens, args, progress) -> dict:
    """Train ``args.steps`` steps; the loss of each and tokens/s past the warm-up steps, then
    ``args.profile_steps`` more steps (on the last batches again) profiled: the experts' share of
    their kernels' time by ``EXPERT_KERNELS[name]`` (see ``torchtitan_models.expert_share``)."""
    optimizer, schedule = optimizer_and_schedule(model, args)
    losses, tokens_per_step = [], args.batch * args.accumulate * args.seq_len
    timed_from = min(args.warmup, args.steps - 1)
    first_step_s = None
    step_host_ms = []  # each step's host time, no sync: spikes are host stalls (a collection, a compile)
    with trainer_garbage_collection(args.gc_every) as collect:
        start = first_start = time.perf_counter()
        for step in range(args.steps):
            if step == timed_from:
                synchronize(data.device)
                start = time.perf_counter()
            began = time.perf_counter()
            collect(step + 1)
            loss = training_step(model, optimizer, schedule, data.batch(step), args.batch)
            losses.append(loss)
            step_host_ms.append(1000 * (time.perf_counter() - began))
            if step == 0:  # the first step's wall time: kernels compiled, or loaded from the compile cache
                synchronize(data.device)
                first_step_s = time.perf_counter() - first_start
            if (step + 1) % 25 == 0 or step + 1 == args.steps:
                progress(f"{name}: step {step + 1}/{args.steps} loss {float(loss.detach()):.4f}")
        synchronize(data.device)
        seconds = time.perf_counter() - start
        timed_steps = args.steps - timed_from
        peak = torch.cuda.max_memory_allocated(data.device) / 1e9 if data.device.type == "cuda" else None
        batches = [data.batch(args.steps - 1 - i) for i in range(min(args.profile_steps, args.steps))]
        kernels = profiled_kernels(lambda: [training_step(model, optimizer, schedule, b, args.batch) for b in batches],
                                   data.device)
    return {"loss": [float(x) for x in losses], "tokens_per_s": timed_steps * tokens_per_step / seconds,
            "step_ms": 1000 * seconds / timed_steps, "first_step_s": first_step_s, "step_host_ms": step_host_ms,
            "peak_memory_gb": peak,
            "profile": {"steps": len(batches), **expert_share(kernels, EXPERT_KERNELS[name])} if batches else None}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench torchtitan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"comma-separated, of {', '.join(KNOWN_RUNS)} (default: all but {TORCHAO_RUN})")
    parser.add_argument("--model", choices=list(MODELS), default="debug",
                        help="torchtitan's model: " + ", ".join(f"{name} = {describe(name)}" for name in MODELS))
    parser.add_argument("--layers", default=None,
                        help="keep the model's first N blocks; 'auto': as many as --gpu-memory-gb holds (default: all)")
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="the GPU memory --layers auto plans for")
    parser.add_argument("--profile-steps", type=int, default=1,
                        help="steps profiled after the timed ones for the experts' share of kernel time (0: none)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--accumulate", type=at_least_one, default=1,
                        help="micro-batches of --batch x --seq-len per optimizer step (torchtitan's gradient "
                             "accumulation); one GPU with K of them gives the optimizer the share of the step it has "
                             "on K GPUs sharding the model (FSDP)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps (not timed)")
    add_gc_argument(parser)
    parser.add_argument("--window", type=int, default=20, help="steps averaged in the summary")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda; cpu for a smoke run (its timings mean nothing)")
    parser.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=True,
                        help="FSDP2 with bf16 parameters (torchtitan's default); --no-fsdp trains in fp32")
    parser.add_argument("--plot", type=pathlib.Path, nargs="+", default=None,
                        help="only plot results JSON: one file's curves beside it, or several seeds' gaps (--plot-out)")
    parser.add_argument("--plot-out", type=pathlib.Path, default=None,
                        help="the PNG of several --plot files' gaps, or of --table's ratios to stock")
    parser.add_argument("--table", type=pathlib.Path, nargs="+", default=None,
                        help="only print the markdown table of results JSON (runs of one model and seed may be in "
                             "several files; seeds are averaged, their spread judges the loss gaps; each seed's halfway "
                             "step and kernel speed vs stock; a gmlp run under GMLP_* settings is its own row)")
    parser.add_argument("--curves-out", type=pathlib.Path, default=None,
                        help="with --table: the PNG of each experiment's loss curves and gaps to stock, per seed")
    add_out_argument(parser)
    add_cold_cache_argument(parser)
    args = parser.parse_args(argv)
    use_cold_cache(args.cold_cache)
    if args.curves_out is not None and args.table is None:
        parser.error("--curves-out draws the files of --table; expected --table FILE ...")
    if args.table is not None:
        try:
            print(table(args.table))
            parts = parts_table(args.table)
        except ValueError as error:
            parser.error(str(error))
        if parts is not None:
            print(f"\nWhere the profiled steps go:\n\n{parts}")
        if args.plot_out is not None:
            print(bars(args.table, args.plot_out))
        if args.curves_out is not None:
            print(curves(args.table, args.curves_out))
        return
    if args.plot is not None:
        if len(args.plot) == 1:
            print(plot(args.plot[0]))
        elif args.plot_out is None:
            parser.error("--plot with several files needs --plot-out")
        else:
            print(plot_seeds(args.plot, args.plot_out))
        return
    names = args.runs.split(",")
    unknown = [name for name in names if name not in KNOWN_RUNS]
    if unknown:
        parser.error(f"--runs: unknown {unknown}; known are {KNOWN_RUNS}")
    if args.profile_steps < 0:
        parser.error(f"--profile-steps: expected 0 or more, got {args.profile_steps}")
    shims = torch_shims()  # before torchtitan's model packages are imported
    for shim in shims:
        print(f"torch {torch.__version__} shim: {shim}", flush=True)
    torchao_aliases = torchao_shims(names)
    for shim in torchao_aliases:
        print(f"torchao shim: {shim}", flush=True)
    try:
        layers = resolve_layers(args.layers, args.model, args.batch * args.seq_len, args.gpu_memory_gb)
    except ValueError as error:
        parser.error(str(error))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("python -m gmlp.bench torchtitan: no CUDA GPU here (--device cpu makes a smoke run)")
    shape = {"model": args.model, "layers": layers}
    recipes = {name: run_recipe(name) for name in names}
    counts, flops_per_token = meta_counts(args.model, layers, args.seq_len)
    stock_state = {k: v.cpu() for k, v in build_model([], device, None, args.seed, **shape).state_dict().items()}
    vocab = min(registry_spec(args.model).model.vocab_size, CHAIN_VOCAB)
    data = MarkovTokens(vocab, args.steps, args.batch * args.accumulate, args.seq_len, args.seed, device)
    print(f"token source: {vocab} tokens, {SUCCESSORS} successors each, entropy {data.entropy:.4f} nats", flush=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = PartialResults(f"torchtitan-{device_label(device)}" if device.type == "cuda" else "torchtitan-cpu-smoke",
                             args.out)
    record = {"environment": environment(device),
              "settings": {**{k: v for k, v in vars(args).items() if k not in ("plot", "plot_out", "curves_out", "out")},
                           "flavor": describe(args.model), "layers_built": len(counts.layers),
                           "total_params": counts.total, "active_params": counts.active,
                           "flops_per_token": flops_per_token, "chain_vocab": vocab, "attention_core": ATTENTION,
                           "flags": {n: flags for n, (flags, _) in recipes.items()},
                           "converters": {n: [f"{type(c).__module__}.{type(c).__qualname__}" for c in converters]
                                          for n, (_, converters) in recipes.items() if converters},
                           "torch_shims": shims, "torchao_shims": torchao_aliases},
              "data_entropy": data.entropy, "runs": {}}
    failed = {}
    for name in names:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            flags, converters = recipes[name]
            model = build_model(flags, device, stock_state, args.seed, converters=converters, **shape)
            if args.fsdp:
                model = fully_sharded(model, device)
            run = train(name, model, data, args, lambda line: print(line, flush=True))
            record["runs"][name] = {**run, **mfu(flops_per_token, run["tokens_per_s"], device_name)}
        except Exception as error:  # recorded and reported; the other runs still run
            traceback.print_exc()
            failed[name] = record.setdefault("failed", {})[name] = f"{type(error).__name__}: {error}"
        model = None
        record["summary"] = summary(record["runs"], args.window)
        results.write(record, complete=False)
    path = results.write(record, complete=not failed)
    print(json.dumps(record["summary"], indent=2))
    print(path)
    if failed:
        sys.exit(f"runs failed: {failed}")
