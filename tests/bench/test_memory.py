"""The memory bench's replay of an allocator trace (``gmlp.bench.memory``), on made-up traces: no GPU."""

import pytest

from gmlp.bench import memory

MB = 2**20
GMLP_FRAME = dict(filename="/site/gmlp/layer/steps.py", line=220, name="forward_steps")
BENCH_FRAME = dict(filename="/repo/gmlp/bench/mlp.py", line=112, name="baseline_layer")
TORCH_FRAME = dict(filename="/site/torch/autograd/graph.py", line=829, name="_engine_run_backward")


def _alloc(addr, mb, *frames):
    return dict(action="alloc", addr=addr, size=mb * MB, frames=list(frames))


def _free(addr, mb):
    return dict(action="free_requested", addr=addr, size=mb * MB, frames=[])


def test_origin_prefers_gmlp_then_any_frame_outside_torch():
    assert memory.origin([TORCH_FRAME, GMLP_FRAME, BENCH_FRAME]) == "layer/steps.py:220 (forward_steps)"
    assert memory.origin([TORCH_FRAME, BENCH_FRAME]) == "bench/mlp.py:112 (baseline_layer)"
    assert memory.origin([TORCH_FRAME]) == memory.NO_FRAME
    assert memory.origin([dict(filename="??", line=0, name="at::empty")]) == memory.NO_FRAME


def test_replay_finds_the_peak_and_what_is_alive_there():
    trace = [_alloc(1, 100, GMLP_FRAME), _alloc(2, 50, BENCH_FRAME), _free(1, 100),
             dict(action="free_completed", addr=1, size=100 * MB),  # not counted again
             _alloc(3, 30, GMLP_FRAME), _alloc(4, 80, GMLP_FRAME),  # the peak: 50 + 30 + 80
             _free(9, 500),  # resident before the trace: not counted
             _free(4, 80), dict(action="segment_alloc", addr=10, size=2 * MB)]
    result = memory.replay(trace)
    assert result["peak_mb"] == pytest.approx(160)
    assert result["events"] == 6 and result["peak_event"] == 4
    assert result["at_peak"] == [dict(origin="layer/steps.py:220 (forward_steps)", mb=110.0, tensors=2),
                                 dict(origin="bench/mlp.py:112 (baseline_layer)", mb=50.0, tensors=1)]
    timeline = result["timeline_mb"]
    assert len(timeline) == memory.TIMELINE_POINTS and timeline[0] == 100 and timeline[-1] == 80
    assert max(timeline) == 160


def test_an_empty_trace_has_no_peak():
    result = memory.replay([])
    assert (result["peak_mb"], result["events"], result["at_peak"], result["timeline_mb"]) == (0, 0, [], [])
