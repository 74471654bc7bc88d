"""Launch configurations of the Triton GEMM kernels; the fused epilogues have one per output kind.

The GEMMs always read bf16 operands (MXFP8 ones are dequantized first), so a tiling depends only
on what the epilogue writes: FC1's ``a`` and FC2 dgrad's ``dh`` in bf16 or quantized both ways.
Chosen by ``python -m gmlp.bench gemm`` on the H200 at the DeepSeek-V3-like shape (E=32,
T=32768, H=7168, F=2048, balanced routing): ``bench_results/gemm-h200-20261129T223101.json``.
Column tiles fastest won for every kernel (consecutive programs share the A row panel in L2).
"""

from __future__ import annotations

from dataclasses import dataclass

from gmlp.mxfp8.scale_layout import ceil_div

__all__ = ["GemmTiling", "WgradTiling", "FC1_TILING", "GROUPED_GEMM_TILING", "FC2_DGRAD_TILING", "WGRAD_TILING"]


@dataclass(frozen=True)
class GemmTiling:
    """A program computes a (128-row expert tile, block_n) output tile, block_k of K per step."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int  # software pipeline depth of the K loop
    n_fastest: bool = True  # launch order: column tiles fastest (``_grouping.output_tile``)

    def __post_init__(self) -> None:
        if self.block_n % 32 or self.block_k % 32 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"invalid tiling {self}: block_n and block_k must be multiples of 32, the rest >= 1")

    def grid(self, row_tiles: int, n: int) -> tuple[int, int]:
        """The launch grid for row_tiles expert tiles by n output columns."""
        column_tiles = ceil_div(n, self.block_n)
        return (column_tiles, row_tiles) if self.n_fastest else (row_tiles, column_tiles)


@dataclass(frozen=True)
class WgradTiling:
    """A program computes a (block_m, block_n) tile of one expert's weight gradient, block_t
    tokens per step."""

    block_m: int
    block_n: int
    block_t: int
    num_warps: int
    num_stages: int
    n_fastest: bool = True  # launch order: N tiles fastest, experts slowest (else experts fastest)

    def __post_init__(self) -> None:
        if self.block_t % 16 or min(self.block_m, self.block_n, self.num_warps, self.num_stages) < 1:
            raise ValueError(f"invalid tiling {self}: block_t must be a multiple of 16 (a dot's K), the rest >= 1")

    def grid(self, experts: int, m: int, n: int) -> tuple[int, int, int]:
        """The launch grid for experts' (m, n) weight gradients."""
        m_tiles, n_tiles = ceil_div(m, self.block_m), ceil_div(n, self.block_n)
        return (n_tiles, m_tiles, experts) if self.n_fastest else (experts, m_tiles, n_tiles)


# TFLOP/s measured (torch bf16 of the same product: 594-664); with quantized outputs they count the
# dequantize kernels of the operands too, as the layer runs them
FC1_TILING = {False: GemmTiling(128, 64, 8, 3),  # keyed by "a quantized": 587
              True: GemmTiling(128, 64, 8, 4)}  # 426
GROUPED_GEMM_TILING = GemmTiling(256, 64, 8, 4)  # FC2 532, FC1 dgrad (W1^T view) 591
FC2_DGRAD_TILING = {False: GemmTiling(128, 64, 8, 4),  # keyed by "dh quantized": 512
                    True: GemmTiling(64, 128, 8, 3)}  # 255 (fewer registers for the quantizing epilogue)
WGRAD_TILING = WgradTiling(128, 256, 64, 8, 3)  # dW2 481, dW1 470
