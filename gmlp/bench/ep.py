"""``torchrun --nproc-per-node N -m gmlp.bench ep``: torchtitan's qwen3 MoE debug model with
expert parallelism over N processes (one per GPU, NCCL; gloo on the CPU), FSDP2 on the rest,
stock or gmlp experts: loss per step, tokens/s per GPU, the all-to-all time of one profiled step.

The model, the flags and the tokens are those of ``python -m gmlp.bench torchtitan``; here
torchtitan parallelizes the experts itself: its qwen3 sharding configs (EP on the experts' dim
0) and ``Module.parallelize`` with its ``partial_dtensor`` backend (DTensor parameters; its
spmd_types default needs FSDP arguments newer than torch 2.11); FSDP2 over the other parameters
is applied here (``fully_shard_dense``). Gradients are those of the mean loss over the global
batch: each rank's mean loss, FSDP's average over the ranks, and the experts' gradients (the
all-to-all sums each EP group's tokens into them) summed over the groups and divided by the rank
count. Rank r trains on rows [r * batch, (r + 1) * batch) of each global batch, so a run at
EP = N and ``--batch b`` sees the tokens of a 1-GPU run at ``--batch N * b``: their loss curves
should agree within bf16 noise. ``--hot-expert`` routes every token to expert 0 as one of its
choices (torchtitan's load-balancing bias, which steers the choice, not the scores);
``--balanced`` uses torchtitan's round-robin routing. gloo runs uneven EP too: the
partial_dtensor dispatcher's ``all_to_all_single`` takes split sizes. ``--plot A.json B.json ...
--plot-out P`` draws the loss curves of several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.distributed as dist

from gmlp.bench.common import (PartialResults, add_out_argument, environment, is_gpu_kernel, single_process_rendezvous,
                               synchronize)
from gmlp.bench.torchtitan import (
    ATTENTION,
    FLAVOR,
    RUNS,
    MarkovTokens,
    add_gc_argument,
    model_spec,
    optimizer_and_schedule,
    torch_shims,
    trainer_garbage_collection,
)
from gmlp.bench.torchtitan import build_model as stock_model
from gmlp.bench.torchtitan_report import moving_gap

SPMD_BACKEND = "partial_dtensor"


def _sharding(ep: int):
    """The trainer's step before the overrides: torchtitan's qwen3 sharding configs for EP = ``ep``."""

    def prepare(model_config) -> None:
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        set_qwen3_sharding_config(model_config, enable_sp=False, enable_ep=ep > 1)

    return prepare


def parallel_dims(world: int, ep: int, device: torch.device):
    """torchtitan's ParallelDims for ``world`` ranks: FSDP over all of them, EP over ``ep``."""
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims

    if device.type == "cpu":  # torchtitan detects "cuda" where there is no accelerator at all
        parallel_dims_module.device_type = "cpu"
    dist_utils.set_spmd_backend(SPMD_BACKEND)
    dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=ep, world_size=world,
                        spmd_backend=SPMD_BACKEND)
    dims.build_mesh()
    return dims


def fully_shard_dense(model, dims, ep: int) -> list:
    """FSDP2 (bf16 parameters, fp32 reductions) over the data-parallel mesh, each block then the
    root, as torchtitan shards a model; with EP > 1 the routed experts, which EP has sharded
    already, are left out and returned (their gradients are reduced by ``train``). torchtitan's
    own ``apply_fsdp_to_decoder`` gives them a second FSDP mesh through FSDP internals newer than
    torch 2.11, with a PREMUL_SUM reduction that gloo lacks."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = dims.get_mesh(["fsdp"])
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    experts = []
    for block in model.layers.values():
        own = list(block.moe.routed_experts.inner_experts.parameters()) if ep > 1 else []
        experts += own
        fully_shard(block, mesh=mesh, mp_policy=policy, ignored_params=set(own))
    fully_shard(model, mesh=mesh, mp_policy=policy, ignored_params=set(experts))
    return experts


def build_model(flags: list[str], dims, ep: int, state: dict, device: torch.device, args):
    """The model given the stock model's full ``state`` (through its own state-dict hooks:
    torchtitan keeps the fused wqkv as wq / wk / wv there), then parallelized by torchtitan
    (``Module.parallelize``: EP shards the experts) and FSDP2 on the rest. Built on the device,
    not on meta as the trainer does, so that the full state loads before anything is sharded.
    Returns the model and the parameters ``fully_shard_dense`` left to EP."""
    spec = model_spec(flags, _sharding(ep))
    with torch.device(device):
        model = spec.model.build()
    with torch.no_grad():
        model.init_states()  # the buffers outside the state dict (RoPE cache, expert counts)
    model.load_state_dict(state)
    if ep > 1:
        model.parallelize(dims)
    experts = fully_shard_dense(model, dims, ep)
    if args.hot_expert:
        for block in model.layers.values():
            bias = block.moe.expert_bias_E
            (bias.to_local() if hasattr(bias, "to_local") else bias)[0] = 1.0  # softmax scores are < 1
    if args.balanced:
        for block in model.layers.values():
            block.moe.router._debug_force_load_balance = True
    return model, experts


def all_to_all_ms(events, device_type: str) -> float:
    """Time of the all-to-all exchanges among a profile's ``key_averages()``, in ms, each counted
    once: on a GPU, NCCL's send/recv kernels (torch's all_to_all_single is grouped send/recv; the
    ``nccl:all_to_all`` annotation and the ``c10d::`` op that launch them are not counted again);
    on the CPU, the span of gloo's ``gloo:all_to_all`` work (the ``c10d::`` op only enqueues it)."""
    total_us = 0.0
    for event in events:
        name = event.key
        if device_type == "cuda" and name.startswith("nccl") and "Kernel_SendRecv" in name:
            total_us += event.self_device_time_total
        elif device_type == "cpu" and name == "gloo:all_to_all":
            total_us += event.cpu_time_total
    return total_us / 1000


def _kernels(events) -> list:
    """The GPU kernels among a profile's ``key_averages()`` that took device time."""
    return [event for event in events if is_gpu_kernel(event) and event.self_device_time_total > 0]


def top_kernels_ms(events, count: int = 12) -> dict[str, float]:
    """The ``count`` GPU kernels of a profile's ``key_averages()`` with the most device time, in
    ms (names cut to 100 characters): where a step's time goes, e.g. under a hot expert."""
    kernels = sorted(_kernels(events), key=lambda event: event.self_device_time_total, reverse=True)
    return {event.key[:100]: event.self_device_time_total / 1000 for event in kernels[:count]}


def expert_load(model) -> dict:
    """How the routing loaded the experts over all steps, layers and ranks (torchtitan's
    ``tokens_per_expert_E`` counts, which the forward accumulates): the busiest expert and its
    rows over the mean expert's (1 for even routing; with ``--hot-expert`` about E / top_k)."""
    counts = [block.moe.tokens_per_expert_E for block in model.layers.values()]
    load = torch.stack([c.to_local() if hasattr(c, "to_local") else c for c in counts]).to(torch.float64).sum(0)
    dist.all_reduce(load)
    return {"busiest_expert": int(load.argmax()), "max_over_mean": float(load.max() / load.mean())}


def train(name: str, model, experts: list, data: MarkovTokens, dims, args, rank: int, world: int) -> dict:
    """``args.steps`` steps on this rank's rows of each global batch; the global loss of each step,
    tokens/s per GPU past the warm-up (the profiled step left out), the all-to-all time and top
    kernels of one profiled step, and each step's host time (no sync: spikes show host stalls
    such as a kernel compiled mid-run)."""
    from torchtitan.distributed import utils as dist_utils

    optimizer, schedule = optimizer_and_schedule(model, args)
    context = dist_utils.get_spmd_context(parallel_dims=dims)
    device, global_tokens = data.device, world * args.batch * args.seq_len
    replicas = dims.get_optional_mesh(["efsdp"])  # the ranks that hold the same experts
    positions = torch.arange(args.seq_len, device=device).expand(args.batch, -1)  # one document per sequence
    losses, timed_from, profiled = [], args.warmup, {}

    def step(index: int) -> torch.Tensor:
        tokens = data.batch(index)[rank * args.batch:(rank + 1) * args.batch]
        with context():
            logits = model(tokens[:, :-1], positions=positions)
            loss_sum = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten(),
                                                         reduction="sum")
            (loss_sum / (args.batch * args.seq_len)).backward()
        for param in experts:  # sums over the EP group's tokens; summed over the groups, then the mean
            grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
            if replicas is not None and replicas.size() > 1:
                dist.all_reduce(grad, group=replicas.get_group())
            grad.div_(world)
        dist_utils.clip_grad_norm_(list(model.parameters()), 1.0, ep_enabled=args.ep > 1)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss_sum.detach().clone()
        dist.all_reduce(total)
        return total / global_tokens

    untimed_s = 0.0  # the profiled step, its sync and the profile's processing
    step_host_ms, last = [], time.perf_counter()
    with trainer_garbage_collection(args.gc_every) as collect:
        for index in range(args.steps):
            if index == timed_from:
                dist.barrier()
                start = time.perf_counter()
            collect(index + 1)  # inside the step, as the trainer times it
            if index == args.profile_step:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if device.type == "cuda":
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                    torch.cuda.synchronize(device)  # the step's time is its own, not the previous one's tail
                began = time.perf_counter()
                with torch.profiler.profile(activities=activities) as profile:
                    losses.append(step(index))
                    synchronize(device)
                    step_ms = 1000 * (time.perf_counter() - began)
                # the events exist once the profiler has stopped
                events = profile.key_averages()
                profiled = {"step": index, "step_ms": step_ms, "all_to_all_ms": all_to_all_ms(events, device.type)}
                if device.type == "cuda":  # kernel time against the step's: how far the host keeps the GPU busy
                    profiled["kernels_ms"] = sum(event.self_device_time_total for event in _kernels(events)) / 1000
                    profiled["top_kernels_ms"] = top_kernels_ms(events)
                if index >= timed_from:
                    untimed_s += time.perf_counter() - began
            else:
                losses.append(step(index))
            now = time.perf_counter()
            step_host_ms.append(1000 * (now - last))
            last = now
            if rank == 0 and ((index + 1) % 25 == 0 or index + 1 == args.steps):
                print(f"{name}: step {index + 1}/{args.steps} loss {float(losses[-1]):.4f}", flush=True)
    dist.barrier()
    seconds = time.perf_counter() - start - untimed_s
    load = expert_load(model)
    timed_steps = args.steps - timed_from - (args.profile_step >= timed_from)
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return {"loss": [float(x) for x in losses], "tokens_per_s_per_gpu": timed_steps * args.batch * args.seq_len / seconds,
            "step_ms": 1000 * seconds / timed_steps, "peak_memory_gb_rank0": peak, "profiled_step": profiled,
            "expert_load": load, "step_host_ms": step_host_ms}


def _file_tag(path: pathlib.Path, result: dict) -> str:
    """A result file's legend tag: its EP degree, ranks, batch, routing and time stamp."""
    settings = result["settings"]
    routing = ", hot expert" if settings.get("hot_expert") else ""
    return f"EP={settings['ep']} on {settings['world']}, batch {settings['batch']}{routing}, {path.stem.rsplit('-', 1)[-1]}"


def plot(paths: list[pathlib.Path], out: pathlib.Path) -> pathlib.Path:
    """The loss curves of several EP results (each run of each file), and their gaps to the
    first file's run of the same name (the 1-GPU reference, when it is given first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(path.read_text()) for path in paths]
    window = results[0]["settings"]["window"]
    figure, (curves, gaps) = plt.subplots(2, 1, figsize=(9, 8), sharex=True, height_ratios=[2, 1])
    colors: dict[str, str] = {}  # one color per run name, one line style per file
    tags = [f"[{index + 1}] {_file_tag(path, result)}" for index, (path, result) in enumerate(zip(paths, results))]
    for index, result in enumerate(results):
        style = ("-", "--", ":", "-.")[index % 4]
        for name, run in result["runs"].items():
            color = colors.setdefault(name, f"C{len(colors)}")
            label = f"{name}, {tags[index]} ({run['tokens_per_s_per_gpu'] / 1e3:.0f}k tokens/s per GPU)"
            curves.plot(run["loss"], label=label, color=color, linewidth=1, linestyle=style)
            reference = results[0]["runs"].get(name)
            if index > 0 and reference is not None:
                gap = moving_gap(run["loss"], reference["loss"], window)
                gaps.plot(range(window - 1, window - 1 + len(gap)), gap, color=color, linewidth=1, linestyle=style,
                          label=f"{name}: [{index + 1}] - [1]")
    curves.set_ylabel("training loss (nats)")
    curves.set_yscale("log")
    curves.legend(fontsize=8)
    curves.set_title(f"torchtitan qwen3 {FLAVOR}, expert parallelism, {results[0]['environment']['device']}")
    gaps.axhline(0, color="gray", linewidth=0.5)
    gaps.set_ylabel(f"loss gap\n(mean of {window} steps)")
    gaps.set_xlabel("step")
    gaps.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m gmlp.bench ep",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", default="stock,gmlp-bf16,gmlp-mxfp8",
                        help=f"comma-separated, of {', '.join(name for name in RUNS if name != 'torchtitan-fused')}")
    parser.add_argument("--ep", type=int, default=None, help="expert-parallel degree (default: every process)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps (not timed)")
    add_gc_argument(parser)
    parser.add_argument("--window", type=int, default=20, help="steps averaged in the summary")
    parser.add_argument("--profile-step", type=int, default=None, help="profile this step (default: the last)")
    parser.add_argument("--hot-expert", action="store_true", help="every token also routed to expert 0")
    parser.add_argument("--balanced", action="store_true", help="torchtitan's round-robin routing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda", help="cuda (NCCL); cpu (gloo) for a smoke run")
    parser.add_argument("--plot", type=pathlib.Path, nargs="+", default=None, help="only plot these results")
    parser.add_argument("--plot-out", type=pathlib.Path, default=None)
    add_out_argument(parser)
    args = parser.parse_args(argv)
    if args.plot is not None:
        if args.plot_out is None:
            parser.error("--plot needs --plot-out")
        print(plot(args.plot, args.plot_out))
        return
    names = args.runs.split(",")
    unknown = [name for name in names if name not in RUNS or name == "torchtitan-fused"]
    if unknown:
        parser.error(f"--runs: unknown {unknown}")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    args.ep = args.ep or world
    if world % args.ep:
        parser.error(f"--ep {args.ep} must divide the {world} processes")
    if args.profile_step is None:
        args.profile_step = args.steps - 1
    if not 0 <= args.profile_step < args.steps:
        parser.error(f"--profile-step {args.profile_step}: expected a step in [0, {args.steps})")
    if args.steps < args.warmup + 2:  # at least one timed step besides the profiled one
        parser.error(f"--steps {args.steps}: expected at least --warmup + 2 = {args.warmup + 2} "
                     "(the warm-up steps and the profiled step are not timed)")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torchrun -m gmlp.bench ep: no CUDA GPU here (--device cpu runs on gloo)")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if world == 1:  # torchrun sets the rendezvous; a plain `python -m gmlp.bench ep` is one rank
        single_process_rendezvous()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    torch.autograd.set_multithreading_enabled(False)  # as torchtitan's init_distributed
    shims = torch_shims()
    dims = parallel_dims(world, args.ep, device)
    stock = stock_model([], device, None, args.seed)  # the weights every run starts from
    state = {key: value.detach().clone() for key, value in stock.state_dict().items()}
    del stock
    data = MarkovTokens(model_spec([]).model.vocab_size, args.steps, world * args.batch, args.seq_len, args.seed, device)
    tag = "h200" if device.type == "cuda" else "cpu-smoke"
    results = PartialResults(f"ep{args.ep}-of-{world}-{tag}", args.out) if rank == 0 else None
    record = {"environment": environment(device),
              "settings": {**{k: v for k, v in vars(args).items() if k not in ("plot", "plot_out", "out")},
                           "world": world, "flavor": FLAVOR, "attention_core": ATTENTION, "spmd_backend": SPMD_BACKEND,
                           "torch_shims": shims,
                           "flags": {name: RUNS[name] for name in names}},
              "data_entropy": data.entropy, "runs": {}}
    for name in names:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        model, experts = build_model(RUNS[name], dims, args.ep, state, device, args)
        record["runs"][name] = train(name, model, experts, data, dims, args, rank, world)
        model = None
        if results is not None:
            results.write(record, complete=False)
    if results is not None:
        stock_run = record["runs"].get("stock")
        if stock_run is not None:
            record["tokens_per_s_vs_stock"] = {name: run["tokens_per_s_per_gpu"] / stock_run["tokens_per_s_per_gpu"]
                                               for name, run in record["runs"].items()}
        print(results.write(record, complete=True))
    dist.destroy_process_group()
