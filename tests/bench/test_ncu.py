"""``bench ncu``'s reading of Nsight Compute's raw CSV page (the GPU run itself is not a CPU test)."""

import pytest

from gmlp.bench import ncu

# the shape of `ncu --import R --csv --page raw --print-nvtx-rename kernel`: a header row, a units
# row, one row per kernel named by its NVTX range; ncu may print lines of its own before the table
STALLED = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
HEADER = ["ID", "Kernel Name", "gpu__time_duration.sum",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
          *(STALLED.format(reason) for reason in ("barrier", "long_scoreboard", "wait", "math_pipe_throttle"))]
ROWS = [["", "", "usecond", "%", "register/thread", "ratio", "ratio", "ratio", "ratio"],
        ["0", "fc1|torch/cutlass::device_kernel<a/b>", "1,500.5", "91.2", "168", "0.5", "1.5", "0.25", "2.0"],
        ["1", "fc1|cutedsl/fill", "12.0", "1.0", "32", "0", "0", "0", "0"],
        ["2", "fc1|cutedsl/kernel_cutlass", "2,000.0", "70.0", "168", "3.0", "0.1", "1.0", "n/a"]]
RAW = "==PROF== a line of ncu's own\n" + "".join(
    ",".join(f'"{cell}"' for cell in row) + "\n" for row in [HEADER, *ROWS])


def test_each_range_is_summarized_by_its_longest_kernel():
    summary = ncu.summarize(ncu._parse(RAW))
    assert [(row["gemm"], row["side"], row["kernels"]) for row in summary] == [("fc1", "torch", 1),
                                                                                 ("fc1", "cutedsl", 2)]
    torch_row, ours = summary
    assert torch_row["ms"] == pytest.approx(1.5005)  # usecond with a thousands separator, as ms
    assert torch_row["kernel"] == "cutlass::device_kernel<a/b>" and ours["kernel"] == "kernel_cutlass"
    assert ours["ms"] == pytest.approx(2.0) and ours["tensor % active"] == 70.0 and ours["registers"] == 168
    assert ours["tensor % elapsed"] is None  # a metric this ncu did not report stays empty, not zero
    # largest first; a non-numeric value (n/a) is left out, not read as zero
    assert list(torch_row["stalls"]) == ["math_pipe_throttle", "long_scoreboard", "barrier"]
    assert ours["stalls"] == {"barrier": 3.0, "wait": 1.0, "long_scoreboard": 0.1}


def test_markdown_has_a_row_per_gemm_and_side():
    table = ncu.markdown(ncu.summarize(ncu._parse(RAW))).splitlines()
    assert len(table) == 4 and table[0].startswith("| GEMM | side | kernels | ms | tensor % active")
    assert table[3].startswith("| fc1 | cutedsl | 2 | 2.000 | 70.0 | - |")
    assert table[3].endswith("| barrier 3.00, wait 1.00, long_scoreboard 0.10 |")


def test_a_missing_ncu_is_named(capsys):
    with pytest.raises(SystemExit, match="--ncu: 'no-such-ncu' is not an executable"):
        ncu.main(["--ncu", "no-such-ncu"])


def test_kernels_filters_by_demangled_name(monkeypatch, tmp_path):
    """``--kernels`` becomes ncu's demangled-name regex; without it every kernel is profiled."""
    commands = []

    def stop(command, **kwargs):
        commands.append(command)
        raise SystemExit("stopped before profiling")

    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(ncu.subprocess, "run", stop)
    for argv in (["--kernels", "cutlass|gemm"], []):
        with pytest.raises(SystemExit, match="stopped before profiling"):
            ncu.main([*argv, "--out", str(tmp_path)])
    filtered, everything = commands
    at = filtered.index("--kernel-name")
    assert filtered[at - 2:at + 2] == ["--kernel-name-base", "demangled", "--kernel-name", "regex:cutlass|gemm"]
    assert "--kernel-name" not in everything
