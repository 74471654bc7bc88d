"""``python -m gmlp.bench {quantize,mlp,gemm,profile,host,torchtitan,ep}``."""

import sys

BENCHES = {"quantize": "gmlp.bench.quantize", "mlp": "gmlp.bench.mlp", "gemm": "gmlp.bench.gemm",
           "profile": "gmlp.bench.profile", "host": "gmlp.bench.host",
           "torchtitan": "gmlp.bench.torchtitan", "ep": "gmlp.bench.ep"}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        sys.exit(f"usage: python -m gmlp.bench {{{','.join(BENCHES)}}} [--help]")
    import importlib

    try:
        bench = importlib.import_module(BENCHES[sys.argv[1]])
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "torchtitan":
            raise
        sys.exit(f"python -m gmlp.bench {sys.argv[1]} runs torchtitan's model, which is not installed: "
                 "pip install -e '.[torchtitan]' (torchtitan 0.3.0, Python 3.11+)")
    bench.main(sys.argv[2:])


if __name__ == "__main__":
    main()
