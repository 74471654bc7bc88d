"""Shape rules of the Triton GEMM launchers, written once: the launchers raise ``ValueError`` with
their text, and the dispatcher (``gmlp.dispatch.sites``) plans the op on another path with them.

Only two launchers have a rule on the sizes: ``fc1`` (H and F) and ``fc2_dgrad`` (F). It comes
from their quantizing epilogues (32-column MXFP8 blocks) and applies to their bf16 outputs too. The
others take any sizes: ``grouped_gemm`` and ``wgrad`` mask every load and store along M, N and
K, ``segment_sum`` masks its rows and columns, and ``dequantize`` takes MXFP8 tensors, whose K
is a multiple of 32 by construction (``gmlp.mxfp8.problem``). What those launchers check besides
is that their operands agree with each other (dtypes, layouts, matching sizes), which is not a
property of the problem but of the call.
"""

from __future__ import annotations

from gmlp.contract.reasons import Reason, ReasonKind
from gmlp.mxfp8.spec import BLOCK_SIZE

__all__ = ["fc1_shape_reason", "fc2_dgrad_shape_reason"]


def fc1_shape_reason(hidden: int, ffn: int) -> Reason | None:
    """None if the Triton FC1 launcher (``gmlp.triton_ref.fc1``) takes hidden size H = ``hidden``
    and FFN size F = ``ffn``, else the shape reason it does not."""
    if hidden % BLOCK_SIZE or ffn % BLOCK_SIZE:
        return Reason(ReasonKind.SHAPE, f"the Triton fc1_forward kernel needs the hidden size H and the FFN size F "
                                        f"to be multiples of {BLOCK_SIZE}, got H={hidden}, F={ffn}")
    return None


def fc2_dgrad_shape_reason(ffn: int) -> Reason | None:
    """None if the Triton FC2 dgrad launcher (``gmlp.triton_ref.fc2_dgrad``) takes FFN size
    F = ``ffn``, else the shape reason it does not."""
    if ffn % BLOCK_SIZE:
        return Reason(ReasonKind.SHAPE, f"the Triton fc2_dgrad kernel needs the FFN size F to be a multiple of "
                                        f"{BLOCK_SIZE}, got F={ffn}")
    return None
