"""``python -m gmlp.bench ncu``: Nsight Compute's counters for each GEMM of the layer, the SM90
CuTeDSL kernel next to torch's ``_grouped_mm`` (cuBLAS) on the same product.

The bench runs itself again under ``ncu`` (``--clock-control none``: the clocks are left as the
machine sets them), as a child that builds ``bench gemm``'s operands for one shape, runs every
GEMM's callables twice to compile and warm them, then once more inside the profiled range, each
call in an NVTX range named ``GEMM|SIDE``. The report (``ncu-*.ncu-rep`` in ``--out``, for Nsight
Compute's viewer) is read back as CSV with kernels named by their NVTX range, and each range's
longest kernel is the row of the table: duration, tensor-pipe % (of the SMs' active cycles, and
of the elapsed ones: the second also counts SMs idle in a tail wave), SM throughput, achieved
occupancy, registers, DRAM and L2 throughput, and the three largest stall reasons (warps stalled
per issued instruction, ``smsp__average_warps_issue_stalled_*``; a warp-specialized kernel's
producer warps count here while they wait on barriers). Results as JSON with the environment.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import torch

from gmlp.bench.common import PartialResults, add_out_argument, environment

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis")
# not in the sections: the tensor pipe's active cycles over the SMs' active ones (wgmma counts as hmma)
EXTRA_METRICS = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",)
# table column -> raw metric (percentages unless named otherwise)
COLUMNS = {
    "ms": "gpu__time_duration.sum",
    "tensor % active": EXTRA_METRICS[0],
    "tensor % elapsed": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "SM %": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy %": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "DRAM %": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 %": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
TIME_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3,
              "s": 1e3}  # ncu names its units either way, by version


def _child(shape: str, gemms: list[str], variants: list[str], config: dict) -> None:
    """Under ncu: warm every callable, then run each once in the profiled range, NVTX-named."""
    from gmlp.bench.gemm import _gemms, _operands, variant_tilings
    from gmlp.bench.mlp import SHAPES

    experts, tokens, hidden, ffn = SHAPES[shape]
    table = _gemms(_operands(experts, tokens, hidden, ffn, torch.device("cuda")), hidden, ffn)
    calls = []
    for name in gemms:
        gemm = table[name]
        calls.append((f"{name}|torch", gemm["baseline"]))
        for variant in variants:
            if variant not in gemm:
                print(f"{name}: no {variant} variant, not profiled", file=sys.stderr)
                continue
            default = variant_tilings(gemm, variant)[0]
            calls.append((f"{name}|{variant}", gemm[variant]({**default, **config})))  # the default, + --config
    for _, call in calls:
        call(), call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, call in calls:
        torch.cuda.nvtx.range_push(label)
        call()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _parse(raw_csv: str) -> list[dict]:
    """ncu's raw page as rows: kernel (its NVTX range), each metric as a float, ms for the duration."""
    reader = csv.reader(io.StringIO(raw_csv[raw_csv.index('"ID"'):]))
    header, units = next(reader), next(reader)
    rows = []
    for values in reader:
        row = {"kernel": values[header.index("Kernel Name")]}
        for name, unit, value in zip(header, units, values):
            try:
                number = float(value.replace(",", ""))
            except ValueError:
                continue
            row[name] = number * TIME_UNITS[unit] if name == COLUMNS["ms"] else number
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Per NVTX range (GEMM|side): its longest kernel's columns, top stall reasons, kernels counted."""
    by_range: dict[str, list[dict]] = {}
    for row in rows:  # ncu names a kernel "RANGE/KERNEL" (its NVTX range, then its own name)
        by_range.setdefault(row["kernel"].split("/", 1)[0], []).append(row)
    summary = []
    for label, kernels in by_range.items():
        main = max(kernels, key=lambda r: r.get(COLUMNS["ms"], 0.0))
        stalls = sorted(((m.group(1), v) for k, v in main.items() if (m := STALL.fullmatch(k))), key=lambda s: -s[1])
        gemm, _, side = label.partition("|")
        summary.append(dict(gemm=gemm, side=side, kernels=len(kernels), kernel=main["kernel"].split("/", 1)[-1],
                            **{column: main.get(metric) for column, metric in COLUMNS.items()},
                            stalls={reason: round(value, 3) for reason, value in stalls[:3]}))
    return summary


def markdown(summary: list[dict]) -> str:
    """The summary as a markdown table, one row per GEMM and side."""
    head = ["GEMM", "side", "kernels", *COLUMNS, "top stalls (warps per issue)"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    for row in summary:
        cells = [row["gemm"], row["side"], str(row["kernels"])]
        cells += ["-" if row[c] is None else (f"{row[c]:.3f}" if c == "ms" else f"{row[c]:.0f}" if c == "registers"
                                               else f"{row[c]:.1f}") for c in COLUMNS]
        cells.append(", ".join(f"{reason} {value:.2f}" for reason, value in row["stalls"].items()))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench ncu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="deepseek-v3-rank", help="one of bench mlp's SHAPES")
    parser.add_argument("--gemms", default="fc1,fc2,fc1_dgrad,fc2_dgrad,fc2_wgrad,fc1_wgrad")
    parser.add_argument("--variants", default="cutedsl", help="bench gemm's variants beside torch, e.g. cutedsl,quack")
    parser.add_argument("--config", default="{}", type=json.loads,
                        help='JSON of launcher options over each kernel\'s default, e.g. \'{"store": "tma"}\'')
    parser.add_argument("--kernels", default=None,
                        help="profile only kernels whose demangled name matches this regex (ncu --kernel-name), e.g. "
                             "'cutlass|gemm|blockwise|dequantize': torch's small kernels around the GEMMs cost 18 "
                             "replays each")
    parser.add_argument("--ncu", default=os.environ.get("NCU", "ncu"), help="the ncu executable")
    parser.add_argument("--import", dest="report", default=None,
                        help="read this .ncu-rep (an earlier run's) instead of profiling")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_out_argument(parser)
    args = parser.parse_args(argv)
    gemms, variants = args.gemms.split(","), args.variants.split(",")
    if args.child:
        _child(args.shape, gemms, variants, args.config)
        return
    ncu = shutil.which(args.ncu)
    if ncu is None:
        sys.exit(f"--ncu: {args.ncu!r} is not an executable on PATH (Nsight Compute is needed)")
    results = PartialResults("ncu", args.out)
    report = pathlib.Path(args.report) if args.report else results.path.with_suffix(".ncu-rep")
    if not args.report:
        command = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--nvtx", "--target-processes",
                   "all", *(["--kernel-name-base", "demangled", "--kernel-name", f"regex:{args.kernels}"]
                            if args.kernels else []),
                   *(f"--section={s}" for s in SECTIONS), "--metrics", ",".join(EXTRA_METRICS),
                   "--force-overwrite", "-o", str(report.with_suffix("")),  # ncu appends .ncu-rep
                   sys.executable, "-m", "gmlp.bench", "ncu", "--child", "--shape", args.shape,
                   "--gemms", args.gemms, "--variants", args.variants, "--config", json.dumps(args.config)]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
    raw = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw", "--print-nvtx-rename", "kernel"],
                         capture_output=True, text=True, check=True).stdout
    results.path.with_suffix(".csv").write_text(raw)  # the whole raw page, every metric of every kernel
    summary = summarize(_parse(raw))
    table = markdown(summary)
    print(table)
    path = results.write(dict(bench="ncu", **environment(torch.device("cuda")), shape=args.shape, config=args.config,
                              sections=list(SECTIONS), summary=summary,
                              table=table, report=report.name), complete=True)
    print(path)


if __name__ == "__main__":
    main()
