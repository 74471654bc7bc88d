"""CuTeDSL launcher of the fused one-pass MXFP8 quantize (rowwise and/or columnwise, grouped).

Same signature and bit-identical results as ``gmlp.mxfp8.reference.quantize_mxfp8_ref``; the kernel
is in ``_quantize_kernel``. Importing this module imports cutlass-dsl and raises if it is missing
or broken (``gmlp.cutedsl.import_error`` turns that into a fallback reason).

One compiled kernel per ``KernelConfig`` (dtype, orientations, layout, grouping, format, mode);
shapes are runtime values, so ``compile_quantize_kernel`` builds the same code with fake tensors
for any architecture, without a GPU.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.cutedsl import compile_cache
from gmlp.cutedsl._quantize_kernel import TILE_COLS, TILE_ROWS, QuantizeMXFP8Kernel
from gmlp.cutedsl.device_scope import on_device
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.buffers import allocate_buffers
from gmlp.mxfp8.problem import QuantizeProblem, validate_quantize_args
from gmlp.mxfp8.routing import DeviceGroups, given_or_device_groups
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized

__all__ = [
    "quantize_mxfp8",
    "problem_support",
    "KernelConfig",
    "CompiledQuantizeKernel",
    "compile_quantize_kernel",
    "SUPPORTED_ARCHS",
    "artifact_text",
]

SUPPORTED_ARCHS = ("sm_90a", "sm_100a")
_INPUT_DTYPES = {torch.bfloat16: cutlass.BFloat16, torch.float32: cutlass.Float32}
_INT32_MAX = 2**31 - 1
_ALIGN = 16  # bytes: 16-byte vector loads of x and stores of data and scales


@dataclass(frozen=True)
class KernelConfig:
    """What one compiled kernel is specialized on (everything else is a runtime value)."""

    dtype: torch.dtype  # x: bfloat16 or float32
    rowwise: bool
    columnwise: bool
    swizzle: bool
    grouped: bool
    element_format: ElementFormat
    scale_mode: ScaleMode

    @classmethod
    def of(cls, problem: QuantizeProblem) -> "KernelConfig":
        return cls(problem.dtype, problem.rowwise, problem.columnwise, problem.swizzle, problem.grouped,
                   problem.element_format, problem.scale_mode)


def problem_support(problem: QuantizeProblem) -> Reason | None:
    """None if the CuTeDSL kernel runs ``problem``, else the reason it does not.

    Every combination of the validated arguments is supported (bf16 and fp32 inputs, rowwise,
    columnwise or both, swizzled or compact scales, grouped or not, E4M3/E5M2, RCEIL/FLOOR);
    the only limit is 32-bit row, tile and scale-byte indices. (The device is the dispatcher's
    system question; the launcher checks it too.)
    """
    if problem.dtype not in _INPUT_DTYPES:
        return Reason(ReasonKind.SHAPE, f"x dtype {problem.dtype} not supported by the CuTeDSL quantize kernel "
                                        f"(supported: {', '.join(str(d) for d in _INPUT_DTYPES)})")
    rows, cols, experts = problem.num_rows, problem.num_cols, problem.num_experts
    if problem.row_stride != cols:
        return Reason(ReasonKind.SHAPE, f"x's rows are {problem.row_stride} elements apart, not K={cols} (a strided "
                                        "view, such as W1's interleaved gate or up rows, 2H apart): the CuTeDSL "
                                        "quantize reads contiguous rows")
    padded_rows = rows + (TILE_ROWS - 1) * experts
    tiles = scale_layout.max_row_tiles(rows, experts)
    scale_bytes = tiles * scale_layout.ceil_div(cols, TILE_COLS) * 512
    if padded_rows > _INT32_MAX or scale_bytes > _INT32_MAX:
        return Reason(ReasonKind.SHAPE, f"T={rows}, K={cols}, E={experts} too large for the CuTeDSL quantize kernel's "
                                        f"32-bit indices (T + 127*E = {padded_rows}, scale bytes {scale_bytes}; "
                                        f"limit {_INT32_MAX})")
    return None


# ---------------------------------------------------------------------------------------------
# Compilation (cached per config and architecture)
# ---------------------------------------------------------------------------------------------


def _kernel(config: KernelConfig) -> QuantizeMXFP8Kernel:
    return QuantizeMXFP8Kernel(
        _INPUT_DTYPES[config.dtype], rowwise=config.rowwise, columnwise=config.columnwise,
        swizzle=config.swizzle, grouped=config.grouped, e5m2=config.element_format is ElementFormat.E5M2,
        floor_mode=config.scale_mode is ScaleMode.FLOOR,
    )


def _fake_arguments(config: KernelConfig) -> tuple:
    """Symbolic stand-ins of the kernel's arguments, in order (None for absent ones).

    T and K are shared between tensors so that the runtime checks they agree; alignments are
    what the launcher guarantees (16-byte bases, K a multiple of 32).
    """
    rows, cols = cute.sym_int(), cute.sym_int(divisibility=BLOCK_SIZE)

    def tensor(dtype, shape, row_stride_divisibility=1, align=_ALIGN):  # row-major, 1-D or 2-D
        strides = (cute.sym_int64(divisibility=row_stride_divisibility), 1) if len(shape) == 2 else (1,)
        return make_fake_tensor(dtype, shape, stride=strides, assumed_align=align)

    u8 = cutlass.Uint8
    x = tensor(_INPUT_DTYPES[config.dtype], (rows, cols), BLOCK_SIZE)
    row_data = tensor(u8, (rows, cols), BLOCK_SIZE) if config.rowwise else None
    col_data = tensor(u8, (cols, rows)) if config.columnwise else None
    if config.swizzle:
        row_scales = tensor(u8, (cute.sym_int(divisibility=512),)) if config.rowwise else None
        col_scales = tensor(u8, (cute.sym_int(divisibility=512),)) if config.columnwise else None
    else:
        row_scales = tensor(u8, (rows, cute.sym_int()), align=1) if config.rowwise else None
        col_scales = tensor(u8, (cols, cute.sym_int()), align=1) if config.columnwise else None
    row_start = tile_start = block_start = None
    if config.grouped:
        starts = cute.sym_int()  # E + 1
        row_start = tensor(cutlass.Int32, (starts,), align=4)
        tile_start = tensor(cutlass.Int32, (starts,), align=4)
        if config.columnwise and not config.swizzle:
            block_start = tensor(cutlass.Int32, (starts,), align=4)
    return (x, row_data, row_scales, col_data, col_scales, row_start, tile_start, block_start,
            make_fake_stream(use_tvm_ffi_env_stream=True))


@dataclass(frozen=True)
class CompiledQuantizeKernel:
    """A kernel compiled ahead of time: the callable (runs on a matching GPU) and its PTX."""

    config: KernelConfig
    arch: str
    function: object
    ptx: str
    cubin: bytes  # b"" for the native (runtime) build
    min_blocks_per_sm: int  # CTAs per SM the kernel is built for (registers; shared memory allows it)
    smem_bytes: int  # shared memory per CTA (with the driver's reserved 1 KB)


def artifact_text(value) -> str:
    """cutlass-dsl returns either the artifact's text or the path of the dumped file."""
    if isinstance(value, bytes):
        value = value.decode()
    if len(value) < 4096 and "\n" not in value and os.path.isfile(value):
        with open(value) as handle:
            return handle.read()
    return value


@functools.lru_cache(maxsize=None)
def _compile(config: KernelConfig, arch: str | None) -> CompiledQuantizeKernel:
    """Compile ``config``; arch None targets the current GPU (the runtime path, through the
    persistent ``compile_cache``)."""
    options = "--enable-tvm-ffi"
    kernel = _kernel(config)
    resources = dict(min_blocks_per_sm=kernel.min_blocks_per_sm, smem_bytes=kernel.smem_bytes())
    if arch is None:
        function = compile_cache.compile_for_this_gpu(kernel, _fake_arguments(config), config, options)
        return CompiledQuantizeKernel(config, "native", function, ptx="", cubin=b"", **resources)
    with tempfile.TemporaryDirectory(prefix="gmlp_cutedsl_") as dump_dir:
        function = cute.compile(kernel, *_fake_arguments(config),
                                options=f"{options} --gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}")
        ptx = artifact_text(function.__ptx__)
        cubin = function.__cubin__
        cubin = cubin if isinstance(cubin, bytes) else open(cubin, "rb").read()  # bytes or a path
    return CompiledQuantizeKernel(config, arch, function, ptx, cubin, **resources)


def compile_quantize_kernel(
    arch: str,
    *,
    num_rows: int,
    num_cols: int,
    num_experts: int | None,
    dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    swizzle: bool,
    element_format: ElementFormat,
    scale_mode: ScaleMode,
) -> CompiledQuantizeKernel:
    """Compile the kernel for ``arch`` (sm_90a or sm_100a) without a GPU; returns it with its PTX.

    The shape (num_rows T, num_cols K, num_experts E; None: ungrouped) is checked against the
    kernel's support; the compiled code itself is shape-generic.
    """
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"arch must be one of {SUPPORTED_ARCHS}, got {arch=}")
    x = torch.empty(num_rows, num_cols, dtype=dtype, device="meta")
    splits = None if num_experts is None else torch.empty(num_experts, dtype=torch.int32, device="meta")
    problem = validate_quantize_args(x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=splits,
                                     element_format=element_format, scale_mode=scale_mode)
    reason = problem_support(problem)
    if reason is not None:
        raise ValueError(f"cannot compile the CuTeDSL quantize kernel for this problem: {reason}")
    return _compile(KernelConfig.of(problem), arch)


# ---------------------------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------------------------


def quantize_mxfp8(
    x: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = False,
    swizzle: bool = True,
    split_sizes: torch.Tensor | None = None,
    element_format: ElementFormat = ElementFormat.E4M3,
    scale_mode: ScaleMode = ScaleMode.RCEIL,
    groups: DeviceGroups | None = None,  # device_groups(split_sizes, T), when the caller already has it
) -> MXFP8Quantized:
    """Quantize x (T, K) in one pass; same contract as ``gmlp.mxfp8.reference.quantize_mxfp8_ref``.

    Split sizes stay on the device (no host sync): their prefix sums are computed there, every
    buffer is sized from host-known bounds, and the kernel finds each tile's expert itself.
    """
    # validate
    problem = validate_quantize_args(
        x, rowwise=rowwise, columnwise=columnwise, swizzle=swizzle, split_sizes=split_sizes,
        element_format=element_format, scale_mode=scale_mode,
    )
    if x.device.type != "cuda":
        raise ValueError(f"the CuTeDSL quantize kernel needs CUDA tensors, got {x.device=}")
    reason = problem_support(problem)
    if reason is not None:
        raise ValueError(f"the CuTeDSL quantize kernel cannot run this problem: {reason}")
    rows, device = problem.num_rows, x.device

    # canonicalize: a 16-byte aligned x (only an odd view needs the copy); device prefix sums of
    # rows, 128-row tiles and (compact columnwise) 32-row blocks
    if x.data_ptr() % _ALIGN != 0:
        x = x.clone()
    row_start = tile_start = block_start = None
    groups = given_or_device_groups(split_sizes, rows, groups)
    if groups is not None:
        row_start, tile_start = groups.row_start, groups.tile_start
        if columnwise and not swizzle:
            block_start = groups.block_start
    out = allocate_buffers(problem)  # with a launch the kernel writes every scale byte but compact columnwise padding

    # launch: max_row_tiles(T, E) * ceil(K / 128) work items, one CTA each
    if rows > 0 and problem.num_cols > 0:
        kernel = _compile(KernelConfig.of(problem), None).function
        as_bytes = lambda t: None if t is None else t.view(torch.uint8)  # noqa: E731 (fp8 as raw bytes)
        with on_device(device):
            kernel(x, as_bytes(out.row_data), out.row_scales, as_bytes(out.col_data), out.col_scales,
                   row_start, tile_start, block_start)

    return out.result(problem, split_sizes, groups)

