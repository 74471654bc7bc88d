"""Compile SM100 kernels on a machine without a Blackwell GPU: only the device queries are stubbed.

``simulated_sm100()`` makes torch report a compute capability 10.0 GPU and cutlass a 148-SM one
(a B200; the persistent kernels bake their cluster count in), lets the kernel objects allocate
their compile-time workspace on the CPU (128-byte aligned, as they check; the weight-gradient
kernel, which compiles against its workspace's pointer, gets a fake global-memory tensor of the
same size instead), and makes every ``cute.compile`` target sm_100a and keep its PTX. Everything
is restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re

import pytest
import torch

NUM_SMS = 148


class _HardwareInfo:
    def __init__(self, device_id: int = 0):
        del device_id

    def get_max_active_clusters(self, cluster_size: int, stream=None) -> int:
        return NUM_SMS // cluster_size

    def get_device_multiprocessor_count(self) -> int:
        return NUM_SMS


def _aligned_cpu_empty(real_empty):
    def empty(*args, **kwargs):
        device = kwargs.get("device")
        if device is None or str(device).split(":")[0] not in ("cuda", "meta"):
            return real_empty(*args, **kwargs)
        kwargs["device"] = "cpu"
        like = real_empty(*args, **kwargs)
        nbytes = like.numel() * like.element_size()
        raw = real_empty(nbytes + 128, dtype=torch.uint8)
        shift = (-raw.data_ptr()) % 128
        return raw[shift:shift + nbytes].view(like.dtype).view(like.shape)
    return empty


@contextlib.contextmanager
def simulated_sm100(dump_dir: pathlib.Path):
    """Yields the list that collects every compiled function (``__ptx__`` holds its PTX)."""
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_100a")
    cutlass = pytest.importorskip("cutlass")
    import cutlass.cute as cute
    import cutlass.utils

    compiled: list = []
    real_compile = cute.compile

    def compile_for_sm100(*args, options: str = "", **kwargs):
        options = f"{options} --gpu-arch sm_100a --keep-ptx --dump-dir {dump_dir}".strip()
        function = real_compile(*args, options=options, **kwargs)
        compiled.append(function)
        return function

    import cudnn.gemm.cutedsl.grouped.wgrad._blockscaled_api as wgrad_api

    real_from_dlpack = wgrad_api.from_dlpack

    def workspace_from_dlpack(tensor, *args, **kwargs):
        if tensor.device.type == "cpu" and tensor.dtype == torch.uint8 and tensor.dim() == 1:  # the workspace
            return cute.runtime.make_fake_tensor(cutlass.Uint8, (tensor.numel(),), stride=(1,), assumed_align=128)
        return real_from_dlpack(tensor, *args, **kwargs)

    patches = [(torch.cuda, "is_available", lambda: True), (torch.cuda, "current_device", lambda: 0),
               (torch.cuda, "get_device_capability", lambda device=None: (10, 0)),
               (cutlass.utils, "HardwareInfo", _HardwareInfo), (torch, "empty", _aligned_cpu_empty(torch.empty)),
               (cute, "compile", compile_for_sm100), (wgrad_api, "from_dlpack", workspace_from_dlpack)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield compiled
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def ptx_text(function) -> str:
    """The PTX of a compiled function (its ``__ptx__`` is the text or the path of the dumped file)."""
    ptx = getattr(function, "__ptx__", "")
    if isinstance(ptx, bytes):
        ptx = ptx.decode(errors="replace")
    if isinstance(ptx, str) and "\n" not in ptx and os.path.isfile(ptx):
        return pathlib.Path(ptx).read_text(errors="replace")
    return ptx or ""


BLOCK_SCALED_MMA = re.compile(r"tcgen05\.mma\S*kind::mxf8f6f4\S*block_scale")


class CompilingLauncher:
    """A launcher for ``gmlp.cutedsl.sm100.layer`` that compiles each call's kernel for sm_100a
    (once per call signature) instead of running it; ``ptx[site]`` holds the PTX of each site."""

    def __init__(self, dump_dir: pathlib.Path):
        self.dump_dir, self.ptx, self._by_signature = dump_dir, {}, {}

    def __call__(self, site: str, call) -> None:
        key = call.signature()
        if key not in self._by_signature:
            kernel = call.kernel()
            with simulated_sm100(self.dump_dir) as compiled:
                assert kernel.check_support(), f"{site}: {call.step} refused its arguments"
                kernel.compile()
            assert len(compiled) == 1, f"{site}: {len(compiled)} compiled functions"
            self._by_signature[key] = ptx_text(compiled[0])
        self.ptx[site] = self._by_signature[key]
