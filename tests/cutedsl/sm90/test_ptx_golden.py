"""The SM90 kernels' PTX against recorded hashes: a refactor that means to change no kernel (the
engine's migration, docs/sm90-engine-plan.md) must leave every config's PTX as it was.

Each config below is compiled for sm_90a without a GPU; its PTX, normalized (comment lines and
the kernel's symbol, which spells the Python module and class, removed), is hashed and compared
with ``ptx_golden.json``, recorded with one cutlass-dsl version (another version is a skip, with
the reason). A change that means to change the PTX records the new hashes:

    python -m tests.cutedsl.sm90.test_ptx_golden --update

and the diff of ``ptx_golden.json`` names the configs it changed.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys

import pytest
import torch

from gmlp.cutedsl import import_error
from gmlp.mxfp8.spec import ElementFormat
from gmlp.system.versions import package_version
from tests.support.cases import parametrize_quick

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

GOLDEN = pathlib.Path(__file__).with_name("ptx_golden.json")

# config id -> (kernel module of gmlp.cutedsl.sm90, config class, its knobs): what the layer runs
# (bf16 and MXFP8, both weight layouts) and each epilogue store; then the FP8 blockwise kernels
CONFIGS = {
    "gemm-tma-k-major": ("grouped_gemm", "KernelConfig", dict(store="tma")),
    "gemm-tma-n-major-128": ("grouped_gemm", "KernelConfig", dict(store="tma", b_k_major=False, tile_n=128)),
    "gemm-regs-bias": ("grouped_gemm", "KernelConfig", dict(bias_dtype=torch.float32)),
    "wgrad-tma-fp32": ("wgrad", "WgradConfig", dict(store="tma")),
    "wgrad-tma-accumulate": ("wgrad", "WgradConfig", dict(store="tma", accumulate=True)),
    "wgrad-regs-bf16": ("wgrad", "WgradConfig", dict(out_dtype=torch.bfloat16)),
    "fc1-swiglu-layer": ("fc1", "FC1Config", dict(activation="swiglu", b_k_major=False, probs_dtype=torch.float32)),
    "fc1-swiglu-mxfp8": ("fc1", "FC1Config", dict(activation="swiglu", probs_dtype=torch.float32, quantized=True)),
    "fc1-swiglu-tma": ("fc1", "FC1Config", dict(activation="swiglu", probs_dtype=torch.float32, store="tma")),
    "fc2-dgrad-layer": ("fc2_dgrad", "FC2DgradConfig", dict(activation="swiglu", b_k_major=False,
                                                            probs_dtype=torch.float32, bias_grad=True, tile_n=256)),
    "fc2-dgrad-tma": ("fc2_dgrad", "FC2DgradConfig", dict(activation="swiglu", probs_dtype=torch.float32,
                                                          bias_grad=True, tile_n=256, store="tma")),
    "fc2-dgrad-mxfp8": ("fc2_dgrad", "FC2DgradConfig", dict(activation="swiglu", probs_dtype=torch.float32,
                                                            bias_grad=True, quantized=True)),
    # clusters of two along M, B multicast (the engine's PairedTile)
    "gemm-cluster": ("grouped_gemm", "KernelConfig", dict(store="tma", cluster=2)),
    "fc1-swiglu-cluster": ("fc1", "FC1Config", dict(activation="swiglu", probs_dtype=torch.float32, store="tma",
                                                    cluster=2)),
    "fc2-dgrad-cluster": ("fc2_dgrad", "FC2DgradConfig", dict(activation="swiglu", probs_dtype=torch.float32,
                                                              bias_grad=True, tile_n=256, store="tma", cluster=2)),
    "wgrad-cluster": ("wgrad", "WgradConfig", dict(store="tma", cluster=2)),
    # the FP8 blockwise recipe's kernels, as its layer runs them (wide items where N % 256 == 0)
    "blockwise-gemm-wide": ("blockwise_gemm", "BlockwiseGemmConfig", dict(wide=True)),
    "blockwise-gemm-bias-e5m2": ("blockwise_gemm", "BlockwiseGemmConfig",
                                 dict(bias_dtype=torch.float32, a_format=ElementFormat.E5M2)),
    "blockwise-wgrad-fp32": ("blockwise_wgrad", "BlockwiseWgradConfig", dict()),
    "blockwise-wgrad-wide-accumulate": ("blockwise_wgrad", "BlockwiseWgradConfig", dict(wide=True, accumulate=True)),
    "blockwise-fc1-swiglu-probs": ("blockwise_fc1", "BlockwiseFC1Config",
                                   dict(activation="swiglu", probs_dtype=torch.float32)),
    "blockwise-fc1-geglu-bias-fp32-scales": ("blockwise_fc1", "BlockwiseFC1Config",
                                             dict(activation="geglu", bias_dtype=torch.bfloat16, power_of_two=False)),
    "blockwise-fc2-dgrad-swiglu-probs-db1": ("blockwise_fc2_dgrad", "BlockwiseFC2DgradConfig",
                                             dict(activation="swiglu", probs_dtype=torch.float32, bias_grad=True)),
    "blockwise-fc2-dgrad-srelu-e5m2": ("blockwise_fc2_dgrad", "BlockwiseFC2DgradConfig",
                                       dict(activation="srelu", grad_format=ElementFormat.E5M2)),
    "blockwise-fc1-cluster": ("blockwise_fc1", "BlockwiseFC1Config",
                              dict(activation="swiglu", probs_dtype=torch.float32, cluster=2)),
    "blockwise-wgrad-cluster": ("blockwise_wgrad", "BlockwiseWgradConfig", dict(wide=True, cluster=2)),
    # the pipelined promotion (one half a work item: the narrow GEMM, FC2 dgrad)
    "blockwise-gemm-pipelined": ("blockwise_gemm", "BlockwiseGemmConfig", dict(pipelined=True)),
    "blockwise-gemm-pipelined-cluster": ("blockwise_gemm", "BlockwiseGemmConfig", dict(pipelined=True, cluster=2)),
    "blockwise-fc2-dgrad-pipelined": ("blockwise_fc2_dgrad", "BlockwiseFC2DgradConfig",
                                      dict(activation="swiglu", probs_dtype=torch.float32, bias_grad=True,
                                           pipelined=True)),
    # the TMA-store epilogue of the blockwise GEMM and weight gradient
    "blockwise-gemm-wide-tma-store": ("blockwise_gemm", "BlockwiseGemmConfig", dict(wide=True, store="tma")),
    "blockwise-wgrad-wide-tma-store-cluster": ("blockwise_wgrad", "BlockwiseWgradConfig",
                                               dict(wide=True, store="tma", cluster=2, out_dtype=torch.bfloat16)),
    "blockwise-wgrad-wide-tma-store-accumulate": ("blockwise_wgrad", "BlockwiseWgradConfig",
                                                  dict(wide=True, store="tma", accumulate=True)),
}


def normalized(ptx: str) -> str:
    """The PTX without comment lines (toolchain banners) and with the kernel's symbol (module and
    class names, object addresses) replaced by ``KERNEL``."""
    lines = [line for line in ptx.splitlines() if not line.lstrip().startswith("//")]
    return re.sub(r"kernel_cutlass_kernel_\w+", "KERNEL", "\n".join(lines))


def ptx_hash(config_id: str) -> str:
    """sha256 of the normalized PTX of one of ``CONFIGS``, compiled for sm_90a."""
    import importlib

    from gmlp.contract.activations import activation_from

    module_name, class_name, knobs = CONFIGS[config_id]
    module = importlib.import_module(f"gmlp.cutedsl.sm90.{module_name}")
    knobs = dict(knobs)
    args = (activation_from(knobs.pop("activation")),) if "activation" in knobs else ()
    config = getattr(module, class_name)(*args, **knobs)
    compiled = getattr(module, f"compile_{module_name}")("sm_90a", config)  # each module's compile_ entry
    return hashlib.sha256(normalized(compiled.ptx).encode()).hexdigest()


def _recorded() -> dict:
    return json.loads(GOLDEN.read_text())


@parametrize_quick("config_id", list(CONFIGS))
def test_ptx_is_the_recorded_one(config_id):
    recorded = _recorded()
    version = package_version("nvidia-cutlass-dsl")
    if recorded["nvidia-cutlass-dsl"] != version:
        pytest.skip(f"hashes recorded with nvidia-cutlass-dsl {recorded['nvidia-cutlass-dsl']}, this is {version}")
    assert config_id in recorded["ptx_sha256"], f"{config_id} has no recorded hash: run this module with --update"
    assert ptx_hash(config_id) == recorded["ptx_sha256"][config_id], (
        f"{config_id}'s PTX changed; if that was meant, record it: python -m {__name__} --update")


def test_every_recorded_config_is_compiled():
    assert sorted(_recorded()["ptx_sha256"]) == sorted(CONFIGS)


def main(argv: list[str]) -> None:
    """``--update``: compile every config and record its hash (with this cutlass-dsl's version)."""
    if argv != ["--update"]:
        sys.exit("usage: python -m tests.cutedsl.sm90.test_ptx_golden --update")
    hashes = {}
    for config_id in CONFIGS:
        hashes[config_id] = ptx_hash(config_id)
        print(config_id, hashes[config_id][:16], flush=True)
    GOLDEN.write_text(json.dumps({"nvidia-cutlass-dsl": package_version("nvidia-cutlass-dsl"), "ptx_sha256": hashes},
                                 indent=2) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main(sys.argv[1:])
