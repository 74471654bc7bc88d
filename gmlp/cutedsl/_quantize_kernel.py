"""CuTeDSL kernel of the fused MXFP8 quantization (jit code only; the launcher is ``quantize.py``).

Spec: ``gmlp.mxfp8.spec`` (block math) and ``gmlp.mxfp8.scale_layout`` (where each scale byte lives).

One CTA of 256 threads owns a tile of 128 token rows x 128 K columns:

- its 128 rows are one 128-row tile of one expert (``tile_start[g] <= blockIdx.x < tile_start[g+1]``),
  rows past the expert's end masked as zeros; so its 4 columnwise blocks of 32 rows start at the
  expert's first row + 128 * local tile and never cross experts;
- its 128 columns are 4 rowwise blocks: one column of 128 x 4 swizzled scale tiles.

Hence every CTA writes exactly one 512-byte swizzled rowwise scale tile and one 512-byte swizzled
columnwise scale tile, padding included (masked rows/columns have amax 0, scale byte 0x00); CTAs
past the last expert's tiles write the zero tiles of the padding. Every scale byte is written.

Dataflow (x read once, coalesced; values handled as raw 32-bit words: a bf16 pair or one fp32):
1. gmem -> sX (smem) with 16-byte cp.async that bypass L1 (a warp copies 512 contiguous bytes
   per step; masked chunks are zero-filled), then one barrier.
2. rowwise, from sX: thread (row lr = tid / 8, column group cg = tid % 8) takes 16 consecutive
   values of rows lr, lr + 32, lr + 64, lr + 96 (4 passes); a 1x32 block is held by 2 lanes, amax
   by one xor-shuffle; each lane stores its 16 fp8 bytes with one 16-byte store (a warp writes
   four full 128-byte row runs).
3. columnwise, from sX: thread (column pair cp = tid % 64, block b = tid / 64) reads 32 rows x 2
   columns (a warp reads one 128- or 256-byte run per row), quantizes the two 32x1 blocks and
   writes their 2 x 32 fp8 bytes into sQ, the transposed (K-major) fp8 tile.
4. sQ -> gmem (after a barrier): 8 lanes per K row write the row's (up to) 128 bytes as 16-byte
   chunks aligned in global memory. Expert starts (and T) need not be multiples of 16: a row's
   first byte sits at d = address % 16, so each aligned chunk is assembled from two smem chunks
   by a byte funnel shift (prmt); full chunks take one 16-byte store, partial head/tail chunks
   byte stores.
One CTA per work item (tile, chunk), chunk fastest, built for 4 resident CTAs per SM (bf16: 64
registers, ~51.5 KB of shared memory each). (Persistent grids, with or without prefetching the
next tile into a second sX buffer, measured slower on the H200 and were removed.)
Scale bytes are staged in smem (512 bytes per orientation) and stored as 16-byte chunks. Both
smem tiles xor-permute their 16-byte chunks so that no step has shared-memory bank conflicts
(``sx_position``, ``sq_position``).

The block amax works on integer keys of the magnitude bits (|x| bits compare like integers),
built so that NaNs sort below 0 (the spec ignores NaN): two integer ops and a packed max.s16x2
per bf16 pair, two per fp32 value; see ``_amax_keys``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint8, Uint32, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import arith, llvm, nvvm
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import T, dsl_user_op

TILE_ROWS = 128  # token rows per CTA: one 128-row scale tile, 4 columnwise blocks
TILE_COLS = 128  # K columns per CTA: 4 rowwise blocks, one column of swizzled scale tiles
NUM_THREADS = 256
BLOCK = 32  # elements per scale block (gmlp.mxfp8.spec.BLOCK_SIZE)
VEC = 16  # consecutive K values per thread and pass of the rowwise step (32 B of bf16, 64 B of fp32)
COL_GROUPS = TILE_COLS // VEC  # 8 threads per tile row in the rowwise step
ROWS_PER_PASS = NUM_THREADS // COL_GROUPS  # 32
PASSES = TILE_ROWS // ROWS_PER_PASS  # 4
LANES_PER_BLOCK = BLOCK // VEC  # 2 lanes share one rowwise block
COL_PAIRS = TILE_COLS // 2  # threads per 32-row band in the columnwise step, 2 columns each
CHUNKS = TILE_ROWS // 16  # 16-byte chunks per transposed fp8 row of sQ (8)
ROWS_PER_STORE_PASS = NUM_THREADS // CHUNKS  # 32 K rows written per store pass
SCALE_TILE_BYTES = 512  # one 128 x 4 swizzled scale tile
SMEM_PER_SM = 228 * 1024  # bytes of shared memory per SM (SM90 and SM100)
RESERVED_SMEM_PER_CTA = 1024  # bytes the driver reserves per resident CTA
OCCUPANCY = 4  # CTAs per SM the register budget is sized for, at most what shared memory allows

FP32_INF = 0x7F800000  # bits of +inf; larger magnitude bits are NaNs


# ---------------------------------------------------------------------------------------------
# Index math (plain integer expressions: the same functions serve the kernel and the tests)
# ---------------------------------------------------------------------------------------------


def stage_offset(i, j, swizzle: bool):
    """Offset of scale (i, j) of a 128 x 4 tile (i: row of the scale matrix, j: block column) in
    its 512-byte staging: the swizzled in-tile offset (i % 32) * 16 + (i // 32) * 4 + j, or
    compact i * 4 + j."""
    if swizzle:
        return (i % 32) * 16 + (i // 32) * 4 + j
    return i * 4 + j


def rowwise_scale_tile(tile, chunk, num_chunks):
    """Index of the 512-byte swizzled rowwise scale tile of CTA (tile, chunk): tile row `tile`
    (expert tiles are consecutive from tile_start[g]), tile column `chunk` of ceil(K/128)."""
    return tile * num_chunks + chunk


def columnwise_scale_tile(tile_base, expert_tiles, local_tile, chunk, num_chunks):
    """Index of the 512-byte swizzled columnwise scale tile of CTA (tile, chunk): expert g's own
    (K, ceil(m_g/32)) swizzled matrix starts at byte ceil(K/128)*128*4 * tile_start[g] =
    tile_base * num_chunks * 512, and has `expert_tiles` tile columns; this CTA is its tile row
    `chunk` (128 K rows), tile column `local_tile` (4 blocks of 32 tokens)."""
    return tile_base * num_chunks + chunk * expert_tiles + local_tile


def sx_position(c, chunks_per_thread):
    """Position of 16-byte chunk c of a tile row in sX (a row holds 16 chunks of bf16 or 32 of
    fp32). The xor of c's low bits with its bits 3.. spreads the 8 lanes of one 16-byte load phase
    of the rowwise step (chunks c = n * cg + i, cg = 0..7, n = chunks_per_thread = 2 or 4) over
    the 8 bank groups; it permutes chunks within each aligned group of 8, so the columnwise
    step's row reads (128 or 256 contiguous bytes) stay conflict-free."""
    return c ^ ((c >> 3) & (chunks_per_thread - 1))


def sq_position(k, c):
    """Position of logical 16-byte chunk c of K row k in sQ. The xor spreads the 8 lanes of one
    16-byte store phase of the columnwise step (rows k = 2cp, cp = 8m .. 8m+7) over the 8 bank
    groups, and keeps the 8 chunks of one row a permutation for the store step's reads."""
    return c ^ ((k >> 1) & 7)


# ---------------------------------------------------------------------------------------------
# Scalar device helpers (trace inline)
# ---------------------------------------------------------------------------------------------


@dsl_user_op
def _as_f32(bits, *, loc=None, ip=None) -> Float32:
    return Float32(arith.bitcast(T.f32(), bits.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _as_u32(value: Float32, *, loc=None, ip=None) -> Uint32:
    return Uint32(arith.bitcast(T.i32(), Float32(value).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def _pure_asm_u32(asm: str, *operands, loc=None, ip=None) -> Uint32:
    """A side-effect-free inline PTX instruction on 32-bit registers ($0 the result)."""
    values = [Uint32(v).ir_value(loc=loc, ip=ip) for v in operands]
    constraints = ",".join(["=r"] + ["r"] * len(values))
    return Uint32(llvm.inline_asm(T.i32(), values, asm, constraints, has_side_effects=False,
                                  is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


def _max_s16x2(a, b) -> Uint32:
    return _pure_asm_u32("max.s16x2 $0, $1, $2;", a, b)


def _prmt(a, b, selector) -> Uint32:
    """Bytes of (b:a) picked by the selector's nibbles (byte 0..3 of a, 4..7 of b)."""
    return _pure_asm_u32("prmt.b32 $0, $1, $2, $3;", a, b, selector)


def _select(cond, if_value, else_value, dtype=Uint32):
    return dtype(cutlass.select_(cond, dtype(if_value), dtype(else_value)))


@dsl_user_op
def _fp8x4(a: Float32, b: Float32, c: Float32, d: Float32, e5m2: bool, *, loc=None, ip=None) -> Uint32:
    """Four fp32 -> four fp8 bytes, ``a`` in the low byte: cvt.rn.satfinite.{e4m3,e5m2}x2.f32
    (round to nearest even, saturate to +-max_normal, NaN -> 0x7F)."""
    fp8_type = cutlass.Float8E5M2 if e5m2 else cutlass.Float8E4M3FN

    def pair(lo, hi):  # the instruction puts its first source in the high byte
        packed = nvvm.convert_f32x2_to_f8x2(
            ir.VectorType.get([2], cutlass.Int8.mlir_type),
            Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip),
            ir.TypeAttr.get(fp8_type.mlir_type),
            rnd=nvvm.FPRoundingMode.RN, sat=nvvm.SaturationMode.SATFINITE, loc=loc, ip=ip,
        )
        return llvm.zext(T.i32(), llvm.bitcast(T.i16(), packed, loc=loc, ip=ip), loc=loc, ip=ip)

    low, high = pair(a, b), pair(c, d)
    high = llvm.shl(high, Int32(16).ir_value(loc=loc, ip=ip), llvm.IntegerOverflowFlags.none, loc=loc, ip=ip)
    return Uint32(llvm.or_(low, high, loc=loc, ip=ip))


def _elem_address(tensor: cute.Tensor, row, col) -> Int64:
    """Global address of tensor[row, col]."""
    return (tensor.iterator + cute.crd2idx((row, col), tensor.layout)).toint()


def _values(word, bf16: bool):
    """fp32 values of one raw word: a bf16 pair (low half first) or one fp32."""
    if bf16:
        return [_as_f32(word << 16), _as_f32(word & Uint32(0xFFFF0000))]
    return [_as_f32(word)]


def _amax_keys(words, bf16: bool) -> Uint32:
    """Max of the NaN-aware amax keys of every value in ``words`` (raw bf16 pairs or fp32).

    The spec ignores NaN; the keys make that explicit and branch-free. A key is the magnitude
    shifted so that every NaN pattern lands below the key of 0:
    - bf16 half x: key = (x & 0x7FFF) + 0x7F as a signed 16-bit value: |x| <= inf gives
      0x7F .. 0x7FFF, a NaN (magnitude 0x7F81 .. 0x7FFF) gives a negative key; packed per word
      (no carry crosses the halves: 0x7FFF + 0x7F < 0x10000), reduced with max.s16x2;
    - fp32 x: key = 2 * x + 0xFFFFFF mod 2**32 (the doubling drops the sign): |x| <= inf gives
      0xFFFFFF .. 0xFFFFFFFF, a NaN wraps to 1 .. 0xFFFFFD; reduced with an unsigned max.
    """
    if bf16:
        result = (words[0] & Uint32(0x7FFF7FFF)) + Uint32(0x007F007F)
        for w in words[1:]:
            result = _max_s16x2(result, (w & Uint32(0x7FFF7FFF)) + Uint32(0x007F007F))
        return result
    result = (words[0] << 1) + Uint32(0xFFFFFF)
    for w in words[1:]:
        result = cutlass.max(result, (w << 1) + Uint32(0xFFFFFF))
    return result


def _amax_of_keys(keys: Uint32, bf16: bool, half=None) -> Uint32:
    """fp32 bits of the NaN-ignoring amax from reduced keys (0 when every value is NaN).
    bf16: ``half`` 0 / 1 decodes the low / high half only, None the max of both."""
    if bf16:
        halves = {0: Int32(keys << 16) >> 16, 1: Int32(keys) >> 16}  # sign-extended 16-bit keys
        key = halves[half] if half is not None else cutlass.max(halves[0], halves[1])
        return _select(key >= Int32(0x7F), Uint32(key - Int32(0x7F)) << 16, 0)
    return _select(keys >= Uint32(0xFFFFFF), (keys - Uint32(0xFFFFFF)) >> 1, 0)


def _scale_byte(amax: Uint32, e5m2: bool, floor_mode: bool) -> Uint32:
    """E8M0 byte of a block from its amax bits, 0 <= amax <= inf (gmlp.mxfp8.spec.e8m0_from_amax).

    RCEIL: v = amax * fp32(1 / max_normal) (a multiply by the fp32 constant, not a division);
    e = ceil(log2(v)) from v's bits, in integer form: (bits + 0x7FFFFF) >> 23 is the exponent
    plus one when the mantissa is not 0, i.e. the spec's round-up; min(., 254) is its saturation
    at 0xFE (also +inf -> 254); v at or below 2**-127 (bits <= 0x400000) gives 0.
    FLOOR: e = clamp(exponent(amax) - emax, 0, 254), +inf -> 254.
    NaN (byte 255) cannot occur: the amax ignores NaN.
    """
    if floor_mode:
        emax = Uint32(15 if e5m2 else 8)
        exponent = amax >> 23  # biased floor(log2(amax)) for normals; 0 for subnormals and 0
        e = _select(exponent > emax, exponent - emax, 0)
        return _select(amax == Uint32(FP32_INF), 254, e)  # finite amax: e <= 254 - emax
    reciprocal = Float32(1.0 / 57344.0) if e5m2 else Float32(1.0 / 448.0)
    bits = _as_u32(_as_f32(amax) * reciprocal)
    e = cutlass.min((bits + Uint32(0x7FFFFF)) >> 23, Uint32(254))
    return _select(bits > Uint32(0x400000), e, 0)


def _multiplier(e: Uint32) -> Float32:
    """fp32 2**(127 - e) (gmlp.mxfp8.spec.quantize_multiplier): 254 -> the subnormal 2**-127 (bits
    0x00400000; the multiply keeps subnormals), 255 -> NaN."""
    bits = (Uint32(254) - e) << 23
    bits = _select(e == Uint32(254), 0x00400000, bits)
    bits = _select(e == Uint32(255), 0x7FC00000, bits)
    return _as_f32(bits)


def _quantize(values, s: Float32, e5m2: bool):
    """fp8 bytes of ``values * s`` (4k fp32 values), 4 per word, first value in the low byte."""
    scaled = [v * s for v in values]  # mul.rn.f32, no flush to zero
    return [_fp8x4(*scaled[i : i + 4], e5m2) for i in range(0, len(scaled), 4)]


def _funnel(lo, hi, d: Int32):
    """Bytes 16 - d .. 31 - d of the 32 bytes lo ++ hi (4 words each), for d in 1..15.

    Result word w starts at byte s + 4w, s = 16 - d: in source word sh + w (sh = s // 4), at
    byte o = s % 4. Select the 5 source words (sh is dynamic), then one prmt per result word.
    """
    words = list(lo) + list(hi) + [Uint32(0)] * 4
    s = Int32(16) - d
    sh = s >> 2
    o = s & Int32(3)
    window = []
    for m in range(5):
        w = words[m + 4]
        for shift in (3, 2, 1, 0):
            w = _select(sh == Int32(shift), words[m + shift], w)
        window.append(w)
    selector = Uint32(0x3210) + Uint32(o) * Uint32(0x1111)  # bytes o .. o+3 of (window[w+1]:window[w])
    return [_prmt(window[w], window[w + 1], selector) for w in range(4)]


# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------


class QuantizeMXFP8Kernel:
    """Fused rowwise + columnwise MXFP8 quantization of x (T, K), grouped by expert or not.

    Compile-time configuration (one compiled kernel each): input dtype, which orientations,
    swizzled or compact scales, grouped, E5M2 instead of E4M3, FLOOR instead of RCEIL. One CTA
    per work item (see the module docstring).
    """

    def __init__(self, dtype, *, rowwise: bool, columnwise: bool, swizzle: bool, grouped: bool,
                 e5m2: bool, floor_mode: bool):
        assert dtype in (cutlass.BFloat16, cutlass.Float32), f"{dtype=} not supported"
        assert rowwise or columnwise, f"{rowwise=}, {columnwise=}: nothing to do"
        self.dtype = dtype
        self.bf16 = dtype is cutlass.BFloat16
        self.words = VEC * dtype.width // 32  # raw 32-bit words per load vector: 8 or 16
        self.pair_words = 2 * dtype.width // 32  # words per column pair of a row: 1 or 2
        self.chunks_per_thread = VEC * dtype.width // 128  # 16-byte chunks per rowwise pass: 2 or 4
        self.rowwise = rowwise
        self.columnwise = columnwise
        self.swizzle = swizzle
        self.grouped = grouped
        self.e5m2 = e5m2
        self.floor_mode = floor_mode
        # CTAs per SM the register budget must allow, at most what shared memory allows
        # (smem_bytes: bf16 up to ~51.5 KB -> 4 on a 228 KB SM, i.e. 64 registers; fp32 up to
        # ~83 KB -> 2).
        self.min_blocks_per_sm = max(1, min(OCCUPANCY, SMEM_PER_SM // self.smem_bytes()))

    def smem_bytes(self) -> int:
        """Shared memory of one CTA (with 128 bytes of alignment slack per buffer)."""
        total = TILE_ROWS * TILE_COLS * self.dtype.width // 8 + 128
        total += self.rowwise * (SCALE_TILE_BYTES + 16) + self.columnwise * (TILE_COLS * TILE_ROWS + 128 + SCALE_TILE_BYTES + 16)
        return total + self.grouped * 48 + RESERVED_SMEM_PER_CTA

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,  # (T, K) bf16/fp32, row-major, 16-byte aligned
        mRowData: cute.Tensor | None,  # (T, K) uint8: fp8 bytes
        mRowScale: cute.Tensor | None,  # swizzled (n_tiles * n_chunks * 512,) or compact (T, K/32)
        mColData: cute.Tensor | None,  # (K, T) uint8: fp8 bytes, transposed
        mColScale: cute.Tensor | None,  # swizzled (n_tiles * n_chunks * 512,) or compact (K, n_blocks)
        mRowStart: cute.Tensor | None,  # (E + 1,) int32: sum_{h<g} m_h (grouped)
        mTileStart: cute.Tensor | None,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 128) (grouped)
        mBlockStart: cute.Tensor | None,  # (E + 1,) int32: sum_{h<g} ceil(m_h / 32) (grouped, compact col)
        stream,
    ):
        num_rows, num_cols = mX.shape
        if const_expr(self.grouped):
            # max_row_tiles(T, E): a bound of sum_g ceil(m_g / 128) that needs no host sync.
            num_tiles = (num_rows + (TILE_ROWS - 1) * (mTileStart.shape[0] - 1)) // TILE_ROWS
        else:
            num_tiles = (num_rows + TILE_ROWS - 1) // TILE_ROWS
        num_chunks = (num_cols + TILE_COLS - 1) // TILE_COLS
        # Work items (tile, chunk), chunk fastest: the CTAs running together read whole rows of x
        # and write whole row runs of both outputs. One CTA per item.
        grid = num_tiles * num_chunks
        self.kernel(mX, mRowData, mRowScale, mColData, mColScale, mRowStart, mTileStart, mBlockStart).launch(
            grid=[grid, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream,
            min_blocks_per_mp=self.min_blocks_per_sm,
            preferred_smem_carveout=100,  # percent: all of L1/smem as smem (also: no device query)
        )

    @cute.kernel
    def kernel(
        self,
        mX: cute.Tensor,
        mRowData: cute.Tensor | None,
        mRowScale: cute.Tensor | None,
        mColData: cute.Tensor | None,
        mColScale: cute.Tensor | None,
        mRowStart: cute.Tensor | None,
        mTileStart: cute.Tensor | None,
        mBlockStart: cute.Tensor | None,
    ):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        num_rows, num_cols = mX.shape
        num_chunks = (num_cols + TILE_COLS - 1) // TILE_COLS

        smem = cutlass.memory.SmemAllocator()
        # sX: the x tile, 128 rows of chunks_per_row 16-byte chunks, chunk c of row r at position
        # sx_position(c) of the row; sQ: the transposed fp8 tile, 128 K rows of 8 16-byte chunks,
        # chunk c of row k at position sq_position(k, c).
        sX = smem.allocate_tensor(self.dtype, cute.make_layout(TILE_ROWS * TILE_COLS), 128)
        sRowScale = sQ = sColScale = sInfo = None
        if const_expr(self.rowwise):
            sRowScale = smem.allocate_tensor(Uint8, cute.make_layout(SCALE_TILE_BYTES), 16)
        if const_expr(self.columnwise):
            sQ = smem.allocate_tensor(Uint32, cute.make_layout(TILE_COLS * CHUNKS * 4), 128)
            sColScale = smem.allocate_tensor(Uint8, cute.make_layout(SCALE_TILE_BYTES), 16)
        if const_expr(self.grouped):
            sInfo = smem.allocate_tensor(Int32, cute.make_layout(8), 16)
        starts = (mRowStart, mTileStart, mBlockStart)
        outputs = (mRowData, mRowScale, mColData, mColScale)
        staging = (sRowScale, sQ, sColScale)

        # Barriers (A: in _locate, grouped only; B, C: below and in _process):
        #   [A: sInfo written -> read] load (cp.async) ... wait own copies, [B: sX complete]
        #   rowwise + columnwise (read sX, write sQ and scale stagings) [C: staging complete]
        #   stores (read sQ and stagings)
        info = self._locate(starts, sInfo, bid // num_chunks, num_rows, tid)
        self._load(mX, sX, info, (bid % num_chunks) * TILE_COLS, tid)
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()  # B: sX complete (every thread waited for its own copies)
        self._process(sX, staging, outputs, bid, num_chunks, info, num_cols, tid)

    # -----------------------------------------------------------------------------------------

    @cute.jit
    def _locate(self, starts, sInfo, tile, num_rows, tid):
        """The rows row tile `tile` owns: (row0, valid_rows, tile_base, expert_tiles, block0).

        row0: first token row; valid_rows: rows of the expert in this tile (1..128; 0 for the
        padding tiles past the last expert); tile_base, expert_tiles: the expert's first tile
        and tile count; block0: the tile's first compact column block. Grouped: every thread
        returns the values one thread found (through sInfo, with a barrier, A).
        """
        mRowStart, mTileStart, mBlockStart = starts
        if const_expr(self.grouped):
            num_experts = mTileStart.shape[0] - 1
            if tid == 0:
                if tile >= mTileStart[num_experts]:
                    # A padding tile: it writes zero scale tiles (its own slot of the padding).
                    sInfo[0] = Int32(0)
                    sInfo[1] = Int32(0)
                    sInfo[2] = tile
                    sInfo[3] = Int32(1)
                    sInfo[4] = Int32(0)
            # Each thread tests one expert per step; exactly one thread matches a real tile
            # (empty experts have tile_start[g] == tile_start[g + 1] and never match).
            for base in range(0, num_experts, NUM_THREADS):
                g = base + tid
                if g < num_experts:
                    t0 = mTileStart[g]
                    t1 = mTileStart[g + 1]
                    if t0 <= tile and tile < t1:
                        r0 = mRowStart[g]
                        r1 = mRowStart[g + 1]
                        b0 = Int32(0)
                        if const_expr(mBlockStart is not None):
                            b0 = mBlockStart[g]
                        local = tile - t0
                        sInfo[0] = r0 + local * TILE_ROWS
                        sInfo[1] = cutlass.min(r1 - r0 - local * TILE_ROWS, Int32(TILE_ROWS))
                        sInfo[2] = t0
                        sInfo[3] = t1 - t0
                        sInfo[4] = b0 + local * (TILE_ROWS // BLOCK)
            cute.arch.sync_threads()  # A: sInfo written by one thread, read by all
            return sInfo[0], sInfo[1], sInfo[2], sInfo[3], sInfo[4]
        else:
            row0 = tile * TILE_ROWS
            valid_rows = cutlass.min(num_rows - row0, Int32(TILE_ROWS))
            expert_tiles = (num_rows + TILE_ROWS - 1) // TILE_ROWS
            return row0, valid_rows, Int32(0), expert_tiles, tile * (TILE_ROWS // BLOCK)

    @cute.jit
    def _load(self, mX: cute.Tensor, sX: cute.Tensor, info, col0: Int32, tid: Int32):
        """x tile -> sX: 16-byte cp.async (L2 only, no register staging), coalesced: a warp
        copies 512 contiguous bytes per step. Masked rows/columns are zeros (plain smem stores):
        amax 0, scale 0x00. The caller commits the group and waits for it."""
        row0, valid_rows, _, _, _ = info
        num_cols = mX.shape[1]
        elems16 = 128 // self.dtype.width  # elements per 16-byte chunk: 8 or 4
        chunks_per_row = TILE_COLS // elems16  # 16 or 32
        rows_per_step = NUM_THREADS // chunks_per_row  # 16 or 8
        steps = TILE_ROWS // rows_per_step
        first_row = tid // chunks_per_row
        c = tid % chunks_per_row
        # This thread's chunks: rows first_row + rows_per_step * step, chunk c (16-byte aligned).
        src = cute.make_tensor(
            cute.make_ptr(self.dtype, _elem_address(mX, row0 + first_row, col0 + c * elems16),
                          cute.AddressSpace.gmem, assumed_align=16),
            cute.make_layout((elems16, steps), stride=(1, rows_per_step * mX.stride[0])),
        )
        sX16 = cute.zipped_divide(sX, (elems16,))
        g2s = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), self.dtype,
                                  num_bits_per_copy=128)
        rZero = cute.make_rmem_tensor(cute.make_layout(elems16), self.dtype)
        rZero.fill(0)
        col_in = col0 + c * elems16 < num_cols  # K % 32 == 0: a chunk is all in or all out
        for step in cutlass.range_constexpr(steps):
            r = step * rows_per_step + first_row
            dst = sX16[None, r * chunks_per_row + sx_position(c, self.chunks_per_thread)]
            if col_in and r < valid_rows:
                cute.copy(g2s, src[None, step], dst)
            else:
                cute.autovec_copy(rZero, dst)

    @cute.jit
    def _process(self, sX: cute.Tensor, staging, outputs, item: Int32, num_chunks: Int32, info,
                 num_cols: Int32, tid: Int32):
        """Work item `item` from its complete x tile in sX: quantize, stage, barrier C, store."""
        sRowScale, sQ, sColScale = staging
        mRowData, mRowScale, mColData, mColScale = outputs
        row0, valid_rows, tile_base, expert_tiles, block0 = info
        tile = item // num_chunks
        chunk = item - tile * num_chunks
        col0 = chunk * TILE_COLS
        chunks_per_row = TILE_COLS * self.dtype.width // 128
        sXw = cute.recast_tensor(sX, Uint32)

        # ---- 2. rowwise: 1x32 blocks along K. Thread (lr, cg): VEC values of rows lr + 32p ------
        lr = tid // COL_GROUPS
        cg = tid % COL_GROUPS
        if const_expr(self.rowwise):
            sX4 = cute.zipped_divide(sXw, (4,))  # 16-byte chunks
            rX = cute.make_rmem_tensor(cute.make_layout((4, self.chunks_per_thread)), Uint32)
            # This thread's 16 fp8 bytes of rows lr + 32p (16-byte aligned: K % 32 == 0).
            gRowData = cute.make_tensor(
                cute.make_ptr(Uint8, _elem_address(mRowData, row0 + lr, col0 + cg * VEC), cute.AddressSpace.gmem,
                              assumed_align=16),
                cute.make_layout((VEC, PASSES), stride=(1, ROWS_PER_PASS * mRowData.stride[0])),
            )
            rQ = cute.make_rmem_tensor(cute.make_layout(VEC), Uint8)
            rQw = cute.recast_tensor(rQ, Uint32)
            j = cg // LANES_PER_BLOCK  # block column within the tile
            col_ok = col0 + cg * VEC < num_cols  # K % 32 == 0: VEC values are all in or all out
            for p in cutlass.range_constexpr(PASSES):
                r = p * ROWS_PER_PASS + lr
                for i in cutlass.range_constexpr(self.chunks_per_thread):
                    position = sx_position(cg * self.chunks_per_thread + i, self.chunks_per_thread)
                    cute.autovec_copy(sX4[None, r * chunks_per_row + position], rX[None, i])
                words = [rX[w % 4, w // 4] for w in range(self.words)]
                amax = _amax_of_keys(_amax_keys(words, self.bf16), self.bf16)
                # The 2 lanes of a block are lanes 2q, 2q+1 of the warp (same row).
                amax = cutlass.max(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
                e = _scale_byte(amax, self.e5m2, self.floor_mode)
                values = [v for w in words for v in _values(w, self.bf16)]
                quantized = _quantize(values, _multiplier(e), self.e5m2)
                for w in cutlass.range_constexpr(VEC // 4):
                    rQw[w] = quantized[w]
                if col_ok and r < valid_rows:
                    cute.autovec_copy(rQ, gRowData[None, p])
                if cg % LANES_PER_BLOCK == 0:
                    sRowScale[stage_offset(r, j, self.swizzle)] = Uint8(e)

        # ---- 3. columnwise: 32x1 blocks along T, from sX --------------------------------------
        if const_expr(self.columnwise):
            self._quantize_columns(sXw, sQ, sColScale, tid)

        cute.arch.sync_threads()  # C: sQ and both scale stagings complete

        # ---- 4. stores of the staged scales and of the transposed data -----------------------
        if const_expr(self.rowwise):
            if const_expr(self.swizzle):
                if tid < SCALE_TILE_BYTES // 16:
                    self._copy16(sRowScale, tid, mRowScale, rowwise_scale_tile(tile, chunk, num_chunks) * 32 + tid)
            else:
                if tid < valid_rows:  # row tid of the tile, its (up to) 4 blocks
                    for jj in cutlass.range_constexpr(TILE_COLS // BLOCK):
                        if col0 + jj * BLOCK < num_cols:
                            scale = sRowScale[stage_offset(tid, jj, False)]
                            mRowScale[row0 + tid, chunk * (TILE_COLS // BLOCK) + jj] = scale
        if const_expr(self.columnwise):
            if const_expr(self.swizzle):
                if tid >= 32 and tid < 32 + SCALE_TILE_BYTES // 16:
                    tile_index = columnwise_scale_tile(tile_base, expert_tiles, tile - tile_base, chunk, num_chunks)
                    self._copy16(sColScale, tid - 32, mColScale, tile_index * 32 + tid - 32)
            else:
                if tid >= NUM_THREADS - TILE_COLS:  # K row k of the tile, its (up to) 4 blocks
                    k = tid - (NUM_THREADS - TILE_COLS)
                    if col0 + k < num_cols:
                        for bb in cutlass.range_constexpr(TILE_ROWS // BLOCK):
                            if bb * BLOCK < valid_rows:
                                mColScale[col0 + k, block0 + bb] = sColScale[stage_offset(k, bb, False)]
            store_transposed(sQ, mColData, tid, col0, row0, valid_rows, num_cols)

    # -----------------------------------------------------------------------------------------

    @cute.jit
    def _quantize_columns(self, sXw: cute.Tensor, sQ: cute.Tensor, sColScale: cute.Tensor, tid: Int32):
        """Thread (cp, b): tile columns 2cp, 2cp+1 over rows 32b .. 32b+31 -> 2 x 32 fp8 bytes,
        written as logical chunks 2b, 2b+1 of sQ rows k = 2cp, 2cp+1."""
        cp = tid % COL_PAIRS
        b = tid // COL_PAIRS
        # Column pair cp of a row: pair cp % pairs_per_chunk of chunk cp // pairs_per_chunk.
        pairs_per_chunk = 4 // self.pair_words
        pairs_per_row = TILE_COLS // 2
        sXp = cute.zipped_divide(sXw, (self.pair_words,))
        in_row = sx_position(cp // pairs_per_chunk, self.chunks_per_thread) * pairs_per_chunk + cp % pairs_per_chunk
        rPair = cute.make_rmem_tensor(cute.make_layout(self.pair_words), Uint32)
        rows = []
        for i in cutlass.range_constexpr(BLOCK):
            cute.autovec_copy(sXp[None, (b * BLOCK + i) * pairs_per_row + in_row], rPair)
            rows.append([rPair[w] for w in range(self.pair_words)])
        if const_expr(self.bf16):  # one word per row: (column 2cp, column 2cp+1) in its halves
            keys = _amax_keys([r[0] for r in rows], True)
            amaxes = [_amax_of_keys(keys, True, half) for half in (0, 1)]
            columns = [[_values(r[0], True)[half] for r in rows] for half in (0, 1)]
        else:
            amaxes = [_amax_of_keys(_amax_keys([r[h] for r in rows], False), False) for h in (0, 1)]
            columns = [[_values(r[h], False)[0] for r in rows] for h in (0, 1)]
        sQc = cute.zipped_divide(sQ, (4,))  # 16-byte chunks
        rW = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        for half in cutlass.range_constexpr(2):
            e = _scale_byte(amaxes[half], self.e5m2, self.floor_mode)
            values = columns[half]
            quantized = _quantize(values, _multiplier(e), self.e5m2)
            k = 2 * cp + half
            for c in cutlass.range_constexpr(2):
                for w in cutlass.range_constexpr(4):
                    rW[w] = quantized[4 * c + w]
                cute.autovec_copy(rW, sQc[None, k * CHUNKS + sq_position(k, 2 * b + c)])
            sColScale[stage_offset(k, b, self.swizzle)] = Uint8(e)

    @cute.jit
    def _copy16(self, src: cute.Tensor, src_chunk: Int32, dst: cute.Tensor, dst_chunk: Int32):
        """16-byte chunk src_chunk of smem bytes -> chunk dst_chunk of gmem bytes."""
        src16 = cute.zipped_divide(cute.recast_tensor(src, Uint32), (4,))
        dst16 = cute.zipped_divide(cute.recast_tensor(dst, Uint32), (4,))
        cute.autovec_copy(src16[None, src_chunk], dst16[None, dst_chunk])


# ---------------------------------------------------------------------------------------------
# The transposed store (module level: the SM90 GEMM epilogues reuse it)
# ---------------------------------------------------------------------------------------------


@cute.jit
def store_transposed(sQ, mColData, tid, col0, row0, valid_rows, num_cols):
    """sQ rows -> mColData[col0 + k, row0 : row0 + valid_rows] for the tile's K rows (256 threads,
    tid 0..255; K rows k with col0 + k >= num_cols are skipped). Also the store of the SM90
    GEMM epilogues' columnwise data (``gmlp.cutedsl.sm90._quantize_epilogue``).

    Chunk q (0..8) of K row k covers the 16 aligned global bytes [G - d + 16q, +16), G the
    row's first byte, d = G % 16: tile bytes start = 16q - d .. start + 15, the tail of
    logical chunk q - 1 and the head of chunk q (just chunk q when d == 0). Passes 0..3 write
    chunks 0..7 of 32 rows each (8 lanes per row: 128 contiguous bytes per row); the last pass
    writes chunk 8, which has bytes only when d > 0.
    """
    sQc = cute.zipped_divide(sQ, (4,))
    rLo = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    rHi = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    rOut = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
    # First byte of K row (tid // 8) of the tile; a pass moves 32 K rows down.
    first_row_addr = _elem_address(mColData, col0 + tid // CHUNKS, row0)
    pass_stride = Int64(ROWS_PER_STORE_PASS) * mColData.stride[0]
    for it in cutlass.range_constexpr(TILE_COLS // ROWS_PER_STORE_PASS + 1):
        if const_expr(it < TILE_COLS // ROWS_PER_STORE_PASS):
            k = tid // CHUNKS + it * ROWS_PER_STORE_PASS
            q = tid % CHUNKS
            active = Boolean(True)
        else:
            k = tid
            q = Int32(CHUNKS)
            active = tid < TILE_COLS
        if active and col0 + k < num_cols and valid_rows > 0:
            if const_expr(it < TILE_COLS // ROWS_PER_STORE_PASS):
                row_addr = first_row_addr + Int64(it) * pass_stride  # G
            else:
                row_addr = _elem_address(mColData, col0 + k, row0)
            d = Int32(row_addr & Int64(15))
            start = q * 16 - d
            if start < valid_rows:  # else the chunk holds no byte of the tile
                rLo.fill(0)
                rHi.fill(0)
                if q < CHUNKS:
                    cute.autovec_copy(sQc[None, k * CHUNKS + sq_position(k, q)], rHi)
                if d == 0:
                    for w in cutlass.range_constexpr(4):
                        rOut[w] = rHi[w]
                else:
                    if q > 0:
                        cute.autovec_copy(sQc[None, k * CHUNKS + sq_position(k, q - 1)], rLo)
                    out = _funnel([rLo[w] for w in range(4)], [rHi[w] for w in range(4)], d)
                    for w in cutlass.range_constexpr(4):
                        rOut[w] = out[w]
                if start >= 0 and start + 16 <= valid_rows:
                    chunk_addr = row_addr - Int64(d) + Int64(q * 16)  # 16-byte aligned
                    dst = cute.make_tensor(
                        cute.make_ptr(Uint32, chunk_addr, cute.AddressSpace.gmem, assumed_align=16),
                        cute.make_layout(4),
                    )
                    cute.autovec_copy(rOut, dst)
                else:  # a partial head or tail chunk
                    for i in cutlass.range_constexpr(16):
                        if start + i >= 0 and start + i < valid_rows:
                            byte = (rOut[i // 4] >> (8 * (i % 4))) & Uint32(0xFF)
                            mColData[col0 + k, row0 + start + i] = Uint8(byte)
