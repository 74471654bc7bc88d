"""The grouped MLP's ops and their sites: the names the dispatcher, the providers and the layer share.

An *op* is what a kernel computes (every path's implementation of it takes the arguments of its
Triton launcher: ``gmlp.dispatch.providers.adapters``). A *site* is one place in the layer where
an op runs, with its own decision, since the operands (and so the answers) differ: the quantize
of x is not the quantize of W1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Op", "Site", "SITES", "BLOCKWISE_SITES", "GEMM_OPS", "BLOCKWISE_OPS", "site_names"]


class Op(enum.Enum):
    """An op of the layer. Its name is its module's in every kernel package (``Op.FC1``:
    ``gmlp.triton_ref.fc1``, ``gmlp.cutedsl.sm90.fc1``), its value the launcher there, which is also
    the op's name in plans, warnings and ``gmlp.debug.cross_check(ops=...)``."""

    QUANTIZE = "quantize_mxfp8"
    DEQUANTIZE = "dequantize_mxfp8"
    # the bf16 values of an MXFP8 quantization in one pass, no fp8 written (Hopper's weight and dy operands)
    QUANTIZE_DEQUANTIZE = "quantize_dequantize_mxfp8"
    FC1 = "fc1_forward"  # FC1 GEMM + bias + activation + probs, a in bf16 or quantized both ways
    GROUPED_GEMM = "grouped_gemm"  # A @ B_g^T per expert: FC2 forward, FC1 dgrad
    FC2_DGRAD = "fc2_dgrad"  # FC2 dgrad + activation backward + dprobs, dh in bf16 or quantized
    WGRAD = "grouped_wgrad"  # weight gradients, a ragged contraction over each expert's tokens
    SEGMENT_SUM = "segment_sum"  # per-expert row sums (b2's gradient)
    # the FP8 blockwise recipe's ops (gmlp.fp8_blockwise): fp8 operands, scales promoted every 128 of K
    BLOCKWISE_QUANTIZE = "quantize_fp8_blockwise"  # a token operand, 1 x 128 and 128 x 1 in one pass
    BLOCKWISE_WEIGHTS = "quantize_weights_fp8_blockwise"  # a weight stack, 128 x 128 tiles
    BLOCKWISE_FC1 = "fc1_forward_blockwise"  # FC1 + activation + probs, Q(a) both ways
    BLOCKWISE_GEMM = "grouped_gemm_fp8_blockwise"  # FC2 forward, FC1 dgrad
    BLOCKWISE_FC2_DGRAD = "fc2_dgrad_blockwise"  # FC2 dgrad + activation backward + dprobs, Q(dh) both ways
    BLOCKWISE_WGRAD = "grouped_wgrad_fp8_blockwise"  # weight gradients, 128 x 1 blocks of both operands

    @property
    def module(self) -> str:
        """The module that implements the op in a kernel package (``fc1``, ``wgrad``, ...)."""
        return self.name.lower()

    @property
    def launcher(self) -> str:
        """The launcher's name in that module (``fc1_forward``, ``grouped_wgrad``, ...)."""
        return self.value


@dataclass(frozen=True)
class Site:
    """One place in the layer where an op runs."""

    name: str
    op: Op
    mxfp8_only: bool = False  # runs only with an MXFP8 recipe
    weight_stack: bool = False  # quantizes an (E * N, K) weight stack (a launch config of its own)
    bias_only: bool = False  # runs only when the layer has biases
    # which composition calls it: None both, True the SM100 one only (gmlp.cutedsl.sm100.layer), False
    # the step sequence on bf16 GEMMs only (gmlp.layer.steps)
    sm100: bool | None = None

    @property
    def quantizes(self) -> bool:
        """Whether the site's problem is a quantize call's (``QuantizeProblem``)."""
        return self.op in (Op.QUANTIZE, Op.QUANTIZE_DEQUANTIZE)


SITES = {site.name: site for site in (
    # "qdq": the bf16 values of an MXFP8 quantization in one pass (the step sequence's weights and dy,
    # rowwise, or columnwise where the GEMM reads the transpose: W^T in the dgrads, dy^T in FC2 wgrad)
    Site("qdq w1", Op.QUANTIZE_DEQUANTIZE, True, weight_stack=True, sm100=False),
    Site("quantize x", Op.QUANTIZE, True),
    Site("quantize w1", Op.QUANTIZE, True, weight_stack=True, sm100=True),
    Site("quantize w2", Op.QUANTIZE, True, weight_stack=True, sm100=True),
    Site("dequantize", Op.DEQUANTIZE, True, sm100=False),
    Site("fc1", Op.FC1),
    Site("qdq w2", Op.QUANTIZE_DEQUANTIZE, True, weight_stack=True, sm100=False),
    Site("fc2", Op.GROUPED_GEMM),
    Site("quantize dy", Op.QUANTIZE, True, sm100=True),
    Site("qdq dy", Op.QUANTIZE_DEQUANTIZE, True, sm100=False),
    Site("qdq w2^T", Op.QUANTIZE_DEQUANTIZE, True, weight_stack=True, sm100=False),
    Site("fc2 dgrad", Op.FC2_DGRAD),
    Site("qdq w1^T", Op.QUANTIZE_DEQUANTIZE, True, weight_stack=True, sm100=False),
    Site("fc1 dgrad", Op.GROUPED_GEMM),
    Site("fc1 wgrad", Op.WGRAD),
    Site("qdq dy^T", Op.QUANTIZE_DEQUANTIZE, True, sm100=False),
    Site("fc2 wgrad", Op.WGRAD),
    Site("bias grad", Op.SEGMENT_SUM, bias_only=True),
)}

# the FP8 blockwise recipe's step sequence (gmlp.layer.blockwise_steps): the weights' tiles quantized
# in the forward and their transposes (the dgrads' operands) again from W in the backward, so that
# nothing of a weight is saved; x and dy both ways in one pass each. With a weight cache, "quantize
# w1" and "quantize w2" write both orientations from one read of W (both_orientations=True) and the
# "^T" sites do not run
BLOCKWISE_SITES = {site.name: site for site in (
    Site("quantize w1", Op.BLOCKWISE_WEIGHTS, weight_stack=True),
    Site("quantize x", Op.BLOCKWISE_QUANTIZE),
    Site("fc1", Op.BLOCKWISE_FC1),
    Site("quantize w2", Op.BLOCKWISE_WEIGHTS, weight_stack=True),
    Site("fc2", Op.BLOCKWISE_GEMM),
    Site("quantize dy", Op.BLOCKWISE_QUANTIZE),
    Site("quantize w2^T", Op.BLOCKWISE_WEIGHTS, weight_stack=True),
    Site("fc2 dgrad", Op.BLOCKWISE_FC2_DGRAD),
    Site("quantize w1^T", Op.BLOCKWISE_WEIGHTS, weight_stack=True),
    Site("fc1 dgrad", Op.BLOCKWISE_GEMM),
    Site("fc1 wgrad", Op.BLOCKWISE_WGRAD),
    Site("fc2 wgrad", Op.BLOCKWISE_WGRAD),
    Site("bias grad", Op.SEGMENT_SUM, bias_only=True),
)}

GEMM_OPS = (Op.FC1, Op.GROUPED_GEMM, Op.FC2_DGRAD, Op.WGRAD)
BLOCKWISE_OPS = (Op.BLOCKWISE_QUANTIZE, Op.BLOCKWISE_WEIGHTS, Op.BLOCKWISE_FC1, Op.BLOCKWISE_GEMM,
                 Op.BLOCKWISE_FC2_DGRAD, Op.BLOCKWISE_WGRAD)


def site_names() -> set[str]:
    """Every site name of either step sequence (what ``gmlp.debug.cross_check(ops=...)`` accepts)."""
    return set(SITES) | set(BLOCKWISE_SITES)
