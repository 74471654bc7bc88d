"""MXFP8 quantization of a 128 x 128 fp32 tile held in wgmma accumulators, both ways (Q_row and
Q_col), for the epilogues of the sm_90a GEMM kernels (FC1's ``a``; FC2 dgrad's ``dh``: any
column offset that is a multiple of 32, E5M2, two 64-column output segments). The twin is
``gmlp.triton_ref._epilogue.store_quantized_both_ways``; the block math is the CuTeDSL quantize
kernel's (``gmlp.cutedsl._quantize_kernel``: NaN-ignoring amax keys, E8M0 bytes with RCEIL or
FLOOR, ``cvt.rn.satfinite.e4m3x2.f32``, the funnel-shift transposed store), imported, not
restated.

The fragment (checked at trace time, ``check_fragment_layout``): 256 consumer threads, warp w =
0..7 (two warpgroups of 4) holds tile rows 16w .. 16w + 15; lane t holds rows 16w + t // 4 + 8s
(row slot s = 0, 1) and columns 8j + 2 (t % 4) + h (column group j = 0..15, h = 0, 1), value
index 4j + 2s + h of the thread's 64.

- Q_row: a 1 x 32 block of one row is 8 values in each of the 4 lanes of a quad. Per row slot,
  each lane reduces its 4 blocks' keys (8 values each), then a reduce-scatter over the quad
  (xor 2: keep 2 blocks, send 2; xor 1: keep 1) leaves lane t % 4 with block t % 4: one E8M0
  byte per lane and row (so only 2 scale computations per thread), which the lane stores; the 8
  bytes are gathered back to every lane of the quad (one word of 2 bytes, 4 index shuffles).
  Data: a column pair's two fp8 bytes (one ``cvt...e4m3x2``) as one 16-bit store, row- and
  column-masked (the pattern of the bf16 ``a`` stores: a quad writes 8 contiguous bytes).
- Q_col: a 32 x 1 block of one column is 32 rows: 16 in each of two warps (w = 2b, 2b + 1 hold
  block b). Per column, a thread takes its 2 rows, then a reduce-scatter over the 8 lanes of the
  column (xor 16, 8, 4: 16 + 8 + 4 shuffles) leaves lane (t // 4, t % 4) with the warp's 16-row
  amax keys of 4 columns 16 (t // 4) + 8r + 2 (t % 4) + h (r, h = 0, 1), which depend on the lane
  only: the lane writes them as one 16-byte word to ``sKeys[w, t]`` and, after a named barrier of
  the 256 threads (A), reads the other warp's word at ``sKeys[w ^ 1, t]``: the 32-row amax of
  its 4 columns, 4 E8M0 bytes, which the even warp stores. The bytes (one word) are gathered
  back over the 8 lanes (xor 4, 8, 16: 1 + 2 + 4 shuffles of words), and each value is
  quantized with its column's scale into ``sQ``, the transposed fp8 tile (128 columns x 128
  rows; the quantize kernel's layout: column k's 16-byte chunk c at ``sq_position(k, c)``): warp
  w's bytes of column k are chunk w, byte t // 4 + 8s (64 byte stores a thread, no bank
  conflicts). After a second barrier (B) the 256 threads store ``sQ`` with the quantize kernel's
  ``store_transposed`` (16-byte aligned stores, any token offset).
- Masking, as the Triton twin: values of rows past the expert's end or columns past the valid
  ones are zeros in both amaxes and are not written; a column block that starts past the expert's
  end has no scale byte (the launcher zero-fills the unused ones).

- Options for FC2 dgrad (defaults: FC1's trace, its PTX byte-identical): ``column_first`` traces
  Q_col's per-column keys, their reduce-scatter and the sKeys store before Q_row (ptxas otherwise
  computes the 64 per-value keys during Q_row's stores); ``segments`` sends the tile's columns
  [0, 64) and [64, 128) to two output column ranges with their own valid counts (dh's d gate and
  d up columns of one 64-wide half of a da tile): only the masks, the addresses and the
  transposed store (once per segment, the second from sQ row 64) change, each segment holding 2
  whole blocks of a row and 64 whole transposed rows.

Shared memory: ``sQ`` 16 KB + ``sKeys`` 4 KB (``SMEM_BYTES``). Barriers A and B (one named
barrier id) also order the reuse of both buffers across work items: a tile's writes of sKeys
come after every thread passed the previous tile's B, its writes of sQ after every thread passed
its A (so after the previous tile's transposed store).

Host side, for the launchers of FC1 and FC2 dgrad: the epilogue's output arguments (a bf16
tensor, or the Q_row and Q_col buffers) allocated (``output_arguments``) and as symbolic
stand-ins for the compile (``fake_outputs``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, Uint16, Uint32, Uint8, const_expr

from gmlp.cutedsl._quantize_kernel import (_amax_keys, _amax_of_keys, _as_u32, _fp8x4, _multiplier, _quantize,
                                           _scale_byte, _select, sq_position, store_transposed)
from gmlp.cutedsl.sm90._compile import fake_matrix, fake_vector
from gmlp.cutedsl.sm90._pipeline import smem_array
from gmlp.mxfp8.buffers import QuantizeBuffers, compact_buffers
from gmlp.mxfp8.spec import BLOCK_SIZE, ElementFormat

__all__ = ["TILE_ROWS", "TILE_COLS", "CONSUMER_THREADS", "SQ_WORDS", "KEY_WORDS", "SMEM_BYTES", "SEGMENT_COLS",
           "check_fragment_layout", "smem_fields", "smem_tensors", "column_keys_to_smem", "quantize_into_sq",
           "quantize_tile_both_ways", "output_arguments", "fake_outputs"]

TILE_ROWS = 128  # two consumer warpgroups of 64 rows
TILE_COLS = 128  # one m64n128 accumulator per warpgroup
CONSUMER_THREADS = 256
WARPS = CONSUMER_THREADS // 32
ROW_BLOCKS = TILE_COLS // BLOCK_SIZE  # 4 rowwise blocks per tile row
COLUMN_GROUPS = TILE_COLS // 8  # 16: j
SQ_WORDS = TILE_COLS * TILE_ROWS // 4  # the transposed fp8 tile, 32-bit words
KEY_WORDS = WARPS * 32 * 4  # 16-row amax keys: 4 columns per lane and warp
SEGMENT_COLS = TILE_COLS // 2  # quantize_tile_both_ways(segments=...): two 64-column output segments
SEGMENT_GROUPS = SEGMENT_COLS // 8  # column groups j of a segment
SMEM_BYTES = 4 * (SQ_WORDS + KEY_WORDS)  # 20 KB


def _value(s: int, j: int, h: int) -> int:
    """Index of (row slot s, column group j, column h) in the thread's 64 accumulator values."""
    return 4 * j + 2 * s + h


def _fragment_coordinate(t: int, v: int) -> tuple[int, int]:
    """(row, column) of value v of consumer thread t: the layout the shuffles assume."""
    lane, warp = t % 32, t // 32
    return 16 * warp + lane // 4 + 8 * ((v // 2) % 2), 8 * (v // 4) + 2 * (lane % 4) + v % 2


_CHECKED_LAYOUTS: set[str] = set()  # TV layouts already evaluated in this process


def check_fragment_layout(tiled_mma: cute.TiledMma) -> None:
    """Trace time: every (thread, value) of the tiled MMA's C partition of a 128 x 128 tile is at
    ``_fragment_coordinate`` (evaluated once per distinct TV layout and process, about 1 s)."""
    key = str(tiled_mma.tv_layout_C)
    if key in _CHECKED_LAYOUTS:
        return
    identity = cute.make_identity_tensor((TILE_ROWS, TILE_COLS))
    for t in range(CONSUMER_THREADS):
        coordinates = tiled_mma.get_slice(t).partition_C(identity)
        if cute.size(coordinates) != 64:
            raise ValueError(f"unexpected accumulator fragment {coordinates.shape} of thread {t}")
        for v in range(64):
            if tuple(coordinates[v]) != _fragment_coordinate(t, v):
                raise ValueError(f"accumulator value {v} of thread {t} is at {tuple(coordinates[v])}, the "
                                 f"quantizing epilogue assumes {_fragment_coordinate(t, v)}")
    _CHECKED_LAYOUTS.add(key)


def smem_fields() -> dict:
    """The epilogue's fields of a kernel's ``_pipeline.shared_storage``, 128-byte aligned: ``sQ``,
    the transposed fp8 tile, and ``sKeys``, the 16-row amax keys."""
    return dict(sQ=smem_array(Uint32, SQ_WORDS, 128), sKeys=smem_array(Uint32, KEY_WORDS, 128))


def smem_tensors(storage) -> tuple:
    """(sQ, sKeys) of a kernel's shared storage (``smem_fields``): ``quantize_tile_both_ways``'
    ``smem_q``."""
    return (storage.sQ.get_tensor(cute.make_layout(SQ_WORDS)), storage.sKeys.get_tensor(cute.make_layout(KEY_WORDS)))


# ---------------------------------------------------------------------------------------------
# Trace-time pieces (plain Python over DSL values: loops unroll, no control flow)
# ---------------------------------------------------------------------------------------------


class DeviceOps:
    """The warp operations of the shuffle steps, on DSL values (``_reduce_scatter`` and
    ``_all_gather`` take them as an argument so that the CPU test runs the same steps on a
    simulated warp)."""

    @staticmethod
    def lane_bit(lane, offset: int):
        return (lane & Int32(offset)) != Int32(0)

    @staticmethod
    def select(condition, if_value, else_value):
        return _select(condition, if_value, else_value)

    @staticmethod
    def shuffle_xor(value, offset: int):
        return Uint32(cute.arch.shuffle_sync_bfly(value, offset=offset))

    @staticmethod
    def maximum(a, b):
        return cutlass.max(a, b)


def _reduce_scatter(keys: list, lane, offsets: tuple[int, ...], ops=DeviceOps) -> list:
    """Max-reduce the list ``keys`` (amax keys, the same length in every lane) over the lanes
    that differ in the bits ``offsets``, halving the list at each bit: a lane with the bit set
    keeps (and receives the partner's values of) the upper half, sends the lower half. Each lane
    ends with len(keys) / 2**len(offsets) keys: those of indices ``owned_index(lane, offsets, r)``."""
    for offset in offsets:
        upper = ops.lane_bit(lane, offset)
        half = len(keys) // 2
        keys = [ops.maximum(ops.select(upper, keys[k + half], keys[k]),
                            ops.shuffle_xor(ops.select(upper, keys[k], keys[k + half]), offset))
                for k in range(half)]
    return keys


def owned_index(lane, offsets: tuple[int, ...], r: int, size: int):
    """Index into the original list of key r that ``_reduce_scatter(keys of length size, lane,
    offsets)`` leaves in ``lane``: bit i of offsets (first = most significant half) picks a half."""
    index, half = 0, size
    for offset in offsets:
        half //= 2
        index = index + half * ((lane // offset) % 2)
    return index + r


def _all_gather(words: list, lane, offsets: tuple[int, ...], ops=DeviceOps) -> list:
    """Concatenate ``words`` over the lanes that differ in the bits ``offsets`` (``_reduce_scatter``'s
    in reverse order), the lane with the bit set contributing the upper half: every lane ends with
    the words of all the lanes, in the order of the indices ``_reduce_scatter`` assigned them."""
    for offset in offsets:
        upper = ops.lane_bit(lane, offset)
        received = [ops.shuffle_xor(w, offset) for w in words]
        words = ([ops.select(upper, r, w) for r, w in zip(received, words)]
                 + [ops.select(upper, w, r) for r, w in zip(received, words)])
    return words


def row_block_offsets() -> tuple[int, ...]:
    return (2, 1)  # Q_row: the quad's lanes; block quad_lane is left in lane quad_lane


def column_offsets() -> tuple[int, ...]:
    return (16, 8, 4)  # Q_col: the 8 lanes of a column


def owned_column(lane, r: int):
    """Tile column of key r (0..3) a lane owns after the column reduce-scatter: thread column
    k = 4 (lane // 4) + r (``owned_index``), i.e. column group k // 2, column k % 2 of the pair."""
    k = owned_index(lane, column_offsets(), r, 32)
    return 8 * (k // 2) + 2 * (lane % 4) + k % 2


def sq_byte(column, chunk, byte):
    """Byte of ``sQ`` holding tile row 16 chunk + byte of tile column ``column`` (the quantize
    kernel's layout: 16-byte chunk ``chunk`` of row ``column`` at ``sq_position``)."""
    return column * TILE_ROWS + sq_position(column, chunk) * 16 + byte


def _byte(word, i: int) -> Uint32:
    return (word >> Uint32(8 * i)) & Uint32(0xFF)


def _value_bits(values: list, s: int, js, hs=(0, 1)) -> list:
    return [_as_u32(values[_value(s, j, h)]) for j in js for h in hs]


def _inside(tCcD, v, limits, segments):
    """Whether value v of the fragment is inside the limits (rows; columns per segment)."""
    if segments is None:
        return cute.elem_less(tCcD[v], limits)
    b = (v // 4) // SEGMENT_GROUPS  # the segment of column group v // 4 (the fragment layout)
    return (tCcD[v][0] < limits[0]) & (tCcD[v][1] - Int32(SEGMENT_COLS * b) < segments[b][1])


def _segment_column(column, segments):
    """(output column, valid) of tile column ``column`` (a runtime value) with segments."""
    upper = column >= Int32(SEGMENT_COLS)
    local = column - _select(upper, SEGMENT_COLS, 0, Int32)
    start = _select(upper, segments[1][0], segments[0][0], Int32)
    return start + local, local < _select(upper, segments[1][1], segments[0][1], Int32)


def column_keys_to_smem(values: list, lane, warp, sKeys):
    """Q_col's first step: per column k = 2j + h of the thread its two rows' amax keys, reduced
    over the 8 lanes of the column, the lane's 4 keys stored at ``sKeys[warp, lane]``; returns
    (the 4 keys in registers, sKeys as 16-byte words)."""
    # column k = 2j + h of the thread; its two rows (slots) first, then the 8 lanes of the column
    keys = [_amax_keys([_as_u32(values[_value(s, k // 2, k % 2)]) for s in range(2)], False) for k in range(32)]
    keys = _reduce_scatter(keys, lane, column_offsets())  # columns owned_column(lane, r), r = 0..3
    rKeys = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    for r in range(4):
        rKeys[r] = keys[r]
    sKeys4 = cute.zipped_divide(sKeys, (4,))
    cute.autovec_copy(rKeys, sKeys4[None, warp * 32 + lane])
    return rKeys, sKeys4


def quantize_into_sq(values: list, multipliers: list, sQ, lane, warp, e5m2: bool) -> None:
    """Q_col's bytes into ``sQ``, the transposed fp8 tile: value (s, j, h) times the multiplier of
    its thread column k = 2j + h. Column c = 8j + 2 (lane % 4) + h, row 16 warp + lane // 4 + 8s
    is chunk ``warp`` of sQ row c, byte lane // 4 + 8s (64 byte stores a thread, no bank
    conflicts)."""
    sQ8 = cute.recast_tensor(sQ, Uint8)
    for j in range(COLUMN_GROUPS):
        scaled = [values[_value(s, j, h)] * multipliers[2 * j + h] for s in range(2) for h in range(2)]
        word = _fp8x4(*scaled, e5m2)  # bytes (slot 0, h 0), (0, 1), (1, 0), (1, 1)
        column = 8 * j + 2 * (lane % 4)
        for byte in range(4):
            s, h = byte // 2, byte % 2
            sQ8[sq_byte(column + h, warp, lane // 4 + 8 * s)] = Uint8(_byte(word, byte))


# ---------------------------------------------------------------------------------------------
# The tile
# ---------------------------------------------------------------------------------------------


@cute.jit
def quantize_tile_both_ways(
    acc: cute.Tensor,  # (64,) fp32 accumulator fragment (any shape of 64): the values, unmasked
    tCcD: cute.Tensor,  # the fragment's (row, column) tile coordinates (partition_C of an identity)
    thr_mma,  # the thread's slice of the tiled MMA (partitions the row data like the accumulators)
    tidx: Int32,  # consumer thread 0..255
    outputs: tuple,  # (row data (T, N) u8, row scales (T, N/32) u8, col data (N, T) u8, col scales (N, n_blocks) u8)
    smem: tuple,  # (sQ (SQ_WORDS,) u32, 16-byte aligned; sKeys (KEY_WORDS,) u32, 16-byte aligned)
    first_row: Int32,  # the tile's first token row
    col0: Int32,  # the tile's first column in the outputs (a multiple of 32)
    limits: tuple,  # (valid rows (may exceed 128), valid columns (a multiple of 32, may exceed 128))
    col_block0: Int32,  # the compact column-block index of the tile's first 32 rows
    e5m2: bool,
    floor_mode: bool,
    barrier_id: int,
    column_first: bool = False,
    segments: tuple | None = None,  # ((col0_a, valid_a), (col0_b, valid_b)): two 64-column outputs
):
    """Q_row and Q_col of the tile (see the module docstring). Every consumer thread must call it
    (shuffles and named barriers); values outside ``limits`` count as zeros and are not written.

    ``column_first``: trace Q_col's per-column amax keys, their reduce-scatter and the sKeys store
    before Q_row instead of after it (the same operations and results). Left to itself ptxas
    computes the 64 per-value column keys during Q_row's stores, 64 more live registers; first,
    they are reduced to 4 before Q_row starts (FC2 dgrad, which holds a second 64-value half, needs
    that; FC1 keeps the default order).

    ``segments``: the tile's columns [0, 64) are output columns col0_a + c (valid while c <
    valid_a) and its columns [64, 128) output columns col0_b + c - 64 (valid while c - 64 <
    valid_b), e.g. 64 d gate and the 64 matching d up columns of FC2 dgrad's dh; ``col0`` and
    ``limits[1]`` are then unused. Each segment holds 2 whole 32-column blocks and 64 whole
    transposed rows, so the block math is the same; the transposed store runs once per segment."""
    mRowData, mRowScale, mColData, mColScale = outputs
    sQ, sKeys = smem
    lane = tidx % 32
    warp = cute.arch.make_warp_uniform(tidx // 32)
    quad_lane = lane % 4
    valid_rows = cutlass.min(limits[0], Int32(TILE_ROWS))

    # the values, zero outside the limits (Triton: tl.where(mask, values, 0.0))
    values = [cutlass.select_(_inside(tCcD, v, limits, segments), acc[v], Float32(0.0)) for v in range(64)]

    if const_expr(column_first):  # Q_col's warp keys first (see the parameter)
        rKeys, sKeys4 = column_keys_to_smem(values, lane, warp, sKeys)

    # ---- Q_row: blocks of 32 columns of one row, 8 values in each lane of a quad --------------
    row_scales = [Uint32(0)] * 2  # this lane's block (quad_lane) of row slots 0, 1
    for s in cutlass.range_constexpr(2):
        keys = [_amax_keys(_value_bits(values, s, range(4 * b, 4 * b + 4)), False) for b in range(ROW_BLOCKS)]
        key = _reduce_scatter(keys, lane, row_block_offsets())[0]  # block quad_lane
        row_scales[s] = _scale_byte(_amax_of_keys(key, False), e5m2, floor_mode)
    # every lane needs the 8 bytes (2 slots x 4 blocks): gather the quad's words of 2 bytes
    packed = row_scales[0] | (row_scales[1] << Uint32(8))
    quad = [Uint32(cute.arch.shuffle_sync(packed, offset=(lane & Int32(~3)) | Int32(b))) for b in range(ROW_BLOCKS)]
    if const_expr(segments is None):
        gRow = cute.local_tile(cute.domain_offset((first_row, col0), mRowData), (TILE_ROWS, TILE_COLS), (0, 0))
        tCgRow = cute.recast_tensor(thr_mma.partition_C(gRow), Uint16)  # one 16-bit word per column pair
        tCgRows = (tCgRow, tCgRow)
    else:  # tile column c of segment b at output column segments[b][0] + c - 64 b
        tCgRows = tuple(cute.recast_tensor(thr_mma.partition_C(cute.local_tile(
            cute.domain_offset((first_row, segments[b][0] - SEGMENT_COLS * b), mRowData), (TILE_ROWS, TILE_COLS),
            (0, 0))), Uint16) for b in range(2))
    for s in cutlass.range_constexpr(2):
        for j2 in cutlass.range_constexpr(COLUMN_GROUPS // 2):  # column groups 2 j2, 2 j2 + 1 (one block)
            j = 2 * j2
            tCgRow = tCgRows[j2 // (SEGMENT_GROUPS // 2)]  # segments: the one of groups j, j + 1
            multiplier = _multiplier(_byte(quad[j // 4], s))
            word = _quantize([values[_value(s, jj, h)] for jj in (j, j + 1) for h in (0, 1)], multiplier, e5m2)[0]
            for half in cutlass.range_constexpr(2):
                pair = 2 * (j + half) + s  # the pair index of (slot s, group j + half)
                if _inside(tCcD, 2 * pair, limits, segments):
                    tCgRow[pair] = Uint16(word >> Uint32(16 * half))
        row = tCcD[_value(s, 0, 0)][0]
        if const_expr(segments is None):
            if row < limits[0] and quad_lane * BLOCK_SIZE < limits[1]:
                mRowScale[first_row + row, col0 // BLOCK_SIZE + quad_lane] = Uint8(row_scales[s])
        else:
            block_column, block_valid = _segment_column(quad_lane * BLOCK_SIZE, segments)
            if row < limits[0] and block_valid:
                mRowScale[first_row + row, block_column // BLOCK_SIZE] = Uint8(row_scales[s])

    # ---- Q_col: blocks of 32 rows of one column, 16 in each of two warps ----------------------
    if const_expr(not column_first):
        rKeys, sKeys4 = column_keys_to_smem(values, lane, warp, sKeys)
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=CONSUMER_THREADS)  # A: sKeys complete
    rOther = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    cute.autovec_copy(sKeys4[None, (warp ^ Int32(1)) * 32 + lane], rOther)
    block = warp // 2  # the tile's 32-row block of this warp
    column_scales = [Uint32(0)] * 4
    for r in cutlass.range_constexpr(4):
        column_scales[r] = _scale_byte(_amax_of_keys(cutlass.max(rKeys[r], rOther[r]), False), e5m2, floor_mode)
    if warp % 2 == 0 and block * BLOCK_SIZE < valid_rows:  # the block's first row is the expert's
        for r in cutlass.range_constexpr(4):
            column = owned_column(lane, r)
            if const_expr(segments is None):
                if column < limits[1]:
                    mColScale[col0 + column, col_block0 + block] = Uint8(column_scales[r])
            else:
                out_column, column_valid = _segment_column(column, segments)
                if column_valid:
                    mColScale[out_column, col_block0 + block] = Uint8(column_scales[r])
    packed = column_scales[0] | (column_scales[1] << Uint32(8)) | (column_scales[2] << Uint32(16)) \
        | (column_scales[3] << Uint32(24))
    words = _all_gather([packed], lane, column_offsets()[::-1])  # word q: bytes of columns k = 4q .. 4q + 3
    quantize_into_sq(values, [_multiplier(_byte(words[k // 4], k % 4)) for k in range(32)], sQ, lane, warp, e5m2)
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=CONSUMER_THREADS)  # B: sQ complete
    if const_expr(segments is None):
        store_transposed(sQ, mColData, tidx, col0, first_row, valid_rows, col0 + limits[1])
    else:  # sQ rows [64 b, 64 b + 64) -> output rows segments[b][0] + [0, valid_b); the second from a
        # view of sQ at row 64 (the same swizzle: sq_position depends on (k >> 1) & 7), whose rows
        # past 64 are skipped, as the first call skips its rows past 64
        for b in cutlass.range_constexpr(2):
            sQb = cute.make_tensor(sQ.iterator + b * SEGMENT_COLS * TILE_ROWS // 4, cute.make_layout(SQ_WORDS))
            start, valid = segments[b]
            store_transposed(sQb, mColData, tidx, start, first_row, valid_rows,
                             start + cutlass.min(valid, Int32(SEGMENT_COLS)))


# ---------------------------------------------------------------------------------------------
# Host side: the output arguments of a kernel with this epilogue (FC1's a, FC2 dgrad's dh)
# ---------------------------------------------------------------------------------------------


def output_arguments(tokens: int, cols: int, experts: int, element_format: ElementFormat | None,
                     device: torch.device) -> tuple[QuantizeBuffers | None, tuple]:
    """(buffers, outputs): the kernel's five output arguments (bf16 (T, cols); Q_row's data and
    scales; Q_col's data and scales), allocated. ``element_format`` None: no buffers, the bf16
    tensor and four Nones; else the compact buffers of Q_row and Q_col (their unused columnwise
    scale columns 0, as the Triton launchers leave them) and None then their data as uint8 and
    their scales."""
    if element_format is None:
        return None, (torch.empty(tokens, cols, dtype=torch.bfloat16, device=device), None, None, None, None)
    buffers = compact_buffers(tokens, cols, experts, element_format, device)
    return buffers, (None, buffers.row_data.view(torch.uint8), buffers.row_scales, buffers.col_data.view(torch.uint8),
                     buffers.col_scales)


def fake_outputs(rows, cols, starts, quantized: bool) -> tuple:
    """Symbolic stand-ins of ``output_arguments`` and of the expert block starts that the
    quantized outputs need: (block_start, outputs), block_start an (E + 1,) int32 (``starts``
    values) or None. The fp8 bytes and scales as uint8; Q_col's (cols, T) rows any T (its stores
    need 1-byte aligned rows)."""
    if not quantized:
        return None, (fake_matrix(BFloat16, rows, cols), None, None, None, None)
    block_start = fake_vector(Int32, starts)
    row_data = fake_matrix(Uint8, rows, cols, divisibility=BLOCK_SIZE)
    row_scales = fake_matrix(Uint8, rows, cute.sym_int(), divisibility=1, align=1)
    col_data = fake_matrix(Uint8, cols, rows, divisibility=1)
    col_scales = fake_matrix(Uint8, cols, cute.sym_int(), divisibility=1, align=1)
    return block_start, (None, row_data, row_scales, col_data, col_scales)
