"""Under TRITON_INTERPRET=1, make Triton's interpreter compute what the GPU computes.

1. fp32 -> fp8 casts go through the spec's cast, and fp8 -> fp32 decodes through torch.

Triton's interpreter rounds fp32 -> fp8 wrongly (ties away from even, lost exponent carry,
flushed subnormals, no saturation; docs/design.md). On the GPU the same ``.to(fp8)`` compiles to
``cvt.rn.satfinite`` (round to nearest even, saturating, NaN -> 0x7F), which is exactly
``gmlp.mxfp8.spec.cast_to_element``; the compile tests assert that instruction and the H200 tests
check the compiled kernels bit for bit. With this fix the interpreted kernels (CPU tests, and
users without a GPU who set TRITON_INTERPRET=1) compute what the compiled ones do. The other way,
the interpreter decodes E4M3's NaN code as +-480 (docs/design.md); the GPU (and torch) give NaN.
Installed by
``gmlp.triton_ref`` only when the interpreter is on; remove it once the interpreter's cast
rounds like the hardware.

2. ``tl.dot`` of bf16 or fp8 operands: the interpreter multiplies the raw 16- or 8-bit patterns
   (docs/design.md); the fix widens them to fp32 first, as the tensor cores do (products of bf16
   or fp8 values are exact in fp32). Remove it once the interpreter's dot handles them.
3. fp32 -> bf16 casts: the interpreter truncates; the GPU (and torch) round to nearest even.
   bf16 -> fp32 casts: the interpreter loses bf16 subnormals (2**-133 becomes 0); the GPU widens
   the bits exactly.
4. numpy's floating-point warnings ("divide by zero", "overflow", "invalid value"): the
   interpreter evaluates each operation with numpy, which warns where the GPU computes the IEEE
   result silently (the FP8 blockwise scale's ``FMAX / amax`` of an all-zero block is +inf on
   both, then replaced by the kernel). They are ignored while an interpreted kernel runs (numpy's
   error state, not Python's warning filters: the values are unchanged and nothing else is
   silenced).
"""

from __future__ import annotations

import numpy as np
import torch

from gmlp.mxfp8.spec import ElementFormat, cast_to_element

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    import triton.language as tl
    from triton.runtime import interpreter

    formats = {tl.float8e4nv: ElementFormat.E4M3, tl.float8e5: ElementFormat.E5M2}
    original = interpreter.InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        source_format = formats.get(src.dtype.scalar)
        if source_format is not None and dst_type.scalar == tl.float32:
            codes = torch.from_numpy(np.ascontiguousarray(src.data).view(np.uint8))
            return interpreter.TensorHandle(codes.view(source_format.torch_dtype).float().numpy(), tl.float32)
        element_format = formats.get(dst_type.scalar)
        if element_format is None or src.dtype.scalar != tl.float32:
            return original(self, src, dst_type, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(src.data).astype(np.float32))
        encoded = cast_to_element(values, element_format).view(torch.uint8).numpy()
        return interpreter.TensorHandle(encoded, dst_type.scalar)

    original_dot = interpreter.InterpreterBuilder.create_dot

    def widen_bf16(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = np.ascontiguousarray(handle.data).view(np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def widen_fp8(handle):
        source_format = formats.get(handle.dtype.scalar)
        if source_format is None:
            return handle
        codes = torch.from_numpy(np.ascontiguousarray(handle.data).view(np.uint8))
        return interpreter.TensorHandle(codes.view(source_format.torch_dtype).float().numpy(), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a, b = (widen_fp8(widen_bf16(operand)) for operand in (a, b))
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    original_cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:
            return widen_bf16(src)
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return original_cast(self, src, dst_type)
        values = torch.from_numpy(np.ascontiguousarray(src.data).astype(np.float32))
        return interpreter.TensorHandle(values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), tl.bfloat16)

    original_launch = interpreter.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        # a kernel's arithmetic raises no floating-point exceptions on the GPU (fix 4 above)
        with np.errstate(all="ignore"):
            return original_launch(self, *args, **kwargs)

    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.GridExecutor.__call__ = launch
    _installed = True
