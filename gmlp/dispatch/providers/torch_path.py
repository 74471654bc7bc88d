"""The torch path's provider: the spec and the oracle (``gmlp.mxfp8.reference``,
``gmlp.contract.reference``; for the FP8 blockwise recipe ``gmlp.fp8_blockwise`` and
``gmlp.contract.blockwise_reference``), on any device, for every problem the layer validates."""

from __future__ import annotations

from typing import Callable

from gmlp.contract.reasons import Reason
from gmlp.dispatch.providers import Provider
from gmlp.dispatch.providers.adapters import dequantize_ref, without
from gmlp.dispatch.sites import Op, Site

__all__ = ["PROVIDER"]


def _system(device_type: str, capability: tuple[int, int] | None, interpret: bool) -> Reason | None:
    return None


def _supports(op: Op, problem, site: str | None) -> Reason | None:
    return None


def _load(site: Site) -> Callable:
    from gmlp.contract import blockwise_reference, reference
    from gmlp.fp8_blockwise import gemm
    from gmlp.fp8_blockwise.reference import quantize_fp8_blockwise_ref, quantize_weights_fp8_blockwise_ref
    from gmlp.mxfp8.reference import quantize_dequantize_mxfp8_ref, quantize_mxfp8_ref

    launch_only = without("groups", "tiling")
    blockwise_launch_only = without("groups", "config", "num_warps", "block_m", "block_n")
    return {
        Op.QUANTIZE: without("groups")(quantize_mxfp8_ref),
        Op.DEQUANTIZE: dequantize_ref,
        Op.QUANTIZE_DEQUANTIZE: without("groups")(quantize_dequantize_mxfp8_ref),
        Op.FC1: launch_only(reference.fc1_forward_ref),
        Op.GROUPED_GEMM: launch_only(reference.grouped_gemm_ref),
        Op.FC2_DGRAD: launch_only(reference.fc2_dgrad_ref),
        Op.WGRAD: launch_only(reference.grouped_wgrad_ref),
        Op.SEGMENT_SUM: reference.segment_sum_ref,
        Op.BLOCKWISE_QUANTIZE: blockwise_launch_only(quantize_fp8_blockwise_ref),
        Op.BLOCKWISE_WEIGHTS: quantize_weights_fp8_blockwise_ref,
        Op.BLOCKWISE_FC1: blockwise_launch_only(blockwise_reference.fc1_forward_blockwise_ref),
        Op.BLOCKWISE_GEMM: blockwise_launch_only(gemm.grouped_gemm_blockwise_ref),
        Op.BLOCKWISE_FC2_DGRAD: blockwise_launch_only(blockwise_reference.fc2_dgrad_blockwise_ref),
        Op.BLOCKWISE_WGRAD: blockwise_launch_only(gemm.grouped_wgrad_blockwise_ref),
    }[site.op]


PROVIDER = Provider("the spec (torch)", None, _system, _supports, _load)
