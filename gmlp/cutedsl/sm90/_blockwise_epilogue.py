"""FP8 blockwise quantization of a 128 x 128 fp32 tile held in wgmma accumulators, both ways
(1 x 128 rowwise, 128 x 1 columnwise), for the epilogues of the sm_90a blockwise kernels (FC1's
``a``; FC2 dgrad's ``dh``, its d gate and d up tiles one call each). The twin is
``gmlp.triton_ref._blockwise_epilogue.store_blockwise_both_ways``; the scale is the spec's
(``gmlp.fp8_blockwise.spec``, TransformerEngine's ``Float8BlockScaling``).

The tile is one block each way: its 128 columns one rowwise block of each row (the kernels' tiles
are 128-column aligned, F % 128 == 0), its 128 rows one columnwise block of each column (the
expert-aligned 128-row tile is the layout's token block ``m_tile``: ``gmlp.fp8_blockwise.layout``).
The fragment is MXFP8's (``_quantize_epilogue``: warp w holds rows 16w .. 16w + 15, lane t rows
16w + t // 4 + 8s and columns 8j + 2 (t % 4) + h, value 4j + 2s + h), and so are the pieces
reused from it: the NaN-ignoring amax keys, the column reduce-scatter and all-gather, the
transposed smem tile ``sQ`` and the transposed store.

- Scale (``blockwise_scale``): s = fmax / amax by ``div.rn.f32`` (IEEE, no flush: a subnormal
  amax or scale_inv is kept), inf -> the largest fp32, s = 1 for amax 0, s = fmax / inf = 0 for
  an amax of inf (the spec's non-finite block: NaN elements, scale_inv inf), the power-of-two
  truncation by masking the mantissa, scale_inv = 1 / s by ``div.rn.f32``: the Triton kernels'
  fp64 divisions rounded to fp32 give the same correctly rounded quotients.
- Rowwise: a row's 128 columns are 32 values in each lane of a quad: an in-thread key max, two
  ``shfl.xor``; lane quad_lane == s stores row slot s's scale_inv (MN-major (F/128, pad4(T))).
  Data: fp8 column pairs as 16-bit stores (MXFP8's pattern).
- Columnwise: a column's 128 rows are 16 in each of the 8 warps: per column the thread's 2 rows,
  the column reduce-scatter over 8 lanes (each lane keeps 4 columns), the warp's keys through
  ``sKeys`` (named barrier A of the 256 consumer threads), each lane maxing the 8 warps' words of
  its 4 columns: 4 scales a lane, warp 0 storing their scale_inv; the 4 multipliers all-gathered
  over the column's 8 lanes (28 shuffles of words), the values quantized into ``sQ`` and, after
  barrier B, stored transposed: 128 bytes of each feature row at token column 128 m_tile (the
  whole block, rows past the expert's end as zeros: the layout's padding).
- ``store_unused_blocks``: the columnwise blocks past the last expert's (the layout bounds them
  without a host sync) as zeros with scale_inv 1.0, as the Triton kernel writes them.

Shared memory and barriers: MXFP8's ``SMEM_BYTES`` (sQ 16 KB, sKeys 4 KB) and its ordering of the
buffers' reuse across work items (A and B on one named barrier id).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint16, Uint32, Uint8, const_expr
from cutlass.cute.runtime import make_fake_tensor

from gmlp.cutedsl._quantize_kernel import (_amax_keys, _amax_of_keys, _as_f32, _as_u32, _elem_address, _quantize,
                                           _select, store_transposed)
from gmlp.cutedsl.sm90._blockwise_mainloop import fake_token_rows
from gmlp.cutedsl.sm90._compile import fake_matrix, sym_stride
from gmlp.cutedsl.sm90._epilogue_math import ptx_f32
from gmlp.cutedsl.sm90._pipeline import ALIGN
from gmlp.cutedsl.sm90._quantize_epilogue import (COLUMN_GROUPS, CONSUMER_THREADS, TILE_COLS, TILE_ROWS, WARPS,
                                                  DeviceOps, _all_gather, _value, column_keys_to_smem, column_offsets,
                                                  owned_column, quantize_into_sq)

__all__ = ["blockwise_scale", "quantize_tile_blockwise", "store_unused_blocks", "fake_both_ways"]

_FP32_MAX = 3.4028234663852886e38  # the epilogue's input dtype's largest finite value (fp32)
_FP32_INF_BITS = 0x7F800000
_SIGN_EXPONENT = 0xFF800000  # an fp32's sign and exponent bits: a positive normal s -> 2**floor(log2 s)


def blockwise_scale(amax: Uint32, fmax: float, power_of_two: bool):
    """(s, scale_inv) fp32 of a block from its amax's fp32 bits (>= 0, NaN ignored): the spec's."""
    quotient = ptx_f32("div.rn.f32", Float32(fmax), _as_f32(amax))
    quotient_bits = _select(_as_u32(quotient) == Uint32(_FP32_INF_BITS), _as_u32(Float32(_FP32_MAX)),
                            _as_u32(quotient))
    one = _as_u32(Float32(1.0))
    bits = _select(amax == Uint32(0), one, quotient_bits)  # amax inf: quotient +0, scale_inv inf
    if const_expr(power_of_two):
        bits = bits & Uint32(_SIGN_EXPONENT)
    s = _as_f32(bits)
    return s, ptx_f32("div.rn.f32", Float32(1.0), s)


@cute.jit
def quantize_tile_blockwise(
    values: list,  # the thread's 64 fp32 values of the tile (fragment order), zero outside the valid rows
    tCcD: cute.Tensor,  # the fragment's (row, column) tile coordinates
    thr_mma,  # the thread's slice of the tiled MMA (partitions the row data like the accumulators)
    tidx: Int32,  # consumer thread 0..255
    outputs: tuple,  # (row data (T, N) u8, row scales (N/128, pad4(T)) f32, col data (N, 128 n_blocks) u8,
    #                  col scales (N, pad4(n_blocks)) f32)
    smem: tuple,  # (sQ, sKeys) of ``_quantize_epilogue.smem_tensors``
    first_row: Int32,  # the tile's first token row
    col0: Int32,  # the tile's first column in the outputs (a multiple of 128)
    valid_rows: Int32,  # rows of the tile that are the expert's (may exceed 128)
    token_block: Int32,  # the columnwise block of the tile's rows (its global m-tile)
    fmax: float,  # the element format's largest value (448, 57344)
    e5m2: bool,
    power_of_two: bool,
    barrier_id: int,
):
    """Q_row and Q_col of the tile (module docstring). Every consumer thread must call it
    (shuffles and named barriers); ``values`` outside the valid rows must be zeros."""
    mRowData, mRowScale, mColData, mColScale = outputs
    sQ, sKeys = smem
    lane = tidx % 32
    warp = cute.arch.make_warp_uniform(tidx // 32)
    quad_lane = lane % 4
    col_block = col0 // TILE_COLS

    # ---- Q_row: one block a row, 32 values in each lane of a quad -----------------------------
    gRow = cute.local_tile(cute.domain_offset((first_row, col0), mRowData), (TILE_ROWS, TILE_COLS), (0, 0))
    tCgRow = cute.recast_tensor(thr_mma.partition_C(gRow), Uint16)  # one 16-bit word per column pair
    for s in cutlass.range_constexpr(2):
        key = _amax_keys([_as_u32(values[_value(s, j, h)]) for j in range(COLUMN_GROUPS) for h in range(2)], False)
        for offset in (1, 2):
            key = cutlass.max(key, DeviceOps.shuffle_xor(key, offset))
        multiplier, scale_inv = blockwise_scale(_amax_of_keys(key, False), fmax, power_of_two)
        row = tCcD[_value(s, 0, 0)][0]
        if row < valid_rows:
            for j2 in cutlass.range_constexpr(COLUMN_GROUPS // 2):  # column groups 2 j2, 2 j2 + 1
                j = 2 * j2
                word = _quantize([values[_value(s, jj, h)] for jj in (j, j + 1) for h in (0, 1)], multiplier, e5m2)[0]
                for half in cutlass.range_constexpr(2):
                    tCgRow[2 * (j + half) + s] = Uint16(word >> Uint32(16 * half))  # pair (slot s, group j + half)
            if quad_lane == s:
                mRowScale[col_block, first_row + row] = scale_inv

    # ---- Q_col: one block a column, 16 rows in each of the 8 warps -----------------------------
    rKeys, sKeys4 = column_keys_to_smem(values, lane, warp, sKeys)  # the lane's 4 columns' 16-row keys
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=CONSUMER_THREADS)  # A: sKeys complete
    rOther = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    for w in cutlass.range_constexpr(WARPS):
        cute.autovec_copy(sKeys4[None, w * 32 + lane], rOther)
        for r in cutlass.range_constexpr(4):
            rKeys[r] = cutlass.max(rKeys[r], rOther[r])
    multipliers = [Uint32(0)] * 4
    for r in cutlass.range_constexpr(4):
        multiplier, scale_inv = blockwise_scale(_amax_of_keys(rKeys[r], False), fmax, power_of_two)
        multipliers[r] = _as_u32(multiplier)
        if warp == 0:
            mColScale[col0 + owned_column(lane, r), token_block] = scale_inv
    # word k: the multiplier of thread column k (the order _reduce_scatter assigned the keys)
    words = _all_gather(multipliers, lane, column_offsets()[::-1])
    quantize_into_sq(values, [_as_f32(w) for w in words], sQ, lane, warp, e5m2)
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=CONSUMER_THREADS)  # B: sQ complete
    store_transposed(sQ, mColData, tidx, col0, token_block * TILE_ROWS, Int32(TILE_ROWS), mColData.shape[0])


@cute.jit
def store_unused_blocks(mColData: cute.Tensor, mColScale: cute.Tensor, first_unused: Int32, n_tiles: Int32,
                        item: Int32, step: Int32, tidx: Int32):
    """The columnwise blocks from ``first_unused`` (the last expert's end, ``tile_start[E]``) to
    the buffer's last, as zeros with scale_inv 1.0: a CTA's share (``item``, ``item + step``, ...)
    of the (block, 128-column tile) pairs, each by the 256 consumer threads (``tidx``): thread t
    writes 64 bytes of tile column t // 2 and, when t is even, its scale."""
    n_blocks = mColData.shape[1] // TILE_ROWS
    count = (n_blocks - first_unused) * n_tiles
    zeros = cute.make_rmem_tensor(cute.make_layout(16), Uint32)
    zeros.fill(0)
    column = tidx // 2
    while item < count:
        block = first_unused + item // n_tiles
        feature = (item % n_tiles) * TILE_COLS + column
        address = _elem_address(mColData, feature, block * TILE_ROWS + (tidx % 2) * (TILE_ROWS // 2))  # 16-byte aligned
        cute.autovec_copy(zeros, cute.make_tensor(cute.make_ptr(Uint32, address, cute.AddressSpace.gmem,
                                                                assumed_align=16), cute.make_layout(16)))
        if tidx % 2 == 0:
            mColScale[feature, block] = Float32(1.0)
        item += step


def fake_both_ways(rows, cols, padded_rows) -> tuple:
    """Symbolic stand-ins of the epilogue's four outputs for a (rows, cols) source: Q_row's data
    and MN-major scales (``fake_token_rows``), Q_col's block-aligned (cols, 128 n_blocks) data
    and (cols, pad4(n_blocks)) scales."""
    row_data, row_scale = fake_token_rows(rows, cols, cute.sym_int(), padded_rows, divisibility=TILE_COLS)
    col_data = fake_matrix(Uint8, cols, cute.sym_int(divisibility=TILE_ROWS), divisibility=TILE_ROWS)
    col_scale = make_fake_tensor(Float32, (cols, cute.sym_int(divisibility=4)), stride=(sym_stride(4), 1),
                                 assumed_align=ALIGN)
    return row_data, row_scale, col_data, col_scale
