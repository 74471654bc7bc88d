"""Launch configurations of the Triton GEMM kernels: one per kernel and operand kind (bf16 or MXFP8).

Chosen from sweeps on the H200 at the DeepSeek-V3-like shape (E=32, T=32768, H=7168, F=2048,
balanced routing); the sweep and its timings are in ``bench_results/gemm-sweep-h200-20261129.txt``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmlp.scale_layout import ceil_div

__all__ = ["GemmTiling", "WgradTiling", "FC1_TILING", "GROUPED_GEMM_TILING", "FC2_DGRAD_TILING", "WGRAD_TILING"]


@dataclass(frozen=True)
class GemmTiling:
    """A program computes a (128-row expert tile, block_n) output tile, block_k of K per step."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int  # software pipeline depth of the K loop
    n_fastest: bool = False  # launch order: column tiles fastest (``_grouping.output_tile``)

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
    n_fastest: bool = False  # launch order: N tiles fastest, experts slowest (else experts fastest)

    def __post_init__(self) -> None:
        if self.block_t % 32 or min(self.block_m, self.block_n, self.num_warps, self.num_stages) < 1:
            raise ValueError(f"invalid tiling {self}: block_t must be a multiple of 32 (token blocks), the rest >= 1")

    def grid(self, experts: int, m: int, n: int) -> tuple[int, int, int]:
        """The launch grid for experts' (m, n) weight gradients."""
        m_tiles, n_tiles = ceil_div(m, self.block_m), ceil_div(n, self.block_n)
        return (n_tiles, m_tiles, experts) if self.n_fastest else (experts, m_tiles, n_tiles)


# keyed by "quantized" (MXFP8 operands, dequantized to bf16 on load) -> tiling; TFLOP/s measured
FC1_TILING = {False: GemmTiling(128, 64, 8, 4),  # 517 (gated: two accumulators)
              True: GemmTiling(128, 128, 8, 2)}  # 259
GROUPED_GEMM_TILING = {False: GemmTiling(256, 64, 8, 4),  # FC2 503, FC1 dgrad (W1^T view) 545
                       True: GemmTiling(128, 64, 4, 3)}  # FC2 245, FC1 dgrad (Q_col(W1)) 220
FC2_DGRAD_TILING = {False: GemmTiling(128, 64, 8, 4),  # 354
                    True: GemmTiling(128, 64, 8, 3)}  # 136
WGRAD_TILING = {False: WgradTiling(128, 256, 64, 8, 3),  # 365
                True: WgradTiling(128, 128, 128, 8, 3)}  # 106
