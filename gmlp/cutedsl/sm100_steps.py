"""The SM100 path's fused steps on cuDNN frontend's grouped kernels, from gmlp's MXFP8 tensors:
for each step, the tensors handed over (checked against the kernel's contract) and the kernel
object built from them (construct, ``check_support``, ``compile``, ``execute``).

- ``grouped_gemm``: ``D = A @ B_g^T`` in bf16, ``GroupedGemmQuantSm100``: FC2 forward (B =
  Q_row of W2) and FC1 dgrad (``fc1_dgrad_args``: A = dh as the dGLU kernel wrote it, B = W1 as
  the kernel's N-major B, like FC2 dgrad's W2 below);
- ``fc1_glu``: FC1 with SwiGLU and probs, ``a`` quantized both ways, ``GroupedGemmGluSm100``;
- ``fc2_wgrad``: dW2 = Q_col(dy)^T Q_col(a) per expert, ``GroupedGemmWgradSm100``;
- ``fc2_dgrad_glu``: FC2 dgrad with the SwiGLU backward and deterministic dprobs, dh quantized
  both ways, ``GroupedGemmDgluSm100``. Its B is W2 in its own (E, H, F) order with scale blocks
  along H (the kernel's N-major B): gmlp's Q_col of the (E * H, F) stack grouped by [H] * E has
  those scales, and its data is permuted back from (F, E * H) by one fp8 copy (a quantize that
  keeps the source orientation would avoid it, AGENTS.md).

What gmlp hands over, and why it fits the contracts (cuDNN frontend 1.32):
- A: Q_row of the token rows in the padded layout (``sm100_layout``: every expert starts at a
  multiple of 256 rows), quantized as one ungrouped (M_pad, K) matrix with swizzled scales; its
  flat scale buffer is the kernel's SFA, (32, 4, M_pad/128, 4, ceil(K/128), 1) tiles.
- B: Q_row of the (E * N, K) weight stack: data (E, N, K), K-major; with N a multiple of 128 no
  128-row scale tile crosses experts, so gmlp's swizzled scales are the kernel's flat SFB.
- Scales are E8M0 bytes, viewed as ``float8_e8m0fnu``; ``sf_vec_size`` 32 (MXFP8).
- D: bf16 (M_pad, N); alpha (E,) ones; ``padded_offsets`` (E,) int32 cumulative padded ends.
- FC1's B is Q_row of the gate/up-interleaved W1 stack (``sm100_layout.interleave_gate_up``);
  its C comes out interleaved; ``a`` comes out as D (Q_row, swizzled, padded rows) and D_col
  ((M_pad, F) row-major, 32-row blocks per column, per-expert scales: ``discrete_col_sfd``).
  Padding rows must read zero probs, so that their activations, and the amax, stay zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gmlp.cutedsl.cudnn_kernels import kernel_class
from gmlp.cutedsl.sm100_layout import M_ALIGNED
from gmlp import scale_layout
from gmlp.quantized import MXFP8Tensor, QuantAxis
from gmlp.scale_layout import SCALE_TILE_ROWS

__all__ = ["GroupedGemmArgs", "grouped_gemm_args", "grouped_gemm_kernel", "FC1GluArgs", "fc1_glu_args",
           "fc1_glu_kernel", "WgradArgs", "fc2_wgrad_args", "wgrad_kernel", "FC2DgradGluArgs", "fc2_dgrad_glu_args",
           "fc2_dgrad_glu_kernel", "fc1_dgrad_args"]

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
    b_major: str = "k"  # "n": b is (E, K, N), N contiguous


def _swizzled_rowwise(name: str, value) -> MXFP8Tensor:
    if not (isinstance(value, MXFP8Tensor) and value.axis is QuantAxis.ROWWISE and value.swizzled
            and value.split_sizes is None):
        raise TypeError(f"{name} must be an ungrouped rowwise MXFP8Tensor with swizzled scales, got {value!r}")
    return value


def _operands(a: MXFP8Tensor, b: MXFP8Tensor, padded_offsets: torch.Tensor) -> tuple[int, int, int, int]:
    """(M_pad, N, K, E) of A (padded token rows) times B (an (E * N, K) stack), both Q_row
    swizzled, once they satisfy the kernels' contract."""
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
    return rows, n, k, experts


def _e8m0(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(torch.float8_e8m0fnu)


def grouped_gemm_args(a: MXFP8Tensor, b: MXFP8Tensor, padded_offsets: torch.Tensor,
                      out: torch.Tensor | None = None) -> GroupedGemmArgs:
    """Check gmlp's operands against the kernel's contract and express them in its terms.

    ``a``: Q_row of the padded token rows (M_pad, K); ``b``: Q_row of the (E * N, K) weight stack;
    ``padded_offsets``: ``sm100_layout.padded_rows(...).offsets``; ``out``: (M_pad, N) bf16 or None.
    """
    rows, n, k, experts = _operands(a, b, padded_offsets)
    device = a.data.device
    if out is None:
        out = torch.empty(rows, n, dtype=torch.bfloat16, device=device)
    elif tuple(out.shape) != (rows, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 ({rows}, {n}), got {out.dtype} {tuple(out.shape)}")
    return GroupedGemmArgs(
        a=a.data, sfa=_e8m0(a.scales), b=b.data.view(experts, n, k), sfb=_e8m0(b.scales), padded_offsets=padded_offsets,
        alpha=torch.ones(experts, dtype=torch.float32, device=device), d=out)


def grouped_gemm_kernel(args: GroupedGemmArgs):
    """The cuDNN frontend kernel object for calls like ``args`` (construct, then ``check_support``,
    ``compile``, ``execute``: the tensors given here are its samples)."""
    return kernel_class("grouped_gemm")(
        sample_a=args.a, sample_sfa=args.sfa, sample_padded_offsets=args.padded_offsets, sample_alpha=args.alpha,
        sample_d=args.d, sample_b=args.b, sample_sfb=args.sfb, sf_vec_size=SF_VEC_SIZE, b_major=args.b_major)


@dataclass(frozen=True)
class FC1GluArgs:
    """The tensors of one FC1 call, in the GLU kernel's terms (outputs allocated here)."""

    a: torch.Tensor  # (M_pad, H) fp8: Q_row(x), padded rows
    sfa: torch.Tensor
    b: torch.Tensor  # (E, 2F, H) fp8: Q_row(W1), gate/up interleaved in 32-row blocks
    sfb: torch.Tensor
    padded_offsets: torch.Tensor
    alpha: torch.Tensor
    prob: torch.Tensor  # (M_pad,) fp32, zero on padding rows
    c: torch.Tensor  # (M_pad, 2F) bf16, interleaved like b
    d: torch.Tensor  # (M_pad, F) fp8: Q_row(a)
    sfd_row: torch.Tensor
    d_col: torch.Tensor  # (M_pad, F) fp8: Q_col(a), data in rows, 32-row blocks per column
    sfd_col: torch.Tensor
    amax: torch.Tensor  # (E, 1) fp32
    norm_const: torch.Tensor  # (1,) fp32, 1.0


def fc1_glu_args(x: MXFP8Tensor, w1: MXFP8Tensor, padded_offsets: torch.Tensor, prob: torch.Tensor) -> FC1GluArgs:
    """FC1's call: ``x`` Q_row of the padded token rows (M_pad, H); ``w1`` Q_row of the
    gate/up-interleaved (E * 2F, H) stack; ``prob`` (M_pad,) fp32 with zeros on padding rows."""
    rows, n, _, experts = _operands(x, w1, padded_offsets)
    ffn = n // 2
    if ffn % 64:  # the GLU kernel's N = 2F must be a multiple of 128 here (scale tiles), and of 64 there
        raise ValueError(f"F must be a multiple of 64, got {ffn}")
    if prob.dtype != torch.float32 or tuple(prob.shape) != (rows,):
        raise ValueError(f"prob must be fp32 ({rows},), got {prob.dtype} {tuple(prob.shape)}")
    device, fp8 = x.data.device, x.data.dtype
    scale_bytes = (rows // 128) * scale_layout.swizzled_size(128, ffn // 32)  # (M_pad, F) in 32-wide blocks
    return FC1GluArgs(
        a=x.data, sfa=_e8m0(x.scales), b=w1.data.view(experts, n, -1), sfb=_e8m0(w1.scales),
        padded_offsets=padded_offsets, alpha=torch.ones(experts, dtype=torch.float32, device=device), prob=prob,
        c=torch.empty(rows, n, dtype=torch.bfloat16, device=device),
        d=torch.empty(rows, ffn, dtype=fp8, device=device),
        sfd_row=_e8m0(torch.empty(scale_bytes, dtype=torch.uint8, device=device)),
        d_col=torch.empty(rows, ffn, dtype=fp8, device=device),
        sfd_col=_e8m0(torch.empty(scale_bytes, dtype=torch.uint8, device=device)),  # (F, M_pad) in 32-high blocks
        amax=torch.zeros(experts, 1, dtype=torch.float32, device=device),
        norm_const=torch.ones(1, dtype=torch.float32, device=device))


def fc1_glu_kernel(args: FC1GluArgs, activation: str = "swiglu"):
    """The GLU kernel object for calls like ``args``; SwiGLU only so far (qgeglu maps to the
    kernel's clamped "geglu" with run-time parameters, not wired yet)."""
    if activation != "swiglu":
        raise ValueError(f"the SM100 FC1 step runs swiglu so far, got {activation!r}")
    return kernel_class("fc1_glu")(
        sample_a=args.a, sample_c=args.c, sample_d=args.d, sample_sfa=args.sfa,
        sample_padded_offsets=args.padded_offsets, sample_alpha=args.alpha, sample_d_col=args.d_col,
        sample_b=args.b, sample_sfb=args.sfb, sample_sfd_row=args.sfd_row, sample_sfd_col=args.sfd_col,
        sample_amax=args.amax, sample_norm_const=args.norm_const, sample_prob=args.prob,
        sf_vec_size=SF_VEC_SIZE, discrete_col_sfd=True, act_func=activation)


@dataclass(frozen=True)
class WgradArgs:
    """The tensors of one weight-gradient call, in the kernel's terms."""

    a: torch.Tensor  # (M, T_pad) fp8, tokens contiguous
    sfa: torch.Tensor
    b: torch.Tensor  # (T_pad, N) fp8
    sfb: torch.Tensor
    offsets: torch.Tensor  # (E,) int32 cumulative padded token ends, on the CPU (read at construction)
    wgrad: torch.Tensor  # (E, M, N) fp32, added to (main_grad)


def fc2_wgrad_args(dy_col: MXFP8Tensor, fc1: FC1GluArgs, offsets: torch.Tensor, main_grad: torch.Tensor) -> WgradArgs:
    """dW2's call. ``dy_col``: Q_col of the padded dy rows, grouped by the padded sizes, swizzled
    (data (H, T_pad), tokens contiguous); B is FC1's D_col as the GLU kernel wrote it (its
    per-expert column scales are this kernel's SF layout); ``offsets``: the padded ends on the
    CPU (the kernel object reads them when built: a host value, AGENTS.md). The kernel adds
    into ``main_grad`` (E, H, F) fp32."""
    if not (isinstance(dy_col, MXFP8Tensor) and dy_col.axis is QuantAxis.COLUMNWISE and dy_col.swizzled):
        raise TypeError(f"dy_col must be a columnwise MXFP8Tensor with swizzled scales, got {dy_col!r}")
    hidden, rows = dy_col.data.shape
    experts, ffn = offsets.numel(), fc1.d_col.shape[1]
    if rows != fc1.d_col.shape[0] or hidden % SCALE_TILE_ROWS:
        raise ValueError(f"dy_col must be ({hidden}, {fc1.d_col.shape[0]}) with H a multiple of {SCALE_TILE_ROWS}, "
                         f"got {tuple(dy_col.data.shape)}")
    if offsets.device.type != "cpu" or offsets.dtype != torch.int32:
        raise TypeError(f"offsets must be an int32 CPU tensor, got {offsets.dtype} on {offsets.device}")
    if tuple(main_grad.shape) != (experts, hidden, ffn) or main_grad.dtype != torch.float32:
        raise ValueError(f"main_grad must be fp32 ({experts}, {hidden}, {ffn}), got {main_grad.dtype} {tuple(main_grad.shape)}")
    # gmlp sizes grouped columnwise scales for any routing (a tile more per expert); the kernel
    # reads the (rows / 128) tiles the padded layout uses, from the start
    used = (rows // SCALE_TILE_ROWS) * scale_layout.swizzled_size(hidden, 4)
    return WgradArgs(a=dy_col.data, sfa=_e8m0(dy_col.scales[:used]), b=fc1.d_col, sfb=fc1.sfd_col, offsets=offsets,
                     wgrad=main_grad)


def wgrad_kernel(args: WgradArgs):
    """The weight-gradient kernel object for calls like ``args`` (adds into ``args.wgrad``)."""
    return kernel_class("wgrad")(
        sample_a=args.a, sample_b=args.b, sample_sfa=args.sfa, sample_sfb=args.sfb, sample_offsets=args.offsets,
        sample_wgrad=args.wgrad, sf_vec_size=SF_VEC_SIZE, accumulate_on_output=True)


def _n_major_weight(name: str, w_col: MXFP8Tensor, experts: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, sfb) of a weight W (E, K, N) as the kernels' N-major B, from ``w_col``, gmlp's Q_col of
    its (E * K, N) stack grouped by [K] * E: the scales (blocks of 32 along K, each expert's
    swizzled on its own) are the kernels' SFB as they are; the data, stored transposed (N, E * K),
    is permuted back to (E, K, N) by one fp8 copy."""
    if not (isinstance(w_col, MXFP8Tensor) and w_col.axis is QuantAxis.COLUMNWISE and w_col.swizzled):
        raise TypeError(f"{name} must be a columnwise MXFP8Tensor with swizzled scales, got {w_col!r}")
    n, stack_rows = w_col.data.shape
    if stack_rows != experts * k or k % SCALE_TILE_ROWS:
        raise ValueError(f"{name} must quantize an ({experts} * {k}, N) stack, K a multiple of {SCALE_TILE_ROWS}, "
                         f"got data {tuple(w_col.data.shape)}")
    b = w_col.data.view(n, experts, k).permute(1, 2, 0).contiguous()
    return b, _e8m0(w_col.scales[:experts * scale_layout.swizzled_size(n, k // 32)])


def fc1_dgrad_args(dgrad: "FC2DgradGluArgs", w1_col: MXFP8Tensor, out: torch.Tensor | None = None) -> GroupedGemmArgs:
    """FC1 dgrad's call, dx = dh @ W1_g: A is dh quantized rowwise as the dGLU kernel wrote it
    (interleaved columns, like ``w1_col``'s rows); ``w1_col`` is Q_col of the interleaved
    (E * 2F, H) W1 stack grouped by [2F] * E; ``out`` (M_pad, H) bf16 or None."""
    rows, two_ffn = dgrad.d_row.shape
    experts = dgrad.padded_offsets.numel()
    b, sfb = _n_major_weight("w1_col", w1_col, experts, two_ffn)
    hidden = b.shape[2]
    if dgrad.d_row.dtype != w1_col.data.dtype:
        raise TypeError(f"dh and W1 must have the same fp8 format, got {dgrad.d_row.dtype} and {w1_col.data.dtype}")
    if out is None:
        out = torch.empty(rows, hidden, dtype=torch.bfloat16, device=b.device)
    elif tuple(out.shape) != (rows, hidden) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 ({rows}, {hidden}), got {out.dtype} {tuple(out.shape)}")
    return GroupedGemmArgs(a=dgrad.d_row, sfa=dgrad.sfd_row, b=b, sfb=sfb, padded_offsets=dgrad.padded_offsets,
                           alpha=dgrad.alpha, d=out, b_major="n")


@dataclass(frozen=True)
class FC2DgradGluArgs:
    """The tensors of one FC2 dgrad call, in the dGLU kernel's terms (outputs allocated here)."""

    a: torch.Tensor  # (M_pad, H) fp8: Q_row(dy), padded rows
    sfa: torch.Tensor
    b: torch.Tensor  # (E, H, F) fp8: W2 as stored, N-major, scale blocks along H
    sfb: torch.Tensor
    c: torch.Tensor  # (M_pad, 2F) bf16: FC1's C, interleaved
    padded_offsets: torch.Tensor
    alpha: torch.Tensor  # (E,) ones (the kernel squares it)
    beta: torch.Tensor  # (E,) ones
    prob: torch.Tensor  # (M_pad,) fp32
    dprob: torch.Tensor  # (M_pad, slots, 1) fp32 zeros: per-slot partial sums, added in a fixed order
    d_row: torch.Tensor  # (M_pad, 2F) fp8: Q_row(dh), interleaved
    sfd_row: torch.Tensor
    d_col: torch.Tensor  # (M_pad, 2F) fp8: Q_col(dh)
    sfd_col: torch.Tensor
    amax: torch.Tensor  # (E, 2, 1) fp32
    norm_const: torch.Tensor


def fc2_dgrad_glu_args(dy: MXFP8Tensor, w2_col: MXFP8Tensor, fc1: FC1GluArgs) -> FC2DgradGluArgs:
    """FC2 dgrad's call: ``dy`` Q_row of the padded dy rows (M_pad, H), E4M3 like the weights (the
    kernel takes one fp8 format for A and B); ``w2_col`` Q_col of the (E * H, F) W2 stack grouped
    by [H] * E, swizzled; ``fc1`` the forward's FC1 call (its C, probs and offsets)."""
    from cudnn.gemm.cutedsl.grouped.dsrelu.api import _dprob_n_slots  # the kernel's own slot count (pinned version)

    rows, hidden = _swizzled_rowwise("dy", dy).source_shape
    experts = fc1.padded_offsets.numel()
    b, sfb = _n_major_weight("w2_col", w2_col, experts, hidden)
    ffn = b.shape[2]
    if fc1.c.shape != (rows, 2 * ffn):
        raise ValueError(f"w2_col's F = {ffn} does not match FC1's C {tuple(fc1.c.shape)}")
    if dy.data.dtype != w2_col.data.dtype:
        raise TypeError(f"dy and W2 must have the same fp8 format, got {dy.data.dtype} and {w2_col.data.dtype}")
    device, fp8 = dy.data.device, dy.data.dtype
    slots = _dprob_n_slots(ffn, (256, 256), None, True)  # over the GEMM's N = F
    scale_bytes = (rows // 128) * scale_layout.swizzled_size(128, 2 * ffn // 32)  # (M_pad, 2F) in 32-wide blocks
    ones = torch.ones(experts, dtype=torch.float32, device=device)
    return FC2DgradGluArgs(
        a=dy.data, sfa=_e8m0(dy.scales), b=b, sfb=sfb, c=fc1.c,
        padded_offsets=fc1.padded_offsets, alpha=ones, beta=ones.clone(), prob=fc1.prob,
        dprob=torch.zeros(rows, slots, 1, dtype=torch.float32, device=device),
        d_row=torch.empty(rows, 2 * ffn, dtype=fp8, device=device),
        sfd_row=_e8m0(torch.empty(scale_bytes, dtype=torch.uint8, device=device)),
        d_col=torch.empty(rows, 2 * ffn, dtype=fp8, device=device),
        sfd_col=_e8m0(torch.empty(scale_bytes, dtype=torch.uint8, device=device)),
        amax=torch.zeros(experts, 2, 1, dtype=torch.float32, device=device), norm_const=fc1.norm_const)


def fc2_dgrad_glu_kernel(args: FC2DgradGluArgs):
    """The dGLU kernel object (SwiGLU backward, deterministic dprob) for calls like ``args``."""
    return kernel_class("fc2_dgrad_glu")(
        sample_a=args.a, sample_c=args.c, sample_d_row=args.d_row, sample_d_col=args.d_col, sample_sfa=args.sfa,
        sample_padded_offsets=args.padded_offsets, sample_alpha=args.alpha, sample_beta=args.beta,
        sample_prob=args.prob, sample_dprob=args.dprob, sample_b=args.b, sample_sfb=args.sfb,
        sample_sfd_row=args.sfd_row, sample_sfd_col=args.sfd_col, sample_amax=args.amax,
        sample_norm_const=args.norm_const, sf_vec_size=SF_VEC_SIZE, act_func="dswiglu", b_major="n",
        discrete_col_sfd=True, _deterministic=True)
