"""Host and device time of a step, as ``python -m gmlp.bench host`` takes them.

On a CUDA device the host's time to issue a loop of calls is taken while a sleep kernel holds
the stream (``held``): nothing the loop queues can start, so the host never waits on the device
(at large shapes a loop of steps would otherwise fill the launch queue and wait for kernels),
and the same loop's CUDA events give the kernels' time back to back. A loop is a few calls, so
that its few hundred launches fit in the queue. On the CPU the calls compute as they are issued:
the host time is the computation's.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CYCLES_PER_MS", "HeldLoop", "cpu_loop_ms", "device_wall_ms", "held", "hold_ms", "host_syncs", "repeated",
           "step_figures", "summary"]

CYCLES_PER_MS = 2e6  # torch.cuda._sleep's unit at about 2 GHz (a slower clock only holds longer)


def summary(samples: list[float]) -> dict:
    """Median, min and the samples themselves (ms)."""
    return {"median": statistics.median(samples), "min": min(samples), "samples": samples}


def cpu_loop_ms(fn: Callable[[], object], iters: int, repeats: int) -> list[float]:
    """Host wall time per fn() call (ms), one sample per loop of ``iters`` calls (no device involved,
    or a synchronous one: the CPU)."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return samples


@dataclass(frozen=True)
class HeldLoop:
    """One loop issued behind a sleep kernel: the host's ms to issue it, the device's ms to run it
    (CUDA events around it), and whether the sleep ended before the host had issued all of it
    (then both include waiting: a host sync in the loop, or a sleep too short)."""

    host_ms: float
    device_ms: float
    sleep_ended_early: bool


def held(issue: Callable[[], object], sleep_ms: float) -> HeldLoop:
    """Run ``issue()`` (which queues work on the current CUDA stream) while a ``torch.cuda._sleep``
    kernel of about ``sleep_ms`` holds that stream, then wait for the device."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(sleep_ms * CYCLES_PER_MS))
    start.record()
    began = time.perf_counter()
    issue()
    host_ms = (time.perf_counter() - began) * 1e3
    ended_early = start.query()  # the sleep is over once the event after it has run
    end.record()
    end.synchronize()
    return HeldLoop(host_ms, start.elapsed_time(end), ended_early)


def device_wall_ms(fn: Callable[[], object], iters: int, repeats: int) -> list[float]:
    """Per call (ms), CUDA events around a synchronized loop of ``iters`` calls, the stream not
    held: what a call costs when the host issues it, about the larger of host and device time."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return samples


def host_syncs(fn: Callable[[], object]) -> int:
    """Synchronizing calls one fn() makes, as ``torch.cuda.set_sync_debug_mode("warn")`` reports them."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum("synchroniz" in str(warning.message) for warning in caught)


def kernels_launched(fn: Callable[[], object]) -> int | None:
    """Device work items one fn() issues: kernels, memsets and copies, as ``torch.profiler``
    records them (CUDA activities; None where this torch cannot record them). Each costs the
    host a launch, whatever issues it: the host time of a step grows with this count."""
    from torch.profiler import ProfilerActivity, profile, supported_activities

    if ProfilerActivity.CUDA not in supported_activities():
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as recorded:
        fn()
        torch.cuda.synchronize()
    return sum(event.device_type == torch.autograd.DeviceType.CUDA for event in recorded.events())


def hold_ms(wall_ms_per_call: float, calls: int, margin: float = 3.0) -> float:
    """A sleep long enough for the host to issue ``calls`` calls: ``margin`` times their wall time
    with the stream not held (an upper bound of the host's part), at least 1 ms."""
    return max(margin * wall_ms_per_call * calls, 1.0)


def repeated(fn: Callable[[], object], times: int) -> Callable[[], None]:
    """A call of ``fn`` ``times`` times in a row."""

    def loop() -> None:
        for _ in range(times):
            fn()

    return loop


def step_figures(step: Callable[[], object], forward: Callable[[], object] | None, device: torch.device, *,
                 iters: int, repeats: int) -> dict:
    """The timing keys of a row (``python -m gmlp.bench host``'s docstring names them) for ``step``
    (a forward + backward) and, when given, ``forward`` alone, both warm."""
    timed = {"fwd_bwd_host": step} if forward is None else {"fwd_bwd_host": step, "fwd_host": forward}
    if device.type != "cuda":
        figures = {key: summary(cpu_loop_ms(fn, iters, repeats)) for key, fn in timed.items()}
        cuda_only = {"device_ms": None, "device_wall_ms": None, "sleep_ended_early": None, "host_syncs_per_step": None,
                     "launches_per_step": None}
    else:
        wall = statistics.median(device_wall_ms(step, iters, repeats))
        sleep_ms = hold_ms(wall, iters)  # the forward's loops are shorter: the step's hold suffices
        loops = {key: [held(repeated(fn, iters), sleep_ms) for _ in range(repeats)] for key, fn in timed.items()}
        figures = {key: summary([loop.host_ms / iters for loop in samples]) for key, samples in loops.items()}
        cuda_only = {
            "device_ms": statistics.median([loop.device_ms / iters for loop in loops["fwd_bwd_host"]]),
            "device_wall_ms": wall,
            "sleep_ended_early": any(loop.sleep_ended_early for samples in loops.values() for loop in samples),
            "host_syncs_per_step": host_syncs(step),
            "launches_per_step": kernels_launched(step),
        }
    return {**{f"{key}_ms": value["median"] for key, value in figures.items()}, **figures, **cuda_only}
