"""``torchrun -m gmlp.bench ep`` on two gloo CPU ranks against one rank with the same global batch:
the same losses (the experts see the same rows; only FSDP's reductions are summed in another
order), with the router's own uneven routing and one hot expert (the bench's partial_dtensor
dispatcher exchanges tokens by ``all_to_all_single``, which gloo runs with uneven splits)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gmlp.bench.ep import all_to_all_ms, plot, top_kernels_ms

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

STEPS = 3  # one warm-up step, one timed, the last profiled


def _run(tmp_path, ranks: int) -> pathlib.Path:
    out = tmp_path / f"ranks{ranks}"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "gmlp.bench", "ep", "--device", "cpu", "--hot-expert", "--runs", "gmlp-bf16",
               "--steps", str(STEPS), "--warmup", "1", "--window", "1", "--batch", str(2 // ranks),
               "--seq-len", "32", "--out", str(out)]
    env = {**os.environ, "GMLP_BACKEND": "torch"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = out.glob("ep*-of-*.json")
    return path


@pytest.mark.slow
def test_two_expert_parallel_ranks_train_as_one(tmp_path):
    two_path, one_path = _run(tmp_path, 2), _run(tmp_path, 1)
    two, one = (json.loads(path.read_text()) for path in (two_path, one_path))
    assert two["settings"]["ep"] == 2 and one["settings"]["ep"] == 1 and two["complete"]
    got, want = two["runs"]["gmlp-bf16"]["loss"], one["runs"]["gmlp-bf16"]["loss"]
    assert len(got) == STEPS
    assert got[0] == pytest.approx(want[0], abs=1e-4)  # the same weights and tokens: rounding apart
    assert got == pytest.approx(want, abs=1e-3)
    exchanged = two["runs"]["gmlp-bf16"]["profiled_step"]
    assert 0 < exchanged["all_to_all_ms"] < exchanged["step_ms"]  # gloo's exchanges, inside the step
    assert one["runs"]["gmlp-bf16"]["profiled_step"]["all_to_all_ms"] == 0  # EP = 1 exchanges nothing
    for run in (two, one):  # the hot expert took about E / top_k times the mean expert's rows
        load = run["runs"]["gmlp-bf16"]["expert_load"]
        assert load["busiest_expert"] == 0 and load["max_over_mean"] > 4, load
    picture = plot([one_path, two_path], tmp_path / "ep.png")  # EP = 2's curve and its gap to EP = 1
    assert picture.stat().st_size > 10_000


def _event(key: str, device_us: float = 0.0, cpu_us: float = 0.0, total_cpu_us: float = 0.0,
           annotation: bool = False):
    device = torch.autograd.DeviceType.CUDA if device_us else torch.autograd.DeviceType.CPU
    return SimpleNamespace(key=key, self_device_time_total=device_us, self_cpu_time_total=cpu_us,
                           cpu_time_total=total_cpu_us, device_type=device, is_user_annotation=annotation)


def test_all_to_all_time_counts_each_exchange_once():
    # key_averages() of three NCCL all_to_all_single calls on the H200 (torch 2.11): the kernel's
    # time appears again on the nccl:all_to_all annotation, and the c10d op has only CPU time
    nccl = [_event("c10d::alltoall_base_", cpu_us=155.3, total_cpu_us=155.3), _event("nccl:all_to_all"),
            _event("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", device_us=113.1),
            _event("nccl:all_to_all", device_us=113.1, annotation=True),
            _event("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", device_us=50.0)]
    assert all_to_all_ms(nccl, "cuda") == pytest.approx(0.1131)
    # gloo on the CPU: the c10d op enqueues (its own time), the work runs under gloo:all_to_all
    gloo = [_event("c10d::alltoall_base_", cpu_us=345.8, total_cpu_us=345.8),
            _event("gloo:all_to_all", total_cpu_us=44529.4)]
    assert all_to_all_ms(gloo, "cpu") == pytest.approx(44.5294)


def test_top_kernels_leave_out_annotated_regions_and_cpu_ops():
    events = [_event("Optimizer.step#AdamW.step", device_us=7000.0, annotation=True),
              _event("aten::mm", cpu_us=900.0, total_cpu_us=900.0),
              _event("fc1_forward_kernel", device_us=5000.0), _event("elementwise_kernel", device_us=6000.0)]
    assert top_kernels_ms(events) == {"elementwise_kernel": 6.0, "fc1_forward_kernel": 5.0}
    assert list(top_kernels_ms(events, count=1)) == ["elementwise_kernel"]
