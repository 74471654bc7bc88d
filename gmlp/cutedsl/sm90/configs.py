"""What each sm_90a kernel of the engine is compiled for: one frozen config a GEMM site (the grouped
GEMM, FC1, FC2 dgrad and the weight gradient, in bf16 / MXFP8 and in the FP8 blockwise recipe).
Shapes and expert counts are runtime values, so a config is the whole compile key (with the
architecture). Each config checks its knobs (the error names knob, accepted values and value
given) and sizes its shared memory: the slot of the ring (``stage_bytes``) and what the epilogue
keeps outside it (``fixed_bytes``), from which ``_pipeline.StagedConfig`` derives the stages.
The constants here are the ones the configs and their kernels share.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from cutlass import BFloat16, Float32, Float8E4M3FN, Float8E5M2

from gmlp.contract.activations import Activation
from gmlp.cutedsl.sm90 import _quantize_epilogue, _store, launch_options
from gmlp.cutedsl.sm90._blockwise_mainloop import slot_bytes
from gmlp.cutedsl.sm90._compile import FLOAT_DTYPES
from gmlp.cutedsl.sm90._launch import check_activation
from gmlp.cutedsl.sm90._pipeline import StagedConfig, WideItems
from gmlp.cutedsl.sm90._schedule import TILE_K, TILE_M
from gmlp.cutedsl.sm90._wgrad_operands import OUT_DTYPES
from gmlp.mxfp8.spec import ElementFormat

__all__ = ["KernelConfig", "FC1Config", "FC2DgradConfig", "WgradConfig", "BlockwiseGemmConfig", "BlockwiseFC1Config",
           "BlockwiseFC2DgradConfig", "BlockwiseWgradConfig", "TOKEN_ROW_WARPGROUPS", "FC1_TILE_N",
           "FC2_DGRAD_TILE_NS", "QUANTIZED_TILE_N", "QUANTIZED_PRODUCER_REGISTERS", "QUANTIZED_CONSUMER_REGISTERS",
           "quantized_tile_n_reason", "OUT_DTYPES_DSL", "BLOCKWISE_TILE", "BLOCKWISE_WGRAD_WARPGROUPS", "SCALE_BOX",
           "FP8_DTYPES", "BLOCKWISE_GRAD_FORMATS"]

TOKEN_ROW_WARPGROUPS = 2  # FC1's and FC2 dgrad's consumer warpgroups, 64 rows of the tile each
FC1_TILE_N = 128  # FC1's a columns per work item (gated: 2 x 128 h columns)
FC2_DGRAD_TILE_NS = (128, 256)  # FC2 dgrad's da (and dh gate / up) columns per work item
# the quantizing epilogue's tile width (_quantize_epilogue.TILE_COLS, 128), FC2 dgrad's tile_n with
# a recipe (launch_options fixes it there; a test checks the two agree)
QUANTIZED_TILE_N = launch_options.QUANTIZED_TILE_N
# MXFP8 FC2 dgrad: 8 more registers a consumer thread, 16 fewer a producer one (128 x 24 + 256 x 240 = 384 x 168)
QUANTIZED_PRODUCER_REGISTERS, QUANTIZED_CONSUMER_REGISTERS = 24, 240
OUT_DTYPES_DSL = dict(zip(OUT_DTYPES, (Float32, BFloat16)))  # torch -> cutlass dtype of a weight gradient
BLOCKWISE_TILE = 128  # the blockwise weight gradient's BM = BN = BK, and one scale block of tokens
BLOCKWISE_WGRAD_WARPGROUPS = 2  # the blockwise weight gradient's consumer warpgroups, 64 rows of the tile each
SCALE_BOX = 4  # blocks of its scale box: 16 bytes of fp32, TMA's smallest inner extent and its alignment
FP8_DTYPES = {ElementFormat.E4M3: Float8E4M3FN, ElementFormat.E5M2: Float8E5M2}
BLOCKWISE_GRAD_FORMATS = (ElementFormat.E4M3, ElementFormat.E5M2)


@dataclass(frozen=True)
class KernelConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    b_k_major: bool = True  # B_g (N, K) row-major (stacked weights); False: N-major (transposed view)
    bias_dtype: torch.dtype | None = None  # None: no bias
    tile_n: int = 256  # 128 (one consumer warpgroup) or 256 (two)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    # the epilogue's stores: "regs", predicated bf16 pairs from the registers; "tma", subtiles
    # staged in shared memory and stored by TMA, overlapped with what follows (``_store``)
    store: str = "regs"
    # B given as two tensors side by side along K (W1^T with its gate and up stored apart, FC1
    # dgrad; ``_pipeline.KSplit``), both of the b_k_major layout
    k_split: bool = False
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)

    def __post_init__(self):
        if self.tile_n not in (128, 256):
            raise ValueError(f"tile_n must be 128 or 256, got {self.tile_n}")
        if self.bias_dtype is not None and self.bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"bias dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.bias_dtype}")
        launch_options.check_store(self.store, self.bias_dtype)
        launch_options.check_cluster(self.cluster)
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 A tile and a bf16 B tile."""
        return TILE_M * TILE_K * 2 + self.tile_n * TILE_K * 2

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles, outside the slot ring."""
        return _store.smem_bytes(self.tile_n // 128) if self.store == "tma" else 0


@dataclass(frozen=True)
class FC1Config(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    b_k_major: bool = True  # W1_g (N1, H) row-major (stacked weights); False: N-major (transposed view)
    bias_dtype: torch.dtype | None = None  # None: no b1
    probs_dtype: torch.dtype | None = None  # None: no probs
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    quantized: bool = False  # MXFP8: a written as Q_row(a) and Q_col(a) (E4M3, compact scales), not bf16
    floor_scales: bool = False  # FLOOR (OCP) scale bytes instead of RCEIL (quantized only)
    # bf16 c and a's stores: "regs", predicated pairs from the registers; "tma", subtiles staged in
    # shared memory and TMA-stored, c gate, c up and a of a subtile as one bulk group (``_store``)
    store: str = "regs"
    # W1's up weights a second tensor (gate and up stored apart, ``gmlp.contract.gate_up``): the
    # up tiles from its own TMA descriptor at row n_tile * 128, not from W1's at F + n_tile * 128
    up_apart: bool = False
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)

    def __post_init__(self):
        check_activation(self.activation)
        if self.floor_scales and not self.quantized:
            raise ValueError("floor_scales needs quantized=True (a bf16 a has no scales)")
        for name in ("bias_dtype", "probs_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"{name} must be one of {tuple(FLOAT_DTYPES)}, got {dtype}")
        if self.up_apart and not (self.activation.gated and self.b_k_major):
            raise ValueError(f"up_apart needs a gated activation and K-major gate and up views, got "
                             f"{self.activation.name}, b_k_major={self.b_k_major}")
        launch_options.check_store(self.store)
        launch_options.check_cluster(self.cluster)
        if self.store == "tma" and self.quantized:
            raise ValueError("store='tma' needs a bf16 a (the TMA-store epilogue has no quantized outputs yet), got "
                             "quantized=True")
        self.check_stages()

    @property
    def b_tiles(self) -> int:
        """B tiles per k-step: gate and up for the gated activations, one for srelu."""
        return 2 if self.activation.gated else 1

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: the bf16 A tile and B tiles."""
        return TILE_M * TILE_K * 2 + self.b_tiles * FC1_TILE_N * TILE_K * 2

    def fixed_bytes(self) -> int:
        """Outside the slot ring: the epilogue's buffers."""
        return self.epilogue_bytes()

    def epilogue_bytes(self) -> int:
        """Shared memory of the epilogue: the quantizing one's transposed fp8 tile and amax keys
        (20 KB), the TMA store's subtiles, none for bf16 from the registers."""
        if self.quantized:
            return _quantize_epilogue.SMEM_BYTES
        return _store.smem_bytes(TOKEN_ROW_WARPGROUPS) if self.store == "tma" else 0

    def slot_name(self) -> str:
        return f"{self.activation.name}{' (quantized)' if self.quantized else ''}"


def quantized_tile_n_reason(tile_n: int) -> str:
    return (f"the sm90 fc2_dgrad MXFP8 epilogue needs tile_n={QUANTIZED_TILE_N}, got tile_n={tile_n}: a thread "
            f"holds {tile_n // 2} fp32 da accumulators through the epilogue, and quantizing dh needs 64 more (the d "
            f"gate and d up values of a 128-column quantized tile) while the rest stay live; at tile_n=128 that "
            f"peaks at 238 of the {QUANTIZED_CONSUMER_REGISTERS} consumer registers, at 256 it would need about 64 "
            f"more than exist")


@dataclass(frozen=True)
class FC2DgradConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    b_k_major: bool = True  # w2t_g (F, H) row-major; False: N-major (the transposed view of W2 (E, H, F))
    probs_dtype: torch.dtype | None = None  # None: no probs (and no dprobs)
    bias_grad: bool = False  # per-warp column sums of dh for db1
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    tile_n: int = 128  # da columns per work item: 128 (m64n128 wgmmas) or 256 (m64n256)
    quantized: bool = False  # MXFP8: dh written as Q_row(dh) and Q_col(dh) (compact scales), not bf16
    e5m2: bool = False  # the gradient format E5M2 instead of E4M3 (quantized only)
    floor_scales: bool = False  # FLOOR (OCP) scale bytes instead of RCEIL (quantized only)
    # a bf16 dh's stores: "regs", predicated pairs from the registers; "tma", subtiles staged in
    # shared memory and TMA-stored, d gate and d up of a subtile as one bulk group (``_store``)
    store: str = "regs"
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)

    def __post_init__(self):
        if self.tile_n not in FC2_DGRAD_TILE_NS:
            raise ValueError(f"tile_n must be one of {FC2_DGRAD_TILE_NS}, got {self.tile_n}")
        check_activation(self.activation)
        if self.probs_dtype is not None and self.probs_dtype not in FLOAT_DTYPES:
            raise ValueError(f"probs_dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.probs_dtype}")
        if (self.e5m2 or self.floor_scales) and not self.quantized:
            raise ValueError("e5m2 and floor_scales need quantized=True (a bf16 dh has no scales)")
        if self.quantized and self.tile_n != QUANTIZED_TILE_N:
            raise ValueError(quantized_tile_n_reason(self.tile_n))
        launch_options.check_store(self.store)
        launch_options.check_cluster(self.cluster)
        if self.store == "tma" and self.quantized:
            raise ValueError("store='tma' needs a bf16 dh (the TMA-store epilogue has no quantized outputs yet), got "
                             "quantized=True")
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 dy tile and a bf16 w2t tile."""
        return TILE_M * TILE_K * 2 + self.tile_n * TILE_K * 2

    def fixed_bytes(self) -> int:
        """Outside the slot ring: the epilogue's buffers."""
        return self.epilogue_bytes()

    def epilogue_bytes(self) -> int:
        """Shared memory of the epilogue: the quantizing one's transposed fp8 tile and amax keys
        (20 KB, reused by the d gate and d up halves), the TMA store's subtiles, none for bf16 from
        the registers."""
        if self.quantized:
            return _quantize_epilogue.SMEM_BYTES
        return _store.smem_bytes(TOKEN_ROW_WARPGROUPS) if self.store == "tma" else 0

    def slot_name(self) -> str:
        return f"tile_n={self.tile_n}{' (quantized)' if self.quantized else ''}"


@dataclass(frozen=True)
class WgradConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    out_dtype: torch.dtype = torch.float32  # of a new result (ignored, fp32, with accumulate)
    accumulate: bool = False  # add into an fp32 out (main_grad) instead of storing
    tile_n: int = 256  # 128 (one consumer warpgroup) or 256 (two)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    # K tail: True, TMA zero-fills past the expert's end (the ragged 4-D view); False, the plain
    # (features, T) view, and the consumers zero the next expert's rows of the last k-step in smem
    ragged_tma: bool = True
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent n-tiles, their A tiles multicast (``_cluster``)
    # the epilogue's stores: "regs", predicated pairs from the registers (accumulate: loaded,
    # added, stored); "tma", subtiles staged in shared memory and TMA-stored, or TMA reduce-added
    # with accumulate (``_store``)
    store: str = "regs"

    def __post_init__(self):
        if self.tile_n not in (128, 256):
            raise ValueError(f"tile_n must be 128 or 256, got {self.tile_n}")
        if self.out_dtype not in OUT_DTYPES_DSL:
            raise ValueError(f"out_dtype must be one of {tuple(OUT_DTYPES_DSL)}, got {self.out_dtype}")
        if self.accumulate and self.out_dtype != torch.float32:
            raise ValueError("accumulate adds into an fp32 out: out_dtype must be torch.float32")
        launch_options.check_store(self.store)
        launch_options.check_cluster(self.cluster)
        self.check_stages()

    def stage_bytes(self) -> int:
        """Shared memory of one pipeline slot: a bf16 A tile and a bf16 B tile."""
        return (TILE_M + self.tile_n) * TILE_K * 2

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles, outside the slot ring."""
        if self.store != "tma":
            return 0
        return _store.smem_bytes(self.tile_n // 128, OUT_DTYPES_DSL[self.out_dtype])


@dataclass(frozen=True)
class BlockwiseGemmConfig(StagedConfig, WideItems):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    bias_dtype: torch.dtype | None = None  # FC2's b2 (E, N), bf16 or fp32, added before the rounding; None: none
    a_format: ElementFormat = ElementFormat.E4M3  # A's fp8 format (B is E4M3)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    wide: bool = False  # two 128-column halves a work item (N % 256 == 0; see the module docstring)
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)
    # promote k-tile k - 1 while k-tile k's wgmmas run (``_blockwise_k_loops.pipelined_k_tiles``;
    # one half only: wide=False)
    pipelined: bool = False
    # the epilogue's stores: "regs", predicated bf16 pairs (+ the bias) from the registers; "tma",
    # subtiles staged in shared memory and TMA-stored through the ragged view of D, overlapped
    # with the next item's mainloop (``_store``; no bias yet)
    store: str = "regs"

    def __post_init__(self):
        if self.bias_dtype is not None and self.bias_dtype not in FLOAT_DTYPES:
            raise ValueError(f"bias dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.bias_dtype}")
        launch_options.check_store(self.store, self.bias_dtype)
        launch_options.check_cluster(self.cluster)
        if self.pipelined and self.wide:
            raise ValueError(f"BlockwiseGemmConfig: pipelined=True needs wide=False: "
                             f"{launch_options.PIPELINED_HALVES_REASON}")
        self.check_stages()

    def stage_bytes(self) -> int:
        """One slot: an A k-tile and a B k-tile a half, of fp8 bytes, and A's scale box."""
        return slot_bytes(self.halves)

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles (both halves' through one ring), outside the slot ring."""
        return _store.smem_bytes(TOKEN_ROW_WARPGROUPS) if self.store == "tma" else 0


@dataclass(frozen=True)
class BlockwiseFC1Config(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    bias_dtype: torch.dtype | None = None  # None: no b1
    probs_dtype: torch.dtype | None = None  # None: no probs
    power_of_two: bool = True  # a's scales truncated to powers of two (the recipe's default)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)

    def __post_init__(self):
        check_activation(self.activation)
        for name in ("bias_dtype", "probs_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"{name} must be one of {tuple(FLOAT_DTYPES)}, got {dtype}")
        launch_options.check_cluster(self.cluster)
        self.check_stages()

    @property
    def halves(self) -> int:
        """B tiles a slot: gate and up for the gated activations, h for srelu."""
        return 2 if self.activation.gated else 1

    def stage_bytes(self) -> int:
        """One slot: x's k-tile and a W1 k-tile a half, of fp8 bytes, and x's scale box."""
        return slot_bytes(self.halves)

    def fixed_bytes(self) -> int:
        return _quantize_epilogue.SMEM_BYTES  # the transposed fp8 tile and the amax keys

    def slot_name(self) -> str:
        return self.activation.name


@dataclass(frozen=True)
class BlockwiseFC2DgradConfig(StagedConfig):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    activation: Activation
    grad_format: ElementFormat = ElementFormat.E4M3  # dy's and dh's fp8 format
    probs_dtype: torch.dtype | None = None  # None: no probs (and no dprobs)
    bias_grad: bool = False  # db1's warp sums
    power_of_two: bool = True  # dh's scales truncated to powers of two (the recipe's default)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent m-tiles, their B tiles multicast (``_cluster``)
    # promote k-tile k - 1 while k-tile k's wgmmas run (``_blockwise_k_loops.pipelined_k_tiles``)
    pipelined: bool = False

    def __post_init__(self):
        check_activation(self.activation)
        launch_options.check_cluster(self.cluster)
        if self.grad_format not in BLOCKWISE_GRAD_FORMATS:
            raise ValueError(f"grad_format must be one of {[f.value for f in BLOCKWISE_GRAD_FORMATS]}, "
                             f"got {self.grad_format}")
        if self.probs_dtype is not None and self.probs_dtype not in FLOAT_DTYPES:
            raise ValueError(f"probs_dtype must be one of {tuple(FLOAT_DTYPES)}, got {self.probs_dtype}")
        self.check_stages()

    def stage_bytes(self) -> int:
        """One slot: dy's k-tile and a W2^T k-tile, of fp8 bytes, and dy's scale box."""
        return slot_bytes(1)

    def fixed_bytes(self) -> int:
        return _quantize_epilogue.SMEM_BYTES  # the transposed fp8 tile and the amax keys

    def slot_name(self) -> str:
        return self.activation.name


@dataclass(frozen=True)
class BlockwiseWgradConfig(StagedConfig, WideItems):
    """What one compiled kernel is specialized on (shapes and expert counts are runtime values)."""

    out_dtype: torch.dtype = torch.float32  # of a new result (fp32 with accumulate)
    accumulate: bool = False  # add into an fp32 out (main_grad) instead of storing
    a_format: ElementFormat = ElementFormat.E4M3  # A's fp8 format (dy, dh: the gradient format)
    b_format: ElementFormat = ElementFormat.E4M3  # B's (a, x: E4M3; dh's E5M2 never meets an E5M2 B)
    stages: int | None = None  # smem pipeline depth; None: as many as fit
    wide: bool = False  # two 128-column halves an n-tile (N % 256 == 0; see the module docstring)
    cluster: int = 1  # CTAs a cluster: 2 pairs adjacent n-tiles, their A tiles multicast (``_cluster``)
    # the epilogue's stores: "regs", pairs from the registers (accumulate: loaded, added, stored);
    # "tma", subtiles staged in shared memory and TMA-stored, or TMA reduce-added with accumulate
    # (``_store``), overlapped with the next item's mainloop
    store: str = "regs"

    def __post_init__(self):
        if self.out_dtype not in OUT_DTYPES_DSL:
            raise ValueError(f"out_dtype must be one of {tuple(OUT_DTYPES_DSL)}, got {self.out_dtype}")
        if self.accumulate and self.out_dtype != torch.float32:
            raise ValueError("accumulate adds into an fp32 out: out_dtype must be torch.float32")
        launch_options.check_store(self.store)
        launch_options.check_cluster(self.cluster)
        self.check_stages()

    def stage_bytes(self) -> int:
        """One slot: an A k-tile and a B k-tile a half, of fp8 bytes, and their (128, 4) fp32 scale boxes."""
        return (1 + self.halves) * (BLOCKWISE_TILE * BLOCKWISE_TILE + BLOCKWISE_TILE * SCALE_BOX * 4)

    def fixed_bytes(self) -> int:
        """The TMA-store epilogue's subtiles (both halves' through one ring), outside the slot ring."""
        if self.store != "tma":
            return 0
        return _store.smem_bytes(BLOCKWISE_WGRAD_WARPGROUPS, OUT_DTYPES_DSL[self.out_dtype])
