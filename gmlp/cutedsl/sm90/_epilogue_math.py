"""The fp32 epilogue math of the SM90 kernels, written once: each activation forward and
backward in the operation order of ``gmlp.triton_ref._activations`` (the formulas of
``gmlp.contract.activations``), with Triton's lowering of exp and division, so that the CuTeDSL and
Triton epilogues can be compared tightly; and the accumulator fragment the epilogues index, with
the per-row probabilities and the c views they read along it.

The forward is bitwise Triton's: the expression trees of FC1's ``a`` in the two PTX (Triton 3.9,
FP fusion on, its default; sm_90a) have the same operations on the same operands, fma where
Triton has fma (geglu's x + c x^3 and 2 s - 1), up to exact sign moves (Triton's -(2x) log2 e
and -(alpha x) log2 e are our (2x)(-log2 e) and (alpha x)(-log2 e)). That is what lets the
MXFP8 epilogue's bytes equal Triton's; ``_double`` keeps LLVM from fusing one more fma.

The backward's dh trees are Triton's FC2 dgrad ones the same way (Triton 3.9, its quantized
tiling, sm_90a; compared on the PTX of both kernels, gated with and without probs): swiglu's and
qgeglu's as written; srelu's 2 (da p) is the fma(da, p, da p) both compilers make of it; geglu's
1 - tanh^2 and 0.5 (1 + tanh) + (...) are the fmas Triton contracts, written explicitly
(``_one_minus_square``, ``_fma``): left to LLVM, ours had a multiply and a subtract for the first
and, without probs, contracted the other product of the second."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from gmlp.contract.activations import Activation, ActivationKind

__all__ = ["ptx_f32", "sigmoid", "activation_forward", "activation_backward", "pair_fragment", "load_row_probs",
           "c_pair_views"]

_LOG2_E = 1.4426950408889634
_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_CUBIC = 0.044715


# ---------------------------------------------------------------------------------------------
# The activations in fp32, as gmlp.triton_ref._activations computes them
# ---------------------------------------------------------------------------------------------


@dsl_user_op
def ptx_f32(op: str, *operands, loc=None, ip=None) -> Float32:
    """One PTX f32 instruction (no side effects, so the compiler may schedule and CSE it)."""
    args = ", ".join(f"${i + 1}" for i in range(len(operands)))
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(x).ir_value(loc=loc, ip=ip) for x in operands], f"{op} $0, {args};",
        "=f" + ",f" * len(operands), has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


def sigmoid(z):
    """1 / (1 + exp(-z)): Triton lowers tl.exp(f32) to ex2.approx.f32 of z * log2(e) and the f32
    division to div.full.f32."""
    return ptx_f32("div.full.f32", Float32(1.0), 1.0 + ptx_f32("ex2.approx.f32", z * -_LOG2_E))


def _double(x):
    """2 x as one mul.rn.f32 (exact), opaque to LLVM: written as ``2.0 * x``, LLVM rewrites it as
    x + x and contracts that with the multiply defining x into an fma (a rounding Triton does not
    do: it computes -2 x by a multiply, exact too), so geglu's values would differ from Triton's."""
    return ptx_f32("mul.rn.f32", x, Float32(2.0))


def _fma(a, b, c):
    """a b + c as one fma.rn.f32, opaque to LLVM (it picks the product to contract itself)."""
    return ptx_f32("fma.rn.f32", a, b, c)


def _one_minus_square(x):
    """1 - x^2 as one fma.rn.f32(x, -x, 1): Triton's FC2 dgrad PTX contracts it so; LLVM leaves
    ours as a multiply and a subtract (one more rounding), so geglu's d gate would differ."""
    return _fma(x, -x, Float32(1.0))


def activation_forward(activation: Activation, gate, up):
    """act in fp32 of one element: gated kinds of (gate, up); srelu of gate (h), up unused. Same
    operation order as gmlp.triton_ref._activations."""
    kind = activation.kind
    if kind is ActivationKind.SWIGLU:
        return gate * sigmoid(gate) * up
    if kind is ActivationKind.GEGLU:
        inner = _SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate * gate * gate)
        tanh = 2.0 * sigmoid(_double(inner)) - 1.0
        return 0.5 * gate * (1.0 + tanh) * up
    if kind is ActivationKind.QGEGLU:
        limit = activation.limit
        clamped = cute.arch.fmin(gate, limit)
        up_clamped = cute.arch.fmin(cute.arch.fmax(up, -limit), limit)
        return clamped * sigmoid(activation.alpha * clamped) * (up_clamped + activation.offset)
    positive = cute.arch.fmax(gate, 0.0)  # srelu
    return positive * positive


# ---------------------------------------------------------------------------------------------
# The activation backward in fp32, as gmlp.triton_ref._activations computes it
# ---------------------------------------------------------------------------------------------


def activation_backward(activation: Activation, gate, up, grad):
    """(d gate, d up) of act applied to grad (fp32; srelu: (d h, None)). Same operation order as
    gmlp.triton_ref._activations.glu_backward / srelu_backward."""
    kind = activation.kind
    if kind is ActivationKind.SWIGLU:
        s = sigmoid(gate)
        return grad * up * s * (1.0 + gate * (1.0 - s)), grad * gate * s
    if kind is ActivationKind.GEGLU:
        inner = _SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate * gate * gate)
        tanh = 2.0 * sigmoid(_double(inner)) - 1.0  # as activation_forward's (shared by CSE)
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * gate * gate)
        # 0.5 (1 + tanh) + (...): one fma with the first product, as Triton contracts it (LLVM
        # alone may contract the other product when grad is a bare accumulator)
        d_gelu = _fma(Float32(0.5), 1.0 + tanh, 0.5 * gate * _one_minus_square(tanh) * d_inner)
        return grad * up * d_gelu, grad * 0.5 * gate * (1.0 + tanh)
    if kind is ActivationKind.QGEGLU:
        limit, alpha = activation.limit, activation.alpha
        clamped = cute.arch.fmin(gate, limit)
        s = sigmoid(alpha * clamped)
        d_gate = cutlass.select_(gate > limit, Float32(0.0), s * (1.0 + alpha * clamped * (1.0 - s)))
        up_clamped = cute.arch.fmin(cute.arch.fmax(up, -limit), limit)
        d_up = cutlass.select_((up >= -limit) & (up <= limit), Float32(1.0), Float32(0.0))
        return grad * (up_clamped + activation.offset) * d_gate, grad * clamped * s * d_up
    return grad * 2.0 * cute.arch.fmax(gate, 0.0), None  # srelu


# ---------------------------------------------------------------------------------------------
# The accumulator fragment the epilogues index, and what they read along it
# ---------------------------------------------------------------------------------------------


def pair_fragment(shape):
    """The accumulator fragment the epilogue's indexing assumes (checked at trace time):
    ((2 columns, 2 rows, column groups), 1, 1): pair i is row slot i % 2 of column group i // 2."""
    if not (shape[0][0] == 2 and shape[0][1] == 2 and shape[1] == 1 and shape[2] == 1):
        raise ValueError(f"unexpected accumulator fragment {shape}")
    return shape


@cute.jit
def load_row_probs(row_probs: cute.Tensor, mProbs: cute.Tensor, rows: tuple, first_row: Int32, row_limit: Int32,
                   row_sums: cute.Tensor | None = None):
    """``row_probs[slot]``: the fp32 routing probability of the thread's accumulator row
    ``rows[slot]`` (a tile row; the tile starts at token ``first_row``), 0 for the rows past the
    expert's end (``>= row_limit``); ``row_sums`` (FC2 dgrad's dprobs sums of the two rows), if
    given, zeroed in the same pass."""
    for slot in cutlass.range_constexpr(2):
        row_probs[slot] = Float32(0.0)
        if const_expr(row_sums is not None):
            row_sums[slot] = Float32(0.0)
        if rows[slot] < row_limit:
            row_probs[slot] = mProbs[first_row + rows[slot]].to(Float32)


@cute.jit
def c_pair_views(thr_mma, mC: cute.Tensor, first_row: Int32, col0: Int32, ffn: Int32, tile: cutlass.Constexpr,
                 gated: cutlass.Constexpr):
    """(gate, up): Int32 views (bf16 pairs) of c's ``tile`` at (first_row, col0) and, gated, at
    (first_row, F + col0), partitioned like the accumulators; up is None when not gated."""
    gate = cute.recast_tensor(thr_mma.partition_C(
        cute.local_tile(cute.domain_offset((first_row, col0), mC), tile, (0, 0))), Int32)
    up = None
    if const_expr(gated):
        up = cute.recast_tensor(thr_mma.partition_C(
            cute.local_tile(cute.domain_offset((first_row, ffn + col0), mC), tile, (0, 0))), Int32)
    return gate, up
