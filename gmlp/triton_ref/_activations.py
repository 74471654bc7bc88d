"""Triton device functions of the activations: the formulas of ``gmlp.contract.activations`` (the single
definition; tests hold these to it), for fused GEMM epilogues.

KIND codes: 0 swiglu, 1 geglu, 2 qgeglu, 3 srelu (``ACTIVATION_CODES`` in ``gmlp.triton_ref.fc1``).
"""

import triton
import triton.language as tl

_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_CUBIC = tl.constexpr(0.044715)


@triton.jit
def _sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def glu_forward(gate, up, KIND: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr):
    """act([gate | up]) in fp32 for the gated kinds (swiglu, geglu, qgeglu)."""
    if KIND == 0:
        return gate * _sigmoid(gate) * up
    elif KIND == 1:
        inner = _SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate * gate * gate)
        tanh = 2.0 * _sigmoid(2.0 * inner) - 1.0
        return 0.5 * gate * (1.0 + tanh) * up
    else:
        clamped = tl.minimum(gate, LIMIT)
        return clamped * _sigmoid(ALPHA * clamped) * (tl.minimum(tl.maximum(up, -LIMIT), LIMIT) + OFFSET)


@triton.jit
def srelu_forward(h):
    """relu(h) ** 2 in fp32."""
    positive = tl.maximum(h, 0.0)
    return positive * positive


@triton.jit
def glu_backward(gate, up, grad, KIND: tl.constexpr, LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr):
    """(d gate, d up) of act([gate | up]) applied to grad, fp32, for the gated kinds."""
    if KIND == 0:
        s = _sigmoid(gate)
        return grad * up * s * (1.0 + gate * (1.0 - s)), grad * gate * s
    elif KIND == 1:
        inner = _SQRT_2_OVER_PI * (gate + _GELU_CUBIC * gate * gate * gate)
        tanh = 2.0 * _sigmoid(2.0 * inner) - 1.0
        d_inner = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * gate * gate)
        d_gelu = 0.5 * (1.0 + tanh) + 0.5 * gate * (1.0 - tanh * tanh) * d_inner
        return grad * up * d_gelu, grad * 0.5 * gate * (1.0 + tanh)
    else:
        clamped = tl.minimum(gate, LIMIT)
        s = _sigmoid(ALPHA * clamped)
        d_gate = tl.where(gate > LIMIT, 0.0, s * (1.0 + ALPHA * clamped * (1.0 - s)))
        up_clamped = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        d_up = tl.where((up >= -LIMIT) & (up <= LIMIT), 1.0, 0.0)
        return grad * (up_clamped + OFFSET) * d_gate, grad * clamped * s * d_up


@triton.jit
def srelu_backward(h, grad):
    """d relu(h)**2 applied to grad, fp32."""
    return grad * 2.0 * tl.maximum(h, 0.0)


@triton.jit
def dprobs_and_activation_backward(gate, up, da, valid, rows, row_mask, probs_ptr, dprobs_partial_ptr, n_tiles, n_tile,
                                   GATED: tl.constexpr, HAS_PROBS: tl.constexpr, KIND: tl.constexpr,
                                   LIMIT: tl.constexpr, ALPHA: tl.constexpr, OFFSET: tl.constexpr):
    """FC2 dgrad's epilogue math on a tile of da and the saved pre-activation (gate, up; ``up`` is
    ``gate`` for srelu): with HAS_PROBS, this tile's share of ``dprobs = sum_f da * act(c)`` (the
    ``valid`` elements, one partial sum per program column) stored, and da scaled by probs; then
    (d gate, d up) of the activation applied to da (d up is d gate for srelu)."""
    if HAS_PROBS:
        if GATED:
            act = glu_forward(gate, up, KIND, LIMIT, ALPHA, OFFSET)
        else:
            act = srelu_forward(gate)
        partial = tl.sum(tl.where(valid, da * act, 0.0), axis=1)
        tl.store(dprobs_partial_ptr + rows.to(tl.int64) * n_tiles + n_tile, partial, mask=row_mask)
        da *= tl.load(probs_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    if GATED:
        return glu_backward(gate, up, da, KIND, LIMIT, ALPHA, OFFSET)
    d_gate = srelu_backward(gate, da)
    return d_gate, d_gate
