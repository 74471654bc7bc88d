"""Each GEMM of the layer alone, Triton kernels against torch's bf16 grouped GEMM of the same product.

For the design shapes (balanced routing) and each GEMM of the layer (FC1 with its fused epilogue,
FC2, FC1 dgrad, FC2 dgrad with the fused activation backward, the two weight gradients), times:

- ``torch._grouped_mm`` in bf16 of the same product (the baseline of the ratios);
- the Triton kernel on bf16 operands (the bf16 layer), with each candidate tiling;
- ``mxfp8``: the MXFP8 layer's step, the dequantize kernels of its quantized operands timed with
  the bf16 GEMM that follows them (and FC1's and FC2 dgrad's quantized outputs), each tiling;
- ``cutedsl``: the CuTeDSL SM90 kernel (``gmlp.cutedsl.sm90``) on bf16 operands, each of its
  configurations (an H100/H200 with cutlass-dsl only);
- ``cutedsl-dequant``: the MXFP8 layer's step with its activation operands (FC1, FC2, FC1 dgrad,
  FC2 dgrad: the token-row A, Q_row of x, a, dh, dy; the weight gradients: both Q_col operands)
  dequantized by the Triton pass then the SM90 kernel; the token-row GEMMs read the weight
  dequantized beforehand (once per step in the layer, not timed here), FC1 and FC2 dgrad write
  their quantized outputs;
- ``fp8-blockwise`` and ``cutedsl-fp8-blockwise``: the FP8 blockwise recipe's kernels
  (``gmlp.fp8_blockwise``) on its quantized operands (1 x 128 token rows, 128 x 1 per-expert
  columns for the weight gradients, 128 x 128 weight tiles; FC1 and FC2 dgrad with their fused
  epilogues), Triton's and the SM90 CuTeDSL kernels' (FC1, the grouped GEMM for FC2 and FC1
  dgrad, FC2 dgrad, the weight gradients);
- ``quack``: QuACK's varlen GEMM (``quack.gemm_interface.gemm`` of quack-kernels, the peer to
  beat) on the same bf16 product: varlen M (``cu_seqlens_m``) for the token-row GEMMs, varlen K
  (``cu_seqlens_k``) for the weight gradients; for FC1 and FC2 dgrad the plain product only, as
  the torch baseline (its fused epilogues are not compared).

Dequantizing on load inside the GEMM's main loop measured 0.4-0.5x as fast as dequantizing once
(``bench_results/gemm-h200-20261129T223229.json``) and was removed.

TFLOP/s count the useful work (2 x the multiply-adds). The baseline is timed again right after
each candidate, and the candidate's ratio is to the mean of the two baseline times around it
(``baseline_ms``, with ``baseline_spread`` = max / min - 1 of the two): clock drift during the
run then moves both sides alike, and the spread says how much it moved. Results as JSON; the
tilings chosen from them live in ``gmlp.triton_ref.tuning``.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Callable

import torch

from gmlp.bench.common import PartialResults, add_out_argument, environment, median_ms
from gmlp.bench.mlp import SHAPES, add_shapes_argument, expert_offsets, split_sizes_for
from gmlp.contract.activations import SWIGLU
from gmlp.cutedsl.sm90 import launch_options
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.triton_ref.dequantize import dequantize_mxfp8
from gmlp.triton_ref.fc1 import fc1_forward
from gmlp.triton_ref.blockwise_fc1 import fc1_forward_blockwise
from gmlp.triton_ref.blockwise_fc2_dgrad import fc2_dgrad_blockwise
from gmlp.triton_ref.blockwise_gemm import grouped_gemm_fp8_blockwise
from gmlp.triton_ref.blockwise_quantize import quantize_fp8_blockwise
from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise
from gmlp.triton_ref.blockwise_wgrad import grouped_wgrad_fp8_blockwise
from gmlp.triton_ref.fc2_dgrad import fc2_dgrad
from gmlp.triton_ref.grouped_gemm import grouped_gemm
from gmlp.triton_ref.quantize import quantize_mxfp8
from gmlp.triton_ref.tuning import (
    FC1_TILING,
    FC2_DGRAD_TILING,
    GROUPED_GEMM_TILING,
    WGRAD_TILING,
    GemmTiling,
    WgradTiling,
)
from gmlp.triton_ref.wgrad import grouped_wgrad

# Column tiles fastest (the tilings' default launch order) beat rows fastest for every kernel and
# tiling in bench_results/gemm-h200-20261129T223101.json; the candidates keep that order.
GEMM_CANDIDATES = [GemmTiling(*t) for t in ((128, 64, 8, 4), (256, 64, 8, 4), (128, 128, 8, 2), (128, 64, 4, 3))]
# The fused epilogues hold several (128, block_n) fp32 tiles: FC1 two accumulators, FC2 dgrad c,
# da and both halves of dh. At 128-wide tiles they reach 255 registers (FC1) or spill (FC2 dgrad:
# 0.7-1.5 KB of stack; Triton 3.6 ahead of time); 64-wide ones with 8 warps spill less or not.
EPILOGUE_CANDIDATES = [GemmTiling(*t) for t in ((128, 64, 8, 4), (64, 64, 8, 4), (64, 128, 8, 3), (128, 64, 8, 3))]
WGRAD_CANDIDATES = [WgradTiling(*t) for t in ((128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 128, 8, 3),
                                              (256, 128, 64, 8, 3))]


def _operands(experts: int, tokens: int, hidden: int, ffn: int, device: torch.device,
              routing: str = "balanced") -> dict:
    """bf16 tensors of one layer step and their MXFP8 quantizations (as the layer makes them)."""
    torch.manual_seed(0)
    split_sizes = split_sizes_for(routing, experts, tokens, device)
    t = dict(split_sizes=split_sizes, offsets=expert_offsets(split_sizes))
    t["cu_seqlens"] = torch.cat([t["offsets"].new_zeros(1), t["offsets"]])  # (E + 1,): QuACK's varlen bounds
    t["x"] = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    t["a"] = torch.randn(tokens, ffn, device=device, dtype=torch.bfloat16)
    t["dy"] = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
    t["dh"] = torch.randn(tokens, 2 * ffn, device=device, dtype=torch.bfloat16)
    t["c"] = torch.randn(tokens, 2 * ffn, device=device, dtype=torch.bfloat16)
    t["w1"] = torch.randn(experts, 2 * ffn, hidden, device=device, dtype=torch.bfloat16) / hidden**0.5
    t["w2"] = torch.randn(experts, hidden, ffn, device=device, dtype=torch.bfloat16) / ffn**0.5
    for name in ("x", "a", "dy", "dh"):
        q = quantize_mxfp8(t[name], rowwise=True, columnwise=True, swizzle=False, split_sizes=split_sizes)
        t[f"{name}_row"], t[f"{name}_col"] = q.rowwise, q.columnwise
    for name in ("w1", "w2"):
        w = t[name]
        q = quantize_mxfp8(w.reshape(-1, w.shape[-1]), rowwise=True, columnwise=True, swizzle=False)
        t[f"{name}_row"], t[f"{name}_col"] = q.rowwise, q.columnwise
    # the FP8 blockwise recipe's: token operands both ways (E4M3 gradients), weights in tiles
    for name in ("x", "a", "dy", "dh"):
        q = quantize_fp8_blockwise(t[name], rowwise=True, columnwise=True, split_sizes=split_sizes)
        t[f"{name}_bw_row"], t[f"{name}_bw_col"] = q.rowwise, q.columnwise
    for name in ("w1", "w2"):
        t[f"{name}_bw"] = quantize_weights_fp8_blockwise(t[name])
        t[f"{name}t_bw"] = t[f"{name}_bw"].transpose()
    return t


def sm90_configs(op: str) -> list[dict]:
    """The SM90 kernel's configurations of ``op`` (keyword arguments of its launcher): first the
    layer's (none given: the tuned table's choice), then every candidate of the tuner."""
    return [dict(), *launch_options.candidates(op)]


# the FP8 blockwise Triton kernels with fused epilogues (FC1, FC2 dgrad): the launcher's default
# (8 warps, 3 stages) first, then the warps and software-pipeline depths tried against it
BLOCKWISE_EPILOGUE_CONFIGS = [dict(), dict(num_stages=2), dict(num_stages=4), dict(num_warps=16), dict(num_warps=4)]
# the FP8 blockwise CuTeDSL GEMMs (FC2, FC1 dgrad, the weight gradients): the launchers' default
# (256-column work items where N allows), then 128-column ones
BLOCKWISE_GEMM_CONFIGS = [dict(), dict(wide=False)]
QUACK_CONFIGS = [dict(tuned=False)]  # QuACK's default configuration (its autotuner: tuned=True)


def _quack_gemm():
    """QuACK's GEMM entry point, imported only when the quack variant runs."""
    return importlib.import_module("quack.gemm_interface").gemm


def _sm90(kernel: str):
    """A module of gmlp.cutedsl.sm90, imported only when the cutedsl variant runs (it imports cutlass-dsl)."""
    return importlib.import_module(f"gmlp.cutedsl.sm90.{kernel}")


def _wgrad(t: dict, a: str, b: str, flops: int) -> dict[str, Callable]:
    """The weight gradient A_g^T B_g over each expert's tokens (the ragged contraction)."""
    splits, deq = t["split_sizes"], dequantize_mxfp8
    run = lambda a_op, b_op, c: grouped_wgrad(a_op, b_op, splits, out_dtype=torch.bfloat16, tiling=c)  # noqa: E731
    return dict(
        baseline=lambda: torch._grouped_mm(t[a].t(), t[b], offs=t["offsets"]),
        bf16=lambda c: lambda: run(t[a], t[b], c),
        mxfp8=lambda c: lambda: run(deq(t[f"{a}_col"]), deq(t[f"{b}_col"]), c),
        cutedsl=lambda c: lambda: _sm90("wgrad").grouped_wgrad(t[a], t[b], splits, out_dtype=torch.bfloat16, **c),
        **{"cutedsl-dequant": lambda c: lambda: _sm90("wgrad").grouped_wgrad(
               deq(t[f"{a}_col"]), deq(t[f"{b}_col"]), splits, out_dtype=torch.bfloat16, **c)},
        quack=lambda c: lambda: _quack_gemm()(t[a].t(), t[b], cu_seqlens_k=t["cu_seqlens"], **c),
        # bf16 dW, as the layer writes it for bf16 weights and as the baseline does
        **{"fp8-blockwise": lambda c: lambda: grouped_wgrad_fp8_blockwise(t[f"{a}_bw_col"], t[f"{b}_bw_col"], splits,
                                                                          out_dtype=torch.bfloat16),
           "cutedsl-fp8-blockwise": lambda c: lambda: _sm90("blockwise_wgrad").grouped_wgrad_fp8_blockwise(
               t[f"{a}_bw_col"], t[f"{b}_bw_col"], splits, out_dtype=torch.bfloat16, **c)},
        flops=flops, tilings=(WGRAD_CANDIDATES, dict(bf16=WGRAD_TILING, mxfp8=WGRAD_TILING)),
        configs=sm90_configs("grouped_wgrad"), cutedsl_blockwise_configs=BLOCKWISE_GEMM_CONFIGS)


def _gemms(t: dict, hidden: int, ffn: int) -> dict[str, dict[str, Callable]]:
    """Per GEMM: the baseline, builders (tiling -> call) per variant, and (candidates, the layer's tiling per variant)."""
    deq = dequantize_mxfp8
    splits, offsets, recipe = t["split_sizes"], t["offsets"], MXFP8Recipe()
    w1t_view = lambda w1: w1.transpose(1, 2)  # noqa: E731  B_g = W1_g^T
    # the weights as the MXFP8 layer's GEMMs read them
    w1_deq, w2_deq = deq(t["w1_row"]).view(t["w1"].shape), deq(t["w2_row"]).view(t["w2"].shape)
    w1t_deq = w1t_view(deq(t["w1_col"]).view(t["w1"].shape))
    w2t_deq = deq(t["w2_col"]).view(t["w2"].shape).transpose(1, 2)
    sm90_gemm = lambda *args, **kwargs: _sm90("grouped_gemm").grouped_gemm(*args, **kwargs)  # noqa: E731
    sm90_fc1 = lambda x, **c: _sm90("fc1").fc1_forward(  # noqa: E731
        x, w1_deq, splits, ffn_hidden_size=ffn, activation=SWIGLU, recipe=recipe, **c)
    sm90_fc2_dgrad = lambda dy, **c: _sm90("fc2_dgrad").fc2_dgrad(  # noqa: E731
        dy, w2t_deq, t["c"], splits, activation=SWIGLU, recipe=recipe, **c)
    sm90_blockwise = lambda *args, **kw: _sm90("blockwise_gemm").grouped_gemm_fp8_blockwise(*args, **kw)  # noqa: E731
    return {
        "fc1": dict(
            baseline=lambda: torch._grouped_mm(t["x"], t["w1"].transpose(1, 2), offs=offsets),
            bf16=lambda c: lambda: fc1_forward(t["x"], t["w1"], splits, ffn_hidden_size=ffn, activation=SWIGLU,
                                               recipe=None, tiling=c),
            mxfp8=lambda c: lambda: fc1_forward(deq(t["x_row"]), deq(t["w1_row"]).view(t["w1"].shape), splits,
                                                ffn_hidden_size=ffn, activation=SWIGLU, recipe=recipe, tiling=c),
            quack=lambda c: lambda: _quack_gemm()(t["x"], t["w1"].transpose(1, 2), cu_seqlens_m=t["cu_seqlens"], **c),
            cutedsl=lambda c: lambda: _sm90("fc1").fc1_forward(t["x"], t["w1"], splits, ffn_hidden_size=ffn,
                                                             activation=SWIGLU, recipe=None, **c),
            **{"cutedsl-dequant": lambda c: lambda: sm90_fc1(deq(t["x_row"]), **c),
               "fp8-blockwise": lambda c: lambda: fc1_forward_blockwise(t["x_bw_row"], t["w1_bw"], splits,
                                                                        ffn_hidden_size=ffn, activation=SWIGLU, **c),
               "cutedsl-fp8-blockwise": lambda c: lambda: _sm90("blockwise_fc1").fc1_forward_blockwise(
                   t["x_bw_row"], t["w1_bw"], splits, ffn_hidden_size=ffn, activation=SWIGLU, **c)},
            blockwise_configs=BLOCKWISE_EPILOGUE_CONFIGS,
            flops=2 * t["x"].shape[0] * hidden * 2 * ffn,
            tilings=(EPILOGUE_CANDIDATES, dict(bf16=FC1_TILING[False], mxfp8=FC1_TILING[True])),
            configs=sm90_configs("fc1_forward")),
        "fc2": dict(
            baseline=lambda: torch._grouped_mm(t["a"], t["w2"].transpose(1, 2), offs=offsets),
            bf16=lambda c: lambda: grouped_gemm(t["a"], t["w2"], splits, tiling=c),
            mxfp8=lambda c: lambda: grouped_gemm(deq(t["a_row"]), deq(t["w2_row"]).view(t["w2"].shape), splits, tiling=c),
            cutedsl=lambda c: lambda: _sm90("grouped_gemm").grouped_gemm(t["a"], t["w2"], splits, **c),
            **{"cutedsl-dequant": lambda c: lambda: sm90_gemm(deq(t["a_row"]), w2_deq, splits, **c),
               "fp8-blockwise": lambda c: lambda: grouped_gemm_fp8_blockwise(t["a_bw_row"], t["w2_bw"], splits),
               "cutedsl-fp8-blockwise": lambda c: lambda: sm90_blockwise(t["a_bw_row"], t["w2_bw"], splits, **c)},
            quack=lambda c: lambda: _quack_gemm()(t["a"], t["w2"].transpose(1, 2), cu_seqlens_m=t["cu_seqlens"], **c),
            flops=2 * t["a"].shape[0] * hidden * ffn,
            tilings=(GEMM_CANDIDATES, dict(bf16=GROUPED_GEMM_TILING, mxfp8=GROUPED_GEMM_TILING)),
            configs=sm90_configs("grouped_gemm"), cutedsl_blockwise_configs=BLOCKWISE_GEMM_CONFIGS),
        "fc1_dgrad": dict(
            baseline=lambda: torch._grouped_mm(t["dh"], t["w1"], offs=offsets),
            bf16=lambda c: lambda: grouped_gemm(t["dh"], w1t_view(t["w1"]), splits, tiling=c),
            mxfp8=lambda c: lambda: grouped_gemm(deq(t["dh_row"]), w1t_view(deq(t["w1_col"]).view(t["w1"].shape)),
                                                 splits, tiling=c),
            cutedsl=lambda c: lambda: _sm90("grouped_gemm").grouped_gemm(t["dh"], w1t_view(t["w1"]), splits, **c),
            **{"cutedsl-dequant": lambda c: lambda: sm90_gemm(deq(t["dh_row"]), w1t_deq, splits, **c),
               "fp8-blockwise": lambda c: lambda: grouped_gemm_fp8_blockwise(t["dh_bw_row"], t["w1t_bw"], splits),
               "cutedsl-fp8-blockwise": lambda c: lambda: sm90_blockwise(t["dh_bw_row"], t["w1t_bw"], splits, **c)},
            quack=lambda c: lambda: _quack_gemm()(t["dh"], t["w1"], cu_seqlens_m=t["cu_seqlens"], **c),
            flops=2 * t["dh"].shape[0] * hidden * 2 * ffn,
            tilings=(GEMM_CANDIDATES, dict(bf16=GROUPED_GEMM_TILING, mxfp8=GROUPED_GEMM_TILING)),
            configs=sm90_configs("grouped_gemm"), cutedsl_blockwise_configs=BLOCKWISE_GEMM_CONFIGS),
        "fc2_dgrad": dict(
            baseline=lambda: torch._grouped_mm(t["dy"], t["w2"], offs=offsets),
            bf16=lambda c: lambda: fc2_dgrad(t["dy"], t["w2"].transpose(1, 2), t["c"], splits, activation=SWIGLU,
                                             recipe=None, tiling=c),
            mxfp8=lambda c: lambda: fc2_dgrad(deq(t["dy_row"]), deq(t["w2_col"]).view(t["w2"].shape).transpose(1, 2),
                                              t["c"], splits, activation=SWIGLU, recipe=recipe, tiling=c),
            quack=lambda c: lambda: _quack_gemm()(t["dy"], t["w2"], cu_seqlens_m=t["cu_seqlens"], **c),
            cutedsl=lambda c: lambda: _sm90("fc2_dgrad").fc2_dgrad(t["dy"], t["w2"].transpose(1, 2), t["c"], splits,
                                                           activation=SWIGLU, recipe=None, **c),
            **{"cutedsl-dequant": lambda c: lambda: sm90_fc2_dgrad(deq(t["dy_row"]), **c),
               "fp8-blockwise": lambda c: lambda: fc2_dgrad_blockwise(t["dy_bw_row"], t["w2t_bw"], t["c"], splits,
                                                                      activation=SWIGLU, **c),
               "cutedsl-fp8-blockwise": lambda c: lambda: _sm90("blockwise_fc2_dgrad").fc2_dgrad_blockwise(
                   t["dy_bw_row"], t["w2t_bw"], t["c"], splits, activation=SWIGLU, **c)},
            blockwise_configs=BLOCKWISE_EPILOGUE_CONFIGS,
            flops=2 * t["dy"].shape[0] * hidden * ffn,
            tilings=(EPILOGUE_CANDIDATES, dict(bf16=FC2_DGRAD_TILING[False], mxfp8=FC2_DGRAD_TILING[True])),
            configs=sm90_configs("fc2_dgrad")),
        "fc2_wgrad": _wgrad(t, "dy", "a", 2 * t["dy"].shape[0] * hidden * ffn),
        "fc1_wgrad": _wgrad(t, "dh", "x", 2 * t["dh"].shape[0] * hidden * 2 * ffn),
    }


def _time(fn: Callable) -> tuple[float | None, str | None]:
    """Median ms of fn, or None and the reason when this configuration cannot run (said, not hidden)."""
    try:
        return median_ms(fn, warmup_ms=30, measure_ms=100), None
    except Exception as error:  # a tiling can exceed shared memory or registers: report it, go on
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def variant_tilings(gemm: dict, variant: str) -> list:
    """The configurations ``variant`` of ``gemm`` (an entry of ``_gemms``) is timed at, its
    default first: the layer's tiling for the Triton kernels, each CuTeDSL kernel's default
    configuration (``cutedsl-dequant``: the layer's), the blockwise launchers' defaults."""
    if variant == "fp8-blockwise":
        return gemm.get("blockwise_configs", [dict()])
    if variant == "cutedsl-fp8-blockwise":
        return gemm.get("cutedsl_blockwise_configs", [dict()])
    if variant.startswith("cutedsl"):
        return gemm["configs"] if variant == "cutedsl" else [dict()]
    if variant == "quack":
        return QUACK_CONFIGS
    candidates, defaults = gemm["tilings"]
    return list(dict.fromkeys([defaults[variant], *candidates]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench gemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shapes_argument(parser, "deepseek-v3-rank")
    parser.add_argument("--gemms", default="fc1,fc2,fc1_dgrad,fc2_dgrad,fc2_wgrad,fc1_wgrad")
    parser.add_argument("--variants", default="bf16,mxfp8",
                        help="bf16: Triton on bf16 operands; mxfp8: MXFP8 operands dequantized first; "
                             "cutedsl: the SM90 CuTeDSL kernels on bf16 operands; cutedsl-dequant: "
                             "MXFP8 activation operands dequantized first, then the SM90 kernel; "
                             "fp8-blockwise / cutedsl-fp8-blockwise: the FP8 blockwise recipe's Triton / SM90 "
                             "CuTeDSL kernels on its quantized operands; quack: QuACK's varlen GEMM")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    rows, results, env = [], PartialResults("gemm", args.out), environment()
    for shape_name in args.shapes.split(","):
        experts, tokens, hidden, ffn = SHAPES[shape_name]
        operands = _operands(experts, tokens, hidden, ffn, device)
        gemms = _gemms(operands, hidden, ffn)
        for gemm_name in args.gemms.split(","):
            gemm = gemms[gemm_name]
            base_ms, base_error = _time(gemm["baseline"])
            print(f"{shape_name} {gemm_name:>9} torch bf16: "
                  + (f"{base_ms:.3f} ms {gemm['flops'] / base_ms / 1e9:.0f} TFLOP/s" if base_ms else base_error), flush=True)
            for variant in args.variants.split(","):
                if variant not in gemm:
                    print(f"  {variant:>8}: not a variant of {gemm_name}", flush=True)
                    continue
                for tiling in variant_tilings(gemm, variant):
                    print(f"  {variant:>8} {tiling}: ", end="", flush=True)  # a hang shows where it is
                    ms, error = _time(gemm[variant](tiling))
                    base_after, _ = _time(gemm["baseline"])  # the baseline again, right after
                    bracket = [t for t in (base_ms, base_after) if t]
                    baseline = sum(bracket) / len(bracket) if bracket else None
                    spread = max(bracket) / min(bracket) - 1 if len(bracket) == 2 else None
                    ratio = baseline / ms if (ms and baseline) else None
                    rows.append(dict(shape=shape_name, gemm=gemm_name, variant=variant,
                                     tiling=tiling if isinstance(tiling, dict) else vars(tiling), ms=ms,
                                     tflops=gemm["flops"] / ms / 1e9 if ms else None, ratio_to_torch_bf16=ratio,
                                     baseline_ms=baseline, baseline_spread=spread, error=error))
                    base_ms = base_after or base_ms
                    results.write(dict(environment=env, results=rows), complete=False)  # kept if cut short
                    print((f"{ms:.3f} ms {gemm['flops'] / ms / 1e9:.0f} TFLOP/s, "
                          f"{ratio:.2f} of torch" if ms and ratio else str(error or f'{ms:.3f} ms')), flush=True)
        del operands, gemms
        torch.cuda.empty_cache()
    print(f"wrote {results.write(dict(environment=env, results=rows), complete=True)}")
