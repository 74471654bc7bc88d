"""``bench gemm``'s choice of configurations per variant (shared with ``bench ncu``, which
profiles the first); the timed run itself needs a GPU."""

from __future__ import annotations

from gmlp.bench.gemm import BLOCKWISE_EPILOGUE_CONFIGS, BLOCKWISE_GEMM_CONFIGS, QUACK_CONFIGS, variant_tilings


def test_each_variant_is_timed_from_its_default_configuration():
    gemm = dict(tilings=(["c1", "layer", "c2"], dict(bf16="layer")), configs=[dict(tile_n=256), dict(tile_n=128)],
                blockwise_configs=BLOCKWISE_EPILOGUE_CONFIGS)
    assert variant_tilings(gemm, "bf16") == ["layer", "c1", "c2"]  # the layer's tiling first, once
    assert variant_tilings(gemm, "cutedsl") == [dict(tile_n=256), dict(tile_n=128)]
    assert variant_tilings(gemm, "cutedsl-dequant") == [dict()]  # the layer's configuration
    assert variant_tilings(gemm, "quack") == QUACK_CONFIGS
    assert variant_tilings(gemm, "fp8-blockwise")[0] == dict()  # the launcher's defaults
    assert variant_tilings(gemm, "cutedsl-fp8-blockwise") == [dict()]  # no sweep given: the default only
    swept = dict(cutedsl_blockwise_configs=BLOCKWISE_GEMM_CONFIGS)
    assert variant_tilings(swept, "cutedsl-fp8-blockwise") == [dict(), dict(wide=False)]
    assert variant_tilings(dict(), "fp8-blockwise") == [dict()]  # a GEMM without a sweep: its default only
