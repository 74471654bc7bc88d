"""``python -m gmlp [demo|doctor|cache]``: the main job on an embedded default, the environment
report, and the compiled-kernel cache.

``demo`` (the default) runs a small MoE layer (8 experts, skewed routing with an empty expert)
on whatever device is there: ``GroupedMLP`` forward and backward in MXFP8 with the cross-check
on (every op also runs on the next path down and is compared), checked against the
unquantized layer in float64, and the MXFP8 quantize of its activations on every kernel path
that can run, compared with the spec bit for bit. ``doctor`` prints versions, the
device, the gmlp environment variables that are set (each one's value and meaning, or its error),
and which path each op takes and why. ``cache`` reports the persistent cache of compiled
CuTeDSL kernels (``gmlp.cutedsl.compile_cache``); ``cache clear`` empties it; ``cache warm --shape
E,T,H,F --recipes mxfp8,bf16`` (or ``fp8_blockwise``) runs one forward + backward of such a layer on the GPU so that
every kernel it needs is compiled and kept before a training run starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from gmlp.contract.reference import unquantized_mlp_fp64
from gmlp.debug import CrossCheckError, cross_check
from gmlp.dispatch.paths import PATHS_FASTEST_FIRST, Path, system_reason
from gmlp.dispatch.quantize import launcher, plan_quantize
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.layer.module import GroupedMLP
from gmlp.mxfp8.recipe import MXFP8Recipe
from gmlp.mxfp8.reference import quantize_mxfp8_ref
from gmlp.mxfp8.spec import ElementFormat, ScaleMode
from gmlp.mxfp8.tensor import MXFP8Quantized
from gmlp.system import env
from gmlp.system.versions import INSTALL_COMMANDS, REPORTED_PACKAGES, package_version

DEMO_EXPERTS = 8
DEMO_HIDDEN = 128
DEMO_FFN = 128
DEMO_TOKENS_PER_EXPERT = [0, 31, 150, 9, 64, 48, 3, 82]  # skewed routing, one empty expert
# MXFP8 E4M3 has a relative rounding error of at most 2**-4, RMS 2**-4/sqrt(3) = 0.036 per
# quantized operand; 4 to 6 quantized operands lie on each result's path: 0.2 is 3x that bound.
DEMO_ERROR_BOUND = 0.2


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _mismatches(actual: MXFP8Quantized, expected: MXFP8Quantized) -> dict[str, int]:
    counts = {}
    for axis in ("rowwise", "columnwise"):
        got, want = getattr(actual, axis), getattr(expected, axis)
        counts[f"{axis} data"] = int((got.data.view(torch.uint8) != want.data.view(torch.uint8)).sum())
        counts[f"{axis} scales"] = int((got.scales != want.scales).sum())
    return counts


def _interpret_triton_without_gpu(device: torch.device) -> None:
    """Without a GPU, run the Triton kernels in Triton's interpreter so that they are checked too."""
    if device.type == "cpu" and "TRITON_INTERPRET" not in os.environ and "gmlp.triton_ref" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
        print("no CUDA GPU: the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1)")


def demo() -> int:
    """Quantize a small MoE layer's tensors on every runnable path and run the layer forward and
    backward, cross-checked; 0 if everything matches (the last line says PASS or FAIL)."""
    torch.manual_seed(0)  # before anything is drawn: the figures are the same run after run
    device = _device()
    _interpret_triton_without_gpu(device)
    split_sizes = torch.tensor(DEMO_TOKENS_PER_EXPERT, dtype=torch.int32, device=device)
    tokens = int(sum(DEMO_TOKENS_PER_EXPERT))
    x = torch.randn(tokens, DEMO_HIDDEN, device=device, dtype=torch.bfloat16)
    x[:, ::37] *= 100.0  # a few outlier channels, as in real hidden states
    print(f"gmlp demo on {device}: x {tuple(x.shape)} bf16, {DEMO_EXPERTS} experts, tokens per expert {DEMO_TOKENS_PER_EXPERT}")
    args = dict(rowwise=True, columnwise=True, swizzle=True, split_sizes=split_sizes,
                element_format=ElementFormat.E4M3, scale_mode=ScaleMode.RCEIL)
    print(plan_quantize(x, **args).explain())
    expected = quantize_mxfp8_ref(x, **args)
    failures, checked = 0, []
    for path in (p for p in PATHS_FASTEST_FIRST if p is not Path.TORCH):  # torch is the spec itself
        reason = system_reason(path, device)
        if reason is not None:
            print(f"  {path.value:>8}: not run here ({reason})")
            continue
        got = launcher(path, device)(x, **args)
        checked.append(path.value)
        counts = _mismatches(got, expected)
        failures += sum(counts.values())
        status = "bit-exact" if not any(counts.values()) else f"MISMATCH {counts}"
        print(f"  {path.value:>8}: {status} against the spec (rowwise + columnwise, swizzled, grouped)")
    error = (expected.rowwise.dequantize() - x.float()).norm() / x.float().norm()
    print(f"relative RMS error of the rowwise quantization: {error:.4f}")
    layer_failures, layer_summary = _demo_layer(x, split_sizes)
    quantize = f"quantize bit-exact against the spec on {' and '.join(checked)}" if checked else "no quantize kernel ran here"
    if failures or layer_failures:
        print(f"gmlp demo: FAIL ({failures} quantize mismatches, {layer_failures} layer checks failed; see above)")
        return 1
    print(f"gmlp demo: PASS ({quantize}; GroupedMLP forward + backward {layer_summary})")
    return 0


def _demo_layer(x: torch.Tensor, split_sizes: torch.Tensor) -> tuple[int, str]:
    """GroupedMLP forward + backward against the unquantized layer in float64: the number of
    checks failed (the cross-check's, or results out of bounds) and a summary of what passed."""
    mlp = GroupedMLP(DEMO_EXPERTS, DEMO_HIDDEN, DEMO_FFN, activation="swiglu", device=x.device)
    plan = mlp.plan(x, split_sizes)
    print(plan.explain())
    if x.device.type == "cpu" and plan.path("fc1") is Path.TRITON:
        print("GroupedMLP forward + backward on the Triton kernels in Triton's interpreter (about a minute)...", flush=True)
    x = (x / x.float().std()).detach().requires_grad_()
    probs = torch.rand(x.shape[0], device=x.device, requires_grad=True)
    dy = torch.randn_like(x)
    try:
        with cross_check(action="raise") as report:  # every op also runs on the next path down, compared
            y = mlp(x, split_sizes, probs)
            y.backward(dy)
    except CrossCheckError as error:
        print(error)
        return 1, "cross-check failed"
    print(report)  # each op compared (largest error against its bound) or not compared, and why
    compared = {record.site for record in report.compared}
    ran = compared | {record.site for record in report.uncompared}
    got = {"y": y, "dx": x.grad, "dprobs": probs.grad, "dw1": mlp.w1.grad, "dw2": mlp.w2.grad}
    # the same layer, unquantized, in float64, differentiated by autograd
    y64, (x64, probs64, w1_64, _, w2_64, _) = unquantized_mlp_fp64(x, split_sizes, probs, mlp.w1, None, mlp.w2, None,
                                                                   mlp.activation)
    y64.backward(dy.double())
    want = {"y": y64, "dx": x64.grad, "dprobs": probs64.grad, "dw1": w1_64.grad, "dw2": w2_64.grad}
    print(f"GroupedMLP({DEMO_EXPERTS} experts, H={DEMO_HIDDEN}, F={DEMO_FFN}, swiglu, MXFP8 E4M3) forward + backward, "
          "relative RMS error against the float64 unquantized layer:")
    failures = 0
    for name in got:
        error = float((got[name].detach().double() - want[name].detach()).norm() / want[name].detach().norm())
        failures += error >= DEMO_ERROR_BOUND
        print(f"  {name:>6}: {error:.4f} {'ok' if error < DEMO_ERROR_BOUND else 'TOO LARGE'} (bound {DEMO_ERROR_BOUND})")
    return failures, f"within bounds, {len(compared)} of {len(ran)} ops cross-checked"


def doctor() -> int:
    """Print versions, device, gmlp's environment variables that are set, which path each op can
    take here and sample plans; 1 when a variable's value is invalid (then the paths and plans,
    which would raise, are not shown), else 0."""
    for name in REPORTED_PACKAGES:
        version = package_version(name)
        install = f"; {INSTALL_COMMANDS[name]}" if version == "not installed" and name in INSTALL_COMMANDS else ""
        print(f"{name:>22}: {version}{install}")
    device = _device()
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability()
        print(f"{'device':>22}: {torch.cuda.get_device_name()} (compute capability {major}.{minor})")
    else:
        print(f"{'device':>22}: cpu (no CUDA GPU visible)")
    invalid = _environment_report()
    if invalid:
        print(f"paths and plans not shown: fix {', '.join(invalid)} first (a layer's first call raises the same error)")
        return 1
    for path in PATHS_FASTEST_FIRST:
        reason = system_reason(path, device)
        print(f"{path.value:>22}: {'available' if reason is None else reason}")
    x = torch.zeros(256, 512, device=device, dtype=torch.bfloat16)
    print("plan for a sample layer's activations (256 x 512 bf16, rowwise + columnwise):")
    print(plan_quantize(x, rowwise=True, columnwise=True, strict=False).explain())  # reported, never raised
    mlp = GroupedMLP(8, 512, 256, activation="swiglu", bias=True, device=device)
    print("plan for a sample layer:")
    print(mlp.explain(x, torch.full((8,), 32, device=device)))
    return 0


def _environment_report() -> list[str]:
    """Print each gmlp variable that is set (``GMLP_*``, ``TRITON_INTERPRET``): its value and what it
    means, or the error its value raises; the names of those whose value is invalid."""
    found = env.report()
    print(f"{'environment':>22}: {len(found) or 'no'} gmlp variable{'' if len(found) == 1 else 's'} set")
    for variable in found:
        said = f"INVALID: {variable.error}" if variable.error is not None else variable.meaning
        print(f"{'':>22}  {variable.name}={variable.value}: {said}")
    return [variable.name for variable in found if variable.error is not None]


def cache_report() -> int:
    """Print the compile cache's directory, state and entries; always 0."""
    from gmlp.cutedsl import compile_cache  # a plain module of the package: no CuTeDSL import

    directory, found = compile_cache.cache_directory(), compile_cache.entries()
    state = "on" if compile_cache.cache_enabled() else f"off ({compile_cache.ENABLE_ENV}=0)"
    size = sum(path.stat().st_size for path in found)
    print(f"compile cache: {directory} ({state}; {compile_cache.CACHE_DIR_ENV} moves it)")
    print(f"{len(found)} compiled kernels, {size / 2**20:.1f} MiB")
    for path in found:
        print(f"  {path.name}")
    return 0


def cache_clear() -> int:
    """Empty the compile cache; always 0."""
    from gmlp.cutedsl import compile_cache

    print(f"removed {compile_cache.clear()} compiled kernels from {compile_cache.cache_directory()}")
    return 0


# cache warm's recipe names (torchtitan's flag spells them so too) -> the layer's recipe argument
WARM_RECIPES = {"mxfp8": MXFP8Recipe, "bf16": lambda: None, "fp8_blockwise": FP8BlockwiseRecipe}


def cache_warm(shape: tuple[int, int, int, int], recipes: list[str]) -> int:
    """One forward + backward of a (E, T, H, F) layer per recipe (``WARM_RECIPES``) on the GPU,
    balanced routing, so that every kernel its plan runs is compiled into the cache; 1 without a GPU."""
    from gmlp.cutedsl import compile_cache

    if not torch.cuda.is_available():
        print("cache warm: no CUDA GPU here; the CuTeDSL kernels are compiled for the GPU they run on")
        return 1
    from gmlp.bench.mlp import layer_tensors, router_probs, split_sizes_for  # the benches' inputs

    experts, tokens, hidden, ffn = shape
    device = torch.device("cuda")
    before = len(compile_cache.entries())
    x, dy = layer_tensors(tokens, hidden, device)
    probs, split_sizes = router_probs(tokens, device), split_sizes_for("balanced", experts, tokens, device)
    for name in recipes:
        start = time.perf_counter()
        mlp = GroupedMLP(experts, hidden, ffn, recipe=WARM_RECIPES[name](), device=device)
        mlp(x, split_sizes, probs).backward(dy)
        torch.cuda.synchronize()
        print(f"{name}: forward + backward of (E, T, H, F) = {shape} in {time.perf_counter() - start:.1f} s")
    state = "" if compile_cache.cache_enabled() else f" (the cache is off: {compile_cache.ENABLE_ENV}=0)"
    print(f"compile cache {compile_cache.cache_directory()}: {len(compile_cache.entries()) - before} kernels "
          f"added, {len(compile_cache.entries())} in all{state}")
    return 0


def _shape(text: str) -> tuple[int, int, int, int]:
    """argparse type of --shape: one shape as ``gmlp.bench host --shapes`` reads it (a preset or
    E,T,H,F)."""
    from gmlp.bench.host import parse_shapes

    shapes = parse_shapes(text)
    if len(shapes) != 1:
        raise argparse.ArgumentTypeError(f"expected one shape, got {len(shapes)} in {text!r}")
    return shapes[0][1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gmlp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="demo", choices=["demo", "doctor", "cache"])
    parser.add_argument("action", nargs="?", choices=["info", "clear", "warm"],
                        help="cache only: info (the default), clear, or warm")
    parser.add_argument("--shape", type=_shape, default=(8, 4096, 1024, 1024),
                        help="cache warm: the layer's experts,tokens,hidden,ffn or a bench host preset "
                             "(default 8,4096,1024,1024)")
    parser.add_argument("--recipes", default="mxfp8,bf16",
                        help=f"cache warm: comma-separated, of {','.join(WARM_RECIPES)} (default mxfp8,bf16)")
    args = parser.parse_args(argv)
    if args.action is not None and args.command != "cache":
        parser.error(f"{args.action!r} is an action of the cache command, not of {args.command!r}")
    recipes = [name for name in args.recipes.split(",") if name]
    if not recipes or set(recipes) - set(WARM_RECIPES):
        parser.error(f"--recipes takes {', '.join(WARM_RECIPES)}, comma-separated, got {args.recipes!r}")
    if args.command == "cache":
        if args.action == "clear":
            return cache_clear()
        return cache_warm(args.shape, recipes) if args.action == "warm" else cache_report()
    return demo() if args.command == "demo" else doctor()


if __name__ == "__main__":
    sys.exit(main())
