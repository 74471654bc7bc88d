"""Compile the Triton kernels ahead of time for sm_90a / sm_100a, no GPU needed.

Run as ``python -m tests.support.triton_aot OUT_DIR [NAME ...]`` in a process where TRITON_INTERPRET is unset
(the interpreter replaces @triton.jit functions at import time); writes OUT_DIR/NAME.ptx per config of
``configs()``, or of the NAMEs given.
"""

from __future__ import annotations

import pathlib
import sys

QUANTIZE_SIGNATURE = {"x_ptr": "*bf16", "row_start_ptr": "*i32", "tile_start_ptr": "*i32", "block_start_ptr": "*i32",
                      "row_data_ptr": "*{fp8}", "row_scale_ptr": "*u8", "col_data_ptr": "*{fp8}", "col_scale_ptr": "*u8",
                      "NUM_ROWS": "i32", "NUM_COLS": "i32", "NUM_COL_BLOCKS": "i32", "X_ROW_STRIDE": "i32"}


FC1_SIGNATURE = {"x_ptr": "*bf16", "gate_ptr": "*bf16", "up_ptr": "*bf16", "b1_ptr": "*bf16",
                 "probs_ptr": "*fp32", "row_start_ptr": "*i32", "tile_start_ptr": "*i32", "block_start_ptr": "*i32",
                 "c_ptr": "*bf16", "a_ptr": "*{out}", "a_scale_ptr": "*u8", "a_col_ptr": "*{out}", "a_col_scale_ptr": "*u8",
                 "NUM_ROWS": "i32", "HIDDEN": "i32", "FFN": "i32", "NUM_COL_BLOCKS": "i32",
                 **{f"{w}_STRIDE_{axis}": "i32" for w in ("GATE", "UP") for axis in "ENK"}}


GEMM_SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "b2_ptr": "*bf16", "bias_ptr": "*bf16", "row_start_ptr": "*i32",
                  "tile_start_ptr": "*i32", "out_ptr": "*bf16", "NUM_ROWS": "i32", "N": "i32", "K": "i32", "K1": "i32",
                  **{f"{b}_STRIDE_{axis}": "i32" for b in ("B", "B2") for axis in "ENK"}}
DGRAD_SIGNATURE = {"dy_ptr": "*bf16", "w2t_ptr": "*bf16", "c_ptr": "*bf16", "probs_ptr": "*fp32", "row_start_ptr": "*i32",
                   "tile_start_ptr": "*i32", "block_start_ptr": "*i32", "dprobs_partial_ptr": "*fp32",
                   "dh_tile_sums_ptr": "*fp32", "dh_ptr": "*fp8e4nv", "dh_scale_ptr": "*u8", "dh_col_ptr": "*fp8e4nv",
                   "dh_col_scale_ptr": "*u8", "NUM_ROWS": "i32", "HIDDEN": "i32", "FFN": "i32", "NUM_COL_BLOCKS": "i32",
                   **{name: "i32" for name in ("W_STRIDE_E", "W_STRIDE_N", "W_STRIDE_K")}}
WGRAD_SIGNATURE = {"a_ptr": "*bf16", "b_ptr": "*bf16", "row_start_ptr": "*i32", "out_ptr": "*fp32", "out2_ptr": "*fp32",
                   "M": "i32", "N": "i32", "M1": "i32"}

# Weight operands contiguous along K (the launchers' runtime specialization of strides equal to 1).
UNIT_K_STRIDES = dict(W_STRIDE_K=1)


DEQUANTIZE_ROW_SIGNATURE = {"data_ptr": "*fp8e4nv", "scale_ptr": "*u8", "out_ptr": "*bf16", "NUM_ROWS": "i32",
                            "NUM_COLS": "i32"}
DEQUANTIZE_COL_SIGNATURE = {"data_ptr": "*fp8e4nv", "scale_ptr": "*u8", "row_start_ptr": "*i32", "tile_start_ptr": "*i32",
                            "block_start_ptr": "*i32", "out_ptr": "*bf16", "NUM_ROWS": "i32", "NUM_COLS": "i32",
                            "NUM_COL_BLOCKS": "i32"}
BLOCKWISE_SIGNATURE = {"x_ptr": "*bf16", "row_start_ptr": "*i32", "tile_start_ptr": "*i32", "row_data_ptr": "*{fp8}",
                       "row_scale_ptr": "*fp32", "col_data_ptr": "*{fp8}", "col_scale_ptr": "*fp32", "NUM_ROWS": "i32",
                       "NUM_COLS": "i32", "ROW_SCALE_STRIDE": "i32", "COL_SCALE_STRIDE": "i32", "COL_DATA_STRIDE": "i32"}
BLOCKWISE_WEIGHT_SIGNATURE = {"w_ptr": "*bf16", "data_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "t_data_ptr": "*fp8e4nv",
                              "t_scale_ptr": "*fp32", "NUM_COLS": "i32", "EXPERT_ROWS": "i32"}
BF16_MAX = 3.3895313892515355e38
BLOCKWISE_GEMM_SIGNATURE = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
                            "bias_ptr": "*bf16", "row_start_ptr": "*i32", "tile_start_ptr": "*i32", "out_ptr": "*bf16", "NUM_ROWS": "i32",
                            "N": "i32", "K": "i32", "A_SCALE_STRIDE": "i32", "B_STRIDE_E": "i32", "B_STRIDE_N": "i32"}
BLOCKWISE_WGRAD_SIGNATURE = {"a_ptr": "*{grad}", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
                             "tile_start_ptr": "*i32", "out_ptr": "*fp32", "DATA_STRIDE": "i32",
                             "M": "i32", "N": "i32", "A_SCALE_STRIDE": "i32", "B_SCALE_STRIDE": "i32"}
BLOCKWISE_FC1_SIGNATURE = {"x_ptr": "*fp8e4nv", "x_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
                           "b1_ptr": "*bf16", "probs_ptr": "*fp32", "row_start_ptr": "*i32", "tile_start_ptr": "*i32",
                           "c_ptr": "*bf16", "a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "a_col_ptr": "*fp8e4nv",
                           "a_col_scale_ptr": "*fp32", "NUM_ROWS": "i32", "HIDDEN": "i32", "FFN": "i32",
                           "X_SCALE_STRIDE": "i32", "A_SCALE_STRIDE": "i32", "A_COL_SCALE_STRIDE": "i32",
                           "A_COL_DATA_STRIDE": "i32", "W_STRIDE_E": "i32", "W_STRIDE_N": "i32"}
BLOCKWISE_DGRAD_SIGNATURE = {"dy_ptr": "*fp8e4nv", "dy_scale_ptr": "*fp32", "w_ptr": "*fp8e4nv", "w_scale_ptr": "*fp32",
                             "c_ptr": "*bf16", "probs_ptr": "*fp32", "row_start_ptr": "*i32", "tile_start_ptr": "*i32",
                             "dprobs_partial_ptr": "*fp32", "dh_tile_sums_ptr": "*fp32", "dh_ptr": "*fp8e4nv",
                             "dh_scale_ptr": "*fp32", "dh_col_ptr": "*fp8e4nv", "dh_col_scale_ptr": "*fp32",
                             "NUM_ROWS": "i32", "HIDDEN": "i32", "FFN": "i32", "DY_SCALE_STRIDE": "i32",
                             "DH_SCALE_STRIDE": "i32", "DH_COL_SCALE_STRIDE": "i32", "DH_COL_DATA_STRIDE": "i32",
                             "W_STRIDE_E": "i32", "W_STRIDE_N": "i32"}
FP32_MAX = 3.4028234663852886e38


def configs() -> dict[str, tuple]:
    """name -> (kernel name, signature, constexprs, capability, num_warps)."""
    from gmlp.triton_ref.blockwise_quantize import BlockwiseQuantizeConfig
    from gmlp.triton_ref.quantize import DEFAULT_QUANTIZE_CONFIG as config

    out = {}
    for capability in (90, 100):
        for fp8, emax, reciprocal in (("fp8e4nv", 8, 1 / 448), ("fp8e5", 15, 1 / 57344)):
            signature = {k: v.format(fp8=fp8) for k, v in QUANTIZE_SIGNATURE.items()}
            constexprs = dict(RECIPROCAL_MAX=float(reciprocal), EMAX=emax, FLOOR_MODE=False, ROWWISE=True, COLUMNWISE=True,
                              SWIZZLE=True, GROUPED=True, NUM_GROUPS=8, SEARCH_STEPS=3, STRIDED=False,
                              CHUNKS_PER_PROGRAM=config.chunks_per_program,
                              CHUNKS_FASTEST=config.chunks_fastest)
            out[f"quantize_{fp8}_sm{capability}"] = ("quantize", signature, constexprs, capability, config.num_warps)
        for quantized in (False, True):
            signature = {k: v.format(out="fp8e4nv" if quantized else "bf16") for k, v in FC1_SIGNATURE.items()}
            constexprs = dict(QUANTIZED=quantized, GATED=True, HAS_BIAS=True, HAS_PROBS=True, ACTIVATION=0, LIMIT=7.0,
                              ALPHA=1.702, OFFSET=1.0, RECIPROCAL_MAX=float(1 / 448), EMAX=8, FLOOR_MODE=False,
                              NUM_GROUPS=8, SEARCH_STEPS=3, BLOCK_N=64, BLOCK_K=64, N_FASTEST=True, GATE_STRIDE_K=1,
                              UP_STRIDE_K=1)
            out[f"fc1_{'quantized' if quantized else 'bf16'}_sm{capability}"] = ("fc1", signature, constexprs, capability, 4)
        grouping = dict(NUM_GROUPS=8, SEARCH_STEPS=3, BLOCK_N=64, BLOCK_K=64, N_FASTEST=True)
        out[f"gemm_sm{capability}"] = ("gemm", GEMM_SIGNATURE, dict(HAS_BIAS=True, SPLIT_K=False, B_STRIDE_K=1, **grouping), capability, 4)
        # FC1 dgrad with W1's gate and up apart: B as two transposed views, side by side along K
        out[f"gemm_split_k_sm{capability}"] = ("gemm", GEMM_SIGNATURE, dict(
            HAS_BIAS=False, SPLIT_K=True, B_STRIDE_N=1, B2_STRIDE_N=1, **grouping), capability, 4)
        out[f"dgrad_quantized_sm{capability}"] = ("dgrad", DGRAD_SIGNATURE, dict(
            QUANTIZED=True, GATED=True, HAS_PROBS=True, BIAS_GRAD=True, ACTIVATION=0, LIMIT=7.0, ALPHA=1.702, OFFSET=1.0,
            RECIPROCAL_MAX=float(1 / 448), EMAX=8, FLOOR_MODE=False, **UNIT_K_STRIDES, **grouping), capability, 4)
        out[f"dequantize_row_sm{capability}"] = ("dequantize_row", DEQUANTIZE_ROW_SIGNATURE, dict(BLOCK_M=32, BLOCK_K=128),
                                                  capability, 4)
        out[f"dequantize_col_sm{capability}"] = ("dequantize_col", DEQUANTIZE_COL_SIGNATURE, dict(
            GROUPED=True, NUM_GROUPS=8, SEARCH_STEPS=3, BLOCK_K=64), capability, 4)
        for split in (False, True):  # dW1's gate and up rows to two gradients
            out[f"wgrad{'_split_m' if split else ''}_sm{capability}"] = ("wgrad", WGRAD_SIGNATURE, dict(
                ACCUMULATE=True, SPLIT_M=split, BLOCK_M=64, BLOCK_N=64, BLOCK_T=64, N_FASTEST=True), capability, 4)
    for fp8, fmax in (("fp8e4nv", 448.0), ("fp8e5", 57344.0)):
        for power_of_two in (True, False):
            signature = {k: v.format(fp8=fp8) for k, v in BLOCKWISE_SIGNATURE.items()}
            constexprs = dict(FMAX=fmax, INPUT_MAX=BF16_MAX, POWER_OF_TWO=power_of_two, ROWWISE=True, COLUMNWISE=True,
                              GROUPED=True, NUM_GROUPS=8, SEARCH_STEPS=3,
                              BLOCKS_PER_PROGRAM=BlockwiseQuantizeConfig().blocks_per_program)
            scales = "pow2" if power_of_two else "fp32"
            out[f"blockwise_quantize_{fp8}_{scales}_sm90"] = ("blockwise_quantize", signature, constexprs, 90,
                                                              BlockwiseQuantizeConfig().num_warps)
    for suffix, tiles, transposed in (("", True, False), ("_transposed", False, True), ("_both", True, True)):
        out[f"blockwise_weights{suffix}_sm90"] = (
            "blockwise_weights", BLOCKWISE_WEIGHT_SIGNATURE,
            dict(FMAX=448.0, INPUT_MAX=BF16_MAX, POWER_OF_TWO=True, TILES=tiles, TRANSPOSED=transposed), 90, 8)
    out["blockwise_gemm_e4m3_sm90"] = ("blockwise_gemm", BLOCKWISE_GEMM_SIGNATURE, dict(
        HAS_BIAS=True, NUM_GROUPS=8, SEARCH_STEPS=3, BLOCK_N=128, N_FASTEST=False), 90, 8)
    out["blockwise_fc1_sm90"] = ("blockwise_fc1", BLOCKWISE_FC1_SIGNATURE, dict(
        GATED=True, HAS_BIAS=True, HAS_PROBS=True, ACTIVATION=0, LIMIT=7.0, ALPHA=1.702, OFFSET=1.0, FMAX=448.0,
        INPUT_MAX=FP32_MAX, POWER_OF_TWO=True, NUM_GROUPS=8, SEARCH_STEPS=3, N_FASTEST=False), 90, 8)
    out["blockwise_fc2_dgrad_sm90"] = ("blockwise_fc2_dgrad", BLOCKWISE_DGRAD_SIGNATURE, dict(
        GATED=True, HAS_PROBS=True, BIAS_GRAD=True, ACTIVATION=0, LIMIT=7.0, ALPHA=1.702, OFFSET=1.0, FMAX=448.0,
        INPUT_MAX=FP32_MAX, POWER_OF_TWO=True, NUM_GROUPS=8, SEARCH_STEPS=3, N_FASTEST=False), 90, 16)
    for grad in ("fp8e4nv", "fp8e5"):  # E4M3 or E5M2 gradients times E4M3 activations
        signature = {k: v.format(grad=grad) for k, v in BLOCKWISE_WGRAD_SIGNATURE.items()}
        out[f"blockwise_wgrad_{'e4m3' if grad == 'fp8e4nv' else 'e5m2'}_sm90"] = ("blockwise_wgrad", signature, dict(
            ACCUMULATE=True, BLOCK_M=128, BLOCK_N=128), 90, 8)
    return out


def compile_ptx(kernel, signature: dict, constexprs: dict, capability: int, num_warps: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # What the JIT launcher specializes on at run time for the design shapes: 16-byte aligned
    # pointers and integer arguments divisible by 16.
    aligned = [name for name, kind in signature.items()
               if (kind.startswith("*") or kind == "i32") and name not in constexprs]
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=kernel, signature=signature,
                       constexprs={(kernel.arg_names.index(name),): value for name, value in constexprs.items()},
                       attrs={(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned})
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=dict(num_warps=num_warps))
    return compiled.asm["ptx"]


def main(out_dir: str, names: list[str] | None = None) -> None:
    """Write OUT_DIR/NAME.ptx for the configs named (every config of ``configs()`` by default)."""
    from gmlp.triton_ref._blockwise_fc1_kernel import fc1_blockwise_kernel
    from gmlp.triton_ref._blockwise_fc2_dgrad_kernel import fc2_dgrad_blockwise_kernel
    from gmlp.triton_ref._blockwise_gemm_kernel import grouped_gemm_blockwise_kernel, wgrad_blockwise_kernel
    from gmlp.triton_ref._blockwise_quantize_kernel import quantize_fp8_blockwise_kernel, quantize_weight_tiles_kernel
    from gmlp.triton_ref._dequantize_kernel import dequantize_columnwise_kernel, dequantize_rowwise_kernel
    from gmlp.triton_ref._fc1_kernel import fc1_forward_kernel
    from gmlp.triton_ref._fc2_dgrad_kernel import fc2_dgrad_kernel
    from gmlp.triton_ref._grouped_gemm_kernel import grouped_gemm_kernel
    from gmlp.triton_ref._quantize_kernel import quantize_mxfp8_kernel
    from gmlp.triton_ref._wgrad_kernel import wgrad_kernel

    kernels = {"quantize": quantize_mxfp8_kernel, "fc1": fc1_forward_kernel,
               "gemm": grouped_gemm_kernel, "dgrad": fc2_dgrad_kernel, "wgrad": wgrad_kernel,
               "dequantize_row": dequantize_rowwise_kernel, "dequantize_col": dequantize_columnwise_kernel,
               "blockwise_quantize": quantize_fp8_blockwise_kernel, "blockwise_weights": quantize_weight_tiles_kernel,
               "blockwise_gemm": grouped_gemm_blockwise_kernel, "blockwise_fc1": fc1_blockwise_kernel,
               "blockwise_fc2_dgrad": fc2_dgrad_blockwise_kernel, "blockwise_wgrad": wgrad_blockwise_kernel}
    folder = pathlib.Path(out_dir)
    table = configs()
    unknown = sorted(set(names or ()) - set(table))
    if unknown:
        raise ValueError(f"names: expected configs of tests.support.triton_aot.configs(), given unknown {unknown}")
    for name in names or table:
        kernel, signature, constexprs, capability, num_warps = table[name]
        (folder / f"{name}.ptx").write_text(compile_ptx(kernels[kernel], signature, constexprs, capability, num_warps))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
