"""Under TRITON_INTERPRET=1, route the interpreter's fp32 -> fp8 casts through the spec's cast.

Triton's interpreter rounds fp32 -> fp8 wrongly (ties away from even, lost exponent carry,
flushed subnormals, no saturation; DESIGN.md). On the GPU the same ``.to(fp8)`` compiles to
``cvt.rn.satfinite`` (round to nearest even, saturating, NaN -> 0x7F), which is exactly
``gmlp.mxfp8.cast_to_element``; the compile tests assert that instruction and the H200 tests
check the compiled kernels bit for bit. With this fix the interpreted kernels (CPU tests, and
users without a GPU who set TRITON_INTERPRET=1) compute what the compiled ones do. Installed by
``gmlp.triton_ref`` only when the interpreter is on; remove it once the interpreter's cast
rounds like the hardware.
"""

from __future__ import annotations

import numpy as np
import torch

from gmlp.mxfp8 import ElementFormat, cast_to_element

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
        element_format = formats.get(dst_type.scalar)
        if element_format is None or src.dtype.scalar != tl.float32:
            return original(self, src, dst_type, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(src.data).astype(np.float32))
        encoded = cast_to_element(values, element_format).view(torch.uint8).numpy()
        return interpreter.TensorHandle(encoded, dst_type.scalar)

    interpreter.InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    _installed = True
