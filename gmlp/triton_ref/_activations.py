"""Triton device functions of the activations: the formulas of ``gmlp.activations`` (the single
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
