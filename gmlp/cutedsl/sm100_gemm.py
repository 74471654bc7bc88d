"""The SM100 grouped GEMM ``D = A @ B_g^T`` (FC2 forward; FC1 dgrad once its B layout is settled,
AGENTS.md): cuDNN frontend's ``GroupedGemmQuantSm100`` on gmlp's MXFP8 tensors.

What gmlp hands over, and why it fits the kernel's contract (cuDNN frontend 1.32):
- A: Q_row of the token rows in the padded layout (``sm100_layout``: every expert starts at a
  multiple of 256 rows), quantized as one ungrouped (M_pad, K) matrix with swizzled scales; its
  flat scale buffer is the kernel's SFA, (32, 4, M_pad/128, 4, ceil(K/128), 1) tiles.
- B: Q_row of the (E * N, K) weight stack: data (E, N, K), K-major; with N a multiple of 128 no
  128-row scale tile crosses experts, so gmlp's swizzled scales are the kernel's flat SFB.
- Scales are E8M0 bytes, viewed as ``float8_e8m0fnu``; ``sf_vec_size`` 32 (MXFP8).
- D: bf16 (M_pad, N); alpha (E,) ones; ``padded_offsets`` (E,) int32 cumulative padded ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.cutedsl.cudnn_kernels import kernel_class
from gmlp.cutedsl.sm100_layout import M_ALIGNED
from gmlp.quantized import MXFP8Tensor, QuantAxis
from gmlp.scale_layout import SCALE_TILE_ROWS

__all__ = ["GroupedGemmArgs", "grouped_gemm_args", "grouped_gemm_kernel"]

SF_VEC_SIZE = 32


@dataclass(frozen=True)
class GroupedGemmArgs:
    """The tensors of one call, in the kernel's terms."""

    a: torch.Tensor  # (M_pad, K) fp8
    sfa: torch.Tensor  # flat float8_e8m0fnu
    b: torch.Tensor  # (E, N, K) fp8
    sfb: torch.Tensor  # flat float8_e8m0fnu
    padded_offsets: torch.Tensor  # (E,) int32
    alpha: torch.Tensor  # (E,) fp32
    d: torch.Tensor  # (M_pad, N) bf16


def _swizzled_rowwise(name: str, value) -> MXFP8Tensor:
    if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.ROWWISE and value.swizzled
            and value.split_sizes is None):
        raise TypeError(f"{name} must be an ungrouped rowwise MXFP8Tensor with swizzled scales, got {value!r}")
    return value


def grouped_gemm_args(a: MXFP8Tensor, b: MXFP8Tensor, padded_offsets: torch.Tensor,
                      out: torch.Tensor | None = None) -> GroupedGemmArgs:
    """Check gmlp's operands against the kernel's contract and express them in its terms.

    ``a``: Q_row of the padded token rows (M_pad, K); ``b``: Q_row of the (E * N, K) weight stack;
    ``padded_offsets``: ``sm100_layout.padded_rows(...).offsets``; ``out``: (M_pad, N) bf16 or None.
    """
    a, b = _swizzled_rowwise("a", a), _swizzled_rowwise("b", b)
    rows, k = a.source_shape
    stack_rows, b_k = b.source_shape
    experts = padded_offsets.numel()
    if rows % M_ALIGNED:
        raise ValueError(f"a must hold the padded layout: rows a multiple of {M_ALIGNED}, got {rows}")
    if b_k != k or stack_rows % experts:
        raise ValueError(f"b must stack {experts} experts' (N, K={k}) matrices, got a ({stack_rows}, {b_k}) source")
    n = stack_rows // experts
    if n % SCALE_TILE_ROWS:
        raise ValueError(f"N must be a multiple of {SCALE_TILE_ROWS} (a scale tile may not cross experts), got {n}")
    if a.data.dtype != b.data.dtype:
        raise TypeError(f"a and b must have the same fp8 format, got {a.data.dtype} and {b.data.dtype}")
    if padded_offsets.dtype != torch.int32 or padded_offsets.dim() != 1:
        raise TypeError(f"padded_offsets must be an (E,) int32 tensor, got {padded_offsets.dtype} {tuple(padded_offsets.shape)}")
    device = a.data.device
    if out is None:
        out = torch.empty(rows, n, dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (rows, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 ({rows}, {n}), got {out.dtype} {tuple(out.shape)}")
    return GroupedGemmArgs(
        a=a.data, sfa=a.scales.view(torch.float8_e8m0fnu), b=b.data.view(experts, n, k),
        sfb=b.scales.view(torch.float8_e8m0fnu), padded_offsets=padded_offsets,
        alpha=torch.ones(experts, dtype=torch.float32, device=device), d=out)


def grouped_gemm_kernel(args: GroupedGemmArgs):
    """The cuDNN frontend kernel object for calls like ``args`` (construct, then ``check_support``,
    ``compile``, ``execute``: the tensors given here are its samples)."""
    return kernel_class("grouped_gemm")(
        sample_a=args.a, sample_sfa=args.sfa, sample_padded_offsets=args.padded_offsets, sample_alpha=args.alpha,
        sample_d=args.d, sample_b=args.b, sample_sfb=args.sfb, sf_vec_size=SF_VEC_SIZE)
