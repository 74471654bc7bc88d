"""Processes for the distributed torchtitan tests: two CPU ranks over gloo, each checking its own
results against the single-process MoE it also runs (``tests/integrations/test_torchtitan_distributed.py``)."""

from __future__ import annotations

import functools
import gc
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.tolerances import BF16_UNIT, relative_rms_bound, relative_rms_error
from tests.support.torchtitan_cases import DIM, built, moe_config, overridden

ROWS_PER_RANK = 2  # sequences of 24 tokens


def run_workers(worker, world: int, *args, timeout_s: float = 240.0) -> None:
    """``worker(rank, world, port, *args)`` in ``world`` processes; a worker's exception is raised
    here with its traceback, and processes still running after ``timeout_s`` are killed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.spawn(worker, args=(world, port, *args), nprocs=world, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{worker.__name__}: {world} processes still running after {timeout_s:.0f} s")


def _in_process_group(check):
    """A worker that runs ``check(rank, world, *args)`` in a gloo process group, then takes it down
    while Python is alive: the check's reference cycles collected (FSDP's hooks hold their modules
    and, through them, the group), every rank's collectives finished (a barrier), the group
    destroyed, its worker threads joined. Otherwise a gloo thread may drop a finished
    collective's tensors while the interpreter finalizes; freeing their Python objects then needs
    the GIL, the thread is made to exit inside a noexcept destructor, and the process aborts
    ("terminate called without an active exception": 1 run in 40 under CPU load while the
    backward cleared its saved tensors early; gdb on the core, ProcessGroupGloo::runLoop ->
    ~AsyncAllgatherCoalescedWork -> decref_pyobject -> take_gil -> pthread_exit)."""
    @functools.wraps(check)
    def worker(rank: int, world: int, port: int, *args) -> None:
        os.environ["GMLP_BACKEND"] = "torch"  # the oracle's twins: the single-process run is bit-comparable
        torch.autograd.set_multithreading_enabled(False)  # as torchtitan's init_distributed does
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        check(rank, world, *args)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        gc.collect()
    return worker


def _batch(world: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (ROWS_PER_RANK * world, 24, DIM)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _step(moe, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_()
    out = moe(x)
    out.backward(dy)
    return out, x.grad


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A rank's own part: torchtitan's spmd_types backend keeps sharded parameters as local
    tensors; DTensor backends as DTensors."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _mine(rank: int, tensor: torch.Tensor) -> torch.Tensor:
    return tensor[rank * ROWS_PER_RANK:(rank + 1) * ROWS_PER_RANK]


@_in_process_group
def expert_parallel_worker(rank: int, world: int, recipe: str, spmd_backend: str) -> None:
    """torchtitan's expert-parallel MoE (EP = world: each rank keeps E / world experts, tokens
    travel by its all-to-all dispatcher) with gmlp's experts, on this rank's sequences, against the
    single-process MoE on all of them: out and dx bit for bit (each expert sees the same rows in
    the same order), the local experts' weight gradients bit for bit, the router's (partial per
    rank) summed within fp32 rounding. ``spmd_backend``: torchtitan's parameter representation,
    "spmd_types" (local tensors, its default) or "partial_dtensor" (DTensors, which the experts
    use through ``to_local()``). The routing is the router's own (uneven splits) under
    partial_dtensor, whose dispatcher exchanges tokens by ``all_to_all_single``; spmd_types'
    exchange is ``torch.distributed.all_to_all`` of a list, which gloo runs with equal chunks
    only, so there the router is torchtitan's debug round-robin."""
    import spmd_types as spmd
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.common.moe_sharding import set_moe_sharding_config

    # torchtitan builds its meshes on the device type it detected at import, "cuda" when there is
    # no accelerator at all; these ranks are CPU processes
    parallel_dims_module.device_type = "cpu"
    dist_utils.set_spmd_backend(spmd_backend)
    balanced = spmd_backend == "spmd_types"
    config = overridden(moe_config(balanced=balanced), recipe=recipe)
    single = built(config)
    x, dy = _batch(world)
    want_out, want_dx = _step(single, x, dy)
    counts = single.tokens_per_expert_E  # the routing's rows per expert (torchtitan's usage count)
    assert balanced == bool((counts == counts[0]).all()), f"routing not as meant: {counts.tolist()}"

    layout = {"w1_EFD": spmd.S(1), "w2_EDF": spmd.S(2), "w3_EFD": spmd.S(1)}  # as torchtitan's qwen3 passes
    set_moe_sharding_config(config, enable_ep=True, enable_sp=False, expert_param_layout=layout)
    moe = built(config)
    parallel_dims = ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=world, world_size=world,
                                 spmd_backend=spmd_backend)
    parallel_dims.build_mesh()
    moe.parallelize(parallel_dims)
    with dist_utils.get_spmd_context(parallel_dims=parallel_dims)():
        out, dx = _step(moe, _mine(rank, x), _mine(rank, dy))
    assert torch.equal(out, _mine(rank, want_out)), "out"
    assert torch.equal(dx, _mine(rank, want_dx)), "dx"
    experts = moe.routed_experts.inner_experts
    assert (type(experts.w1_EFD).__name__ == "DTensor") == (spmd_backend == "partial_dtensor")
    local = _local(experts.w1_EFD).shape[0]
    assert local * world == experts.num_experts, "EP shards the experts"
    mine = slice(rank * local, (rank + 1) * local)
    for name in ("w1_EFD", "w3_EFD", "w2_EDF"):
        got = _local(getattr(experts, name).grad)
        assert torch.equal(got, getattr(single.routed_experts.inner_experts, name).grad[mine]), name
    gate = _local(moe.router.gate.weight.grad).clone()  # replicated weights, a partial gradient per rank
    dist.all_reduce(gate)
    error = relative_rms_error(gate, single.router.gate.weight.grad)
    assert error <= 1e-6, f"router gate gradient: relative RMS error {error}"


@_in_process_group
def fsdp_worker(rank: int, world: int, recipe: str) -> None:
    """FSDP2 ``fully_shard`` of torchtitan's MoE with gmlp's experts over ``world`` ranks (each
    holds 1 / world of every parameter, all-gathered for the step), a loss of sum(out * dy) on each
    rank's sequences: FSDP averages the gradients over the ranks, so they are half the
    single-process gradients of all sequences. Each rank's and the single run's bf16 weight
    gradients round once (one more rounding each, summed in fp32), hence the bound."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    config = overridden(moe_config(), recipe=recipe)
    single = built(config)
    x, dy = _batch(world)
    want_out, _ = _step(single, x, dy)
    moe = fully_shard(built(config), mesh=init_device_mesh("cpu", (world,)))
    out, _ = _step(moe, _mine(rank, x), _mine(rank, dy))
    assert torch.equal(out, _mine(rank, want_out)), "out"
    bound = relative_rms_bound(*[BF16_UNIT] * 3)
    for name, param in moe.named_parameters():
        grad = param.grad.full_tensor()
        want = dict(single.named_parameters())[name].grad / world
        error = relative_rms_error(grad, want)
        assert error <= bound, f"{name}: relative RMS error {error} > {bound}"
