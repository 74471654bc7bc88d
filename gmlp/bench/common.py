"""Shared benchmark plumbing: CUDA-event timing, environment record, JSON results."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import tempfile
from typing import Callable

import torch

import gmlp
from gmlp.cutedsl import compile_cache
from gmlp.system.env import setting
from gmlp.system.versions import REPORTED_PACKAGES, package_version


def add_out_argument(parser) -> None:
    """``--out``: the folder for a bench's JSON results."""
    parser.add_argument("--out", default=None, help="folder for the JSON results (default bench_results/)")


def add_cold_cache_argument(parser) -> None:
    """``--cold-cache``: the run starts with an empty compile cache, so that its first step is a
    first use's (every CuTeDSL kernel compiled); without it kernels an earlier run kept load."""
    parser.add_argument("--cold-cache", action="store_true",
                        help="compile every CuTeDSL kernel afresh (an empty temporary compile cache): the first step "
                             "as on a first use; default: kernels kept by earlier runs load from the cache")


def use_cold_cache(cold: bool) -> None:
    """Point the compile cache at a new empty directory when ``cold`` (``--cold-cache``)."""
    if cold:
        os.environ[compile_cache.CACHE_DIR_ENV] = tempfile.mkdtemp(prefix="gmlp-cold-cache-")


def compile_cache_state() -> dict:
    """The compile cache as a run finds it: directory, on or off, and kept kernels (0: a cold start)."""
    return {"directory": str(compile_cache.cache_directory()), "enabled": compile_cache.cache_enabled(),
            "entries": len(compile_cache.entries())}


def single_process_rendezvous() -> None:
    """MASTER_ADDR / MASTER_PORT for a process group of one rank started without torchrun (which
    sets them): a port the system says is free, so that runs side by side (test workers) do not
    collide on a fixed one."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s work (a CUDA device; the CPU's is done when issued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_gpu_kernel(event) -> bool:
    """Whether a profiler event (``events()`` or ``key_averages()``) is a GPU kernel's: device
    time, not an annotation of a region (``Optimizer.step#...``, ``nccl:all_to_all``) on the GPU's
    timeline that repeats its kernels' time."""
    return event.device_type == torch.autograd.DeviceType.CUDA and not getattr(event, "is_user_annotation", False)


def median_ms(fn: Callable[[], object], *, warmup_ms: float = 100.0, measure_ms: float = 300.0) -> float:
    """Median device time of one fn() call in milliseconds, by CUDA events, after a timed warm-up.

    The warm-up runs fn for about warmup_ms (compilation, allocator, clocks settling). Then at
    least 10 calls, about measure_ms in all, are each bracketed by events, with no host sync
    between them: the host runs ahead and keeps the queue full, so the events time the device
    work, not Python's launch overhead (a synchronize per call would add that overhead to every
    sample, a large share of a 0.2 ms kernel).
    """
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    for _ in range(int(warmup_ms / estimate) + 1):
        fn()
    count = max(10, int(measure_ms / estimate))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in zip(starts, ends))
    return times[len(times) // 2]


def copy_bandwidth_gbs(num_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second, GB/s) of num_bytes."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * num_bytes / ms / 1e6


# other kernel packages a bench may time (bench gemm --variants quack, bench mlp --sides sonicmoe-bf16)
PEER_PACKAGES = ("quack-kernels", "sonic-moe", "torchao", "transformer-engine")


def _checkout() -> dict:
    """The checkout of the imported gmlp: its folder (``gmlp_path``), ``commit`` (GMLP_COMMIT where
    set, for a copy outside git; else ``git rev-parse HEAD`` in the package's folder, not the
    current directory) and ``dirty`` (tracked files changed; None where unknown)."""
    package = pathlib.Path(gmlp.__file__).resolve().parent
    checkout = {"gmlp_path": str(package.parent)}
    commit = setting("GMLP_COMMIT")
    if commit:
        return {**checkout, "commit": commit, "dirty": None}

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {**checkout, "commit": git("rev-parse", "HEAD") or "unknown",
            "dirty": None if status is None else bool(status)}


def environment(device: torch.device | None = None) -> dict:
    """Device, versions, gmlp checkout and date of this run, on ``device`` (default: cuda if
    available, else cpu): a GPU's name, compute capability and multiprocessors, or the CPU's
    processor and cores and torch's threads; python, torch and the reported and peer packages'
    versions; the gmlp checkout (``_checkout``); TRITON_INTERPRET and every ``GMLP_*`` setting
    the process has (a forced path or another tuned table changes what was measured); the compile
    cache as the run finds it (``compile_cache_state``); the UTC date."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = {"device": props.name, "compute_capability": f"{props.major}.{props.minor}",
                 "multiprocessors": props.multi_processor_count}
    else:
        where = {"device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
                 "torch_threads": torch.get_num_threads()}
    return {
        **where,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        **{name: package_version(name) for name in (*REPORTED_PACKAGES, *PEER_PACKAGES) if name != "torch"},
        **_checkout(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "gmlp_settings": {name: value for name, value in sorted(os.environ.items()) if name.startswith("GMLP_")},
        "compile_cache": compile_cache_state(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def gpu_model(name: str) -> str:
    """A GPU's short lower-case model from its device name: "h100" for "NVIDIA H100 80GB HBM3",
    "h200" for "NVIDIA H200" ("gpu" where its model word has no letter or digit)."""
    words = name.split()
    model = words[1] if len(words) > 1 and words[0].upper() == "NVIDIA" else words[0]
    return "".join(c for c in model.lower() if c.isalnum()) or "gpu"


def device_label(device: torch.device) -> str:
    """A short lower-case name of ``device`` for result file names: the GPU's model
    (``gpu_model``), or "cpu"."""
    if device.type != "cuda":
        return "cpu"
    return gpu_model(torch.cuda.get_device_name(device))


def write_results(name: str, results: dict, out_dir: str | None) -> pathlib.Path:
    """Write results as JSON into out_dir (default: bench_results/), named after the bench and date."""
    return PartialResults(name, out_dir).write(results, complete=True)


class PartialResults:
    """A bench's JSON file, rewritten after every step of a long run (``write``), so that a run cut
    short (a timeout, a fault) leaves what it measured, marked ``"complete": false``."""

    def __init__(self, name: str, out_dir: str | None):
        folder = pathlib.Path(out_dir or "bench_results")
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        self.path = folder / f"{name}-{stamp}.json"

    def write(self, results: dict, complete: bool) -> pathlib.Path:
        self.path.write_text(json.dumps({**results, "complete": complete}, indent=2) + "\n")
        return self.path
