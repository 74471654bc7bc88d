"""What a compiled kernel's PTX and cubin say once assembled: the cubin's resources (registers,
stack, local memory: cuobjdump), its SASS, and the register split of a warp-specialized kernel.
The tools are the ones on PATH or the ones Triton bundles; each helper returns None where none runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

__all__ = ["kernel_resources", "cuobjdump", "sass", "check_register_split"]


def _ptxas_candidates() -> list[str]:
    """ptxas binaries on PATH, then the ones Triton bundles: a cuobjdump sits beside them."""
    candidates = [shutil.which("ptxas")]
    try:
        import triton

        bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        candidates += [os.path.join(bin_dir, "ptxas-blackwell"), os.path.join(bin_dir, "ptxas")]
    except ImportError:
        pass
    return [tool for tool in candidates if tool and os.access(tool, os.X_OK)]


def kernel_resources(cubin: bytes) -> dict[str, int] | None:
    """{"registers", "stack", "shared", "local"} of the cubin's kernel as its compiler built it
    (``cuobjdump -res-usage``; a spill shows as a stack frame in local memory); None without a
    cuobjdump that reads the cubin. Reading the cubin the kernel runs is also cheaper than a
    second ``ptxas -v`` of its PTX (milliseconds against seconds per config)."""
    result = cuobjdump(cubin, "-res-usage")
    if result is None:
        return None
    match = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", result.stdout)
    return None if match is None else dict(zip(("registers", "stack", "shared", "local"), map(int, match.groups())))


def cuobjdump(cubin: bytes, option: str) -> subprocess.CompletedProcess | None:
    """``cuobjdump OPTION`` of the cubin (the one on PATH, else the one beside a ptxas Triton
    bundles); None without a cuobjdump."""
    tools = [shutil.which("cuobjdump")]
    tools += [os.path.join(os.path.dirname(tool), "cuobjdump") for tool in _ptxas_candidates()]
    tool = next((t for t in tools if t and os.access(t, os.X_OK)), None)
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([tool, option, handle.name], capture_output=True, text=True)


def sass(cubin: bytes) -> str | None:
    """The cubin's SASS (``cuobjdump -sass``); None without a cuobjdump."""
    result = cuobjdump(cubin, "-sass")
    if result is None:
        return None
    assert result.returncode == 0, result.stderr
    return result.stdout


def check_register_split(ptx: str, report: dict[str, int] | None, producer: int = 40, consumer: int = 232) -> None:
    """The PTX lowers the producer warpgroup to ``producer`` registers and raises each consumer
    warpgroup to ``consumer``, and the split fits the CTA's launch allocation: ``setmaxnreg.inc``
    draws on the CTA's pool (SASS ``USETMAXREG.TRY_ALLOC.CTAPOOL``, retried until it succeeds),
    which holds threads x the launch count (the cubin's, ``kernel_resources``, where a cuobjdump
    reads it, else the most a CTA of that size can get, 65536 / threads rounded down to 8): asking
    for more can hang."""
    assert re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+);", ptx) == [str(producer)]
    assert re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+);", ptx) == [str(consumer)]
    threads = int(re.search(r"\.reqntid (\d+), 1, 1", ptx).group(1))
    launch = report["registers"] if report is not None else 65536 // threads // 8 * 8
    warpgroups = threads // 128
    assert producer + (warpgroups - 1) * consumer <= warpgroups * launch, (producer, consumer, threads, launch)
