"""Quantize bandwidth: Triton and CuTeDSL kernels, and torch.compile of the spec, vs device copy.
``--recipe fp8-blockwise``: the FP8 blockwise recipe's Triton quantizes instead (token operands
both ways at each ``BLOCKWISE_CONFIGS`` tiling, weight tiles plain and transposed)."""

from __future__ import annotations

import argparse

import torch

from gmlp.bench.common import add_out_argument, copy_bandwidth_gbs, environment, median_ms, write_results
from gmlp.dispatch.paths import Path, system_reason
from gmlp.mxfp8 import scale_layout
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat, ScaleMode, quantize_blocks

SHAPES = [(32768, 7168), (65536, 2048)]
MODES = {"rowwise": (True, False), "rowwise+columnwise": (True, True)}


def plain_torch_quantize(x: torch.Tensor, rowwise: bool, columnwise: bool):
    """The spec written as a plain ungrouped PyTorch function (what torch.compile gets)."""
    rows, cols = x.shape
    out = []
    if rowwise:
        data, scales = quantize_blocks(x.view(rows, cols // BLOCK_SIZE, BLOCK_SIZE), ElementFormat.E4M3, ScaleMode.RCEIL)
        out += [data.view(rows, cols), scale_layout.swizzle(scales)]
    if columnwise:
        data, scales = quantize_blocks(x.t().reshape(cols, rows // BLOCK_SIZE, BLOCK_SIZE), ElementFormat.E4M3, ScaleMode.RCEIL)
        out += [data.view(cols, rows), scale_layout.swizzle(scales)]
    return out


def bytes_moved(rows: int, cols: int, rowwise: bool, columnwise: bool) -> int:
    """Bytes read (bf16 input) + written (fp8 data and swizzled scales), padding included."""
    total = rows * cols * 2
    if rowwise:
        total += rows * cols + scale_layout.swizzled_size(rows, cols // BLOCK_SIZE)
    if columnwise:
        total += rows * cols + scale_layout.swizzled_size(cols, rows // BLOCK_SIZE)
    return total


def implementations(device: torch.device, names: list[str]) -> tuple[dict, dict]:
    """name -> fn(x, rowwise, columnwise) for the requested names that can run; name -> reason for the others."""
    impls, skipped = {}, {}
    for path in (p for p in (Path.TRITON, Path.CUTEDSL) if p.value in names):
        reason = system_reason(path, device)
        if reason is not None:
            skipped[path.value] = str(reason)
            continue
        if path is Path.TRITON:
            from gmlp.triton_ref.quantize import quantize_mxfp8
        else:
            from gmlp.cutedsl.quantize import quantize_mxfp8
        impls[path.value] = lambda x, r, c, f=quantize_mxfp8: f(x, rowwise=r, columnwise=c, swizzle=True)
    if "torch.compile" in names:
        compiled = torch.compile(plain_torch_quantize, dynamic=False)
        impls["torch.compile"] = lambda x, r, c: compiled(x, r, c)
    return impls, skipped


def sweep_triton_configs(copy_gbs: float) -> list[dict]:
    """Time every Triton quantize config candidate on the benchmark shapes (rowwise + columnwise)."""
    from gmlp.triton_ref.quantize import QuantizeConfig, quantize_mxfp8

    candidates = [QuantizeConfig(chunks, warps) for chunks in (1, 2, 4, 8, 16) for warps in (1, 2)]
    out = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        moved = bytes_moved(rows, cols, True, True)
        for config in candidates:
            ms = median_ms(lambda: quantize_mxfp8(x, rowwise=True, columnwise=True, config=config))
            ratio = moved / ms / 1e6 / copy_gbs
            out.append(dict(rows=rows, cols=cols, config=vars(config), ms=ms, ratio_to_copy=ratio))
            print(f"  sweep {rows}x{cols} {config}: {ms:.3f} ms, {ratio:.2f} of copy", flush=True)
    return out


# the blockwise token quantize's tilings: the launcher's default first
BLOCKWISE_CONFIGS = [dict(), *(dict(num_warps=warps, blocks_per_program=blocks) for warps in (4, 8) for blocks in (1, 2, 4)
                                if (warps, blocks) != (8, 2))]
BLOCKWISE_SHAPES = [(32768, 7168), (32768, 4096), (65536, 2048)]  # DeepSeek-V3, Mixtral-like, Qwen3-like hidden
BLOCKWISE_WEIGHTS = (32, 4096, 7168)  # DeepSeek-V3 rank's W1 (E, 2F, H)


def blockwise_bytes(rows: int, cols: int) -> int:
    """Bytes of the blockwise token quantize both ways (one expert): bf16 read, two fp8 copies and
    their fp32 scales written."""
    return rows * cols * 2 + 2 * rows * cols + 2 * (cols // 128) * rows * 4 // 128


def time_blockwise(copy_gbs: float, rounds: int) -> list[dict]:
    """The blockwise Triton quantizes: token operands both ways (BLOCKWISE_SHAPES, 32 equal experts) at each
    tiling, then the weight tiles of ``BLOCKWISE_WEIGHTS``, plain, transposed and both from one read."""
    from gmlp.triton_ref.blockwise_quantize import BlockwiseQuantizeConfig, quantize_fp8_blockwise
    from gmlp.triton_ref.blockwise_weights import quantize_weights_fp8_blockwise

    out = []

    def record(name: str, shape: tuple, setting: dict, moved: int, fn) -> None:
        for round_ in range(rounds):
            ms = median_ms(fn)
            gbs = moved / ms / 1e6
            out.append(dict(kernel=name, shape=list(shape), config=setting, round=round_, ms=ms, gb_per_s=gbs,
                            ratio_to_copy=gbs / copy_gbs))
            print(f"  {name} {shape} {setting} round {round_}: {ms:7.3f} ms {gbs:7.0f} GB/s {gbs / copy_gbs:5.2f} of copy",
                  flush=True)

    for rows, cols in BLOCKWISE_SHAPES:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        splits = torch.full((32,), rows // 32, device="cuda", dtype=torch.int32)
        for setting in BLOCKWISE_CONFIGS:
            config = BlockwiseQuantizeConfig(**setting)
            record("tokens both ways", (rows, cols), setting, blockwise_bytes(rows, cols),
                   lambda: quantize_fp8_blockwise(x, columnwise=True, split_sizes=splits, config=config))
        del x
    w = torch.randn(BLOCKWISE_WEIGHTS, device="cuda", dtype=torch.bfloat16)
    for transposed in (False, True):
        record("weight tiles", BLOCKWISE_WEIGHTS, dict(transposed=transposed), w.numel() * 3,
               lambda: quantize_weights_fp8_blockwise(w, transposed=transposed))
    record("weight tiles", BLOCKWISE_WEIGHTS, dict(both_orientations=True), w.numel() * 4,  # bf16 read, fp8 twice
           lambda: quantize_weights_fp8_blockwise(w, both_orientations=True))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gmlp.bench quantize", description=__doc__)
    add_out_argument(parser)
    parser.add_argument("--impl", default="triton,cutedsl,torch.compile", help="comma-separated implementations")
    parser.add_argument("--rounds", type=int, default=2, help="times each measurement is repeated (spread = noise)")
    parser.add_argument("--sweep", action="store_true", help="also time every Triton config candidate")
    parser.add_argument("--recipe", choices=("mxfp8", "fp8-blockwise"), default="mxfp8",
                        help="fp8-blockwise: the blockwise recipe's Triton quantizes instead")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    env = environment()
    copy_gbs = copy_bandwidth_gbs()
    print(f"{env['device']}: copy bandwidth {copy_gbs:.0f} GB/s (read + write)", flush=True)
    if args.recipe == "fp8-blockwise":
        results = dict(environment=env, copy_gb_per_s=copy_gbs, results=time_blockwise(copy_gbs, args.rounds))
        print(f"wrote {write_results('quantize-blockwise', results, args.out)}")
        return
    impls, skipped = implementations(device, args.impl.split(","))
    for name, reason in skipped.items():
        print(f"  {name}: skipped ({reason})")
    rows_out = []
    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        for mode, (rowwise, columnwise) in MODES.items():
            moved = bytes_moved(rows, cols, rowwise, columnwise)
            for round_ in range(args.rounds):
                for name, fn in impls.items():
                    ms = median_ms(lambda: fn(x, rowwise, columnwise))
                    gbs = moved / ms / 1e6
                    rows_out.append(dict(impl=name, rows=rows, cols=cols, mode=mode, round=round_, ms=ms, gb_per_s=gbs,
                                         ratio_to_copy=gbs / copy_gbs))
                    print(f"  {rows}x{cols} {mode:>18} {name:>14} round {round_}: {ms:7.3f} ms {gbs:7.0f} GB/s "
                          f"{gbs / copy_gbs:5.2f} of copy", flush=True)
        del x
    sweep = sweep_triton_configs(copy_gbs) if args.sweep else []
    results = dict(environment=env, copy_gb_per_s=copy_gbs, skipped=skipped, results=rows_out, triton_config_sweep=sweep)
    path = write_results("quantize", results, args.out)
    print(f"wrote {path}")
