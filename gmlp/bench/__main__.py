"""``python -m gmlp.bench BENCH [options]``: gmlp's benchmarks; ``--help`` lists them."""

import sys

# name -> (module, what it measures, where it runs)
BENCHES = {
    "quantize": ("gmlp.bench.quantize", "MXFP8 quantize bandwidth of each kernel path, as a ratio of device copy", "GPU"),
    "mlp": ("gmlp.bench.mlp", "the layer forward + backward against torch's bf16 grouped-GEMM layer", "GPU"),
    "gemm": ("gmlp.bench.gemm", "each GEMM of the layer alone against torch's bf16 grouped GEMM", "GPU"),
    "tune": ("gmlp.bench.tune", "the SM90 kernels' launch knobs per GEMM site and shape, into the tuned table",
             "GPU (SM90) with cutlass-dsl"),
    "profile": ("gmlp.bench.profile", "one layer step's device time per kernel (torch.profiler)", "GPU"),
    "memory": ("gmlp.bench.memory", "one layer step's memory timeline and what is alive at its peak", "GPU"),
    "ncu": ("gmlp.bench.ncu", "Nsight Compute counters of each SM90 GEMM next to cuBLAS on the same product",
            "GPU with ncu"),
    "host": ("gmlp.bench.host", "host time of a layer step against torch eager's, per path; --profile: where it goes",
             "GPU or CPU"),
    "torchtitan": ("gmlp.bench.torchtitan", "torchtitan's qwen3 MoE debug model trained with each experts backend",
                   "GPU; --device cpu for a smoke run"),
    "ep": ("gmlp.bench.ep", "torchtitan's MoE with expert parallelism over N processes (torchrun)", "GPUs; gloo on CPU"),
    "standings": ("gmlp.bench.standings", "the newest layer figures per card, recipe, shape and routing from the "
                  "benches' JSON, as markdown (--write docs/performance.md)", "anywhere: reads bench_results/"),
}


def usage() -> str:
    width = max(map(len, BENCHES))
    lines = ["usage: python -m gmlp.bench BENCH [--help]", "", "benches (results as JSON with device, versions, "
             "commit and date; `python -m gmlp.bench BENCH --help` for each one's options):"]
    lines += [f"  {name:<{width}}  {what} [{where}]" for name, (_, what, where) in BENCHES.items()]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) >= 2 and sys.argv[1] in ("-h", "--help"):
        print(usage())
        return
    if len(sys.argv) < 2:
        sys.exit(usage())  # to stderr, status 1
    if sys.argv[1] not in BENCHES:
        sys.exit(f"unknown bench {sys.argv[1]!r}\n{usage()}")
    import importlib

    try:
        bench = importlib.import_module(BENCHES[sys.argv[1]][0])
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "torchtitan":
            raise
        sys.exit(f"python -m gmlp.bench {sys.argv[1]} runs torchtitan's model, which is not installed: "
                 "pip install -e '.[torchtitan]' (torchtitan 0.3.0, Python 3.11+)")
    bench.main(sys.argv[2:])


if __name__ == "__main__":
    main()
