"""In-kernel decode of MXFP8 operands for the sm_90a mainloops: the consumer warpgroups turn each
TMA-loaded fp8 k-tile into the bf16 tile their ``wgmma`` reads, so no separate dequantize pass
writes (and the GEMM rereads) a bf16 copy. The token-row kernels (grouped GEMM, FC1, FC2 dgrad)
decode their A (``mma_decoded_k_tiles``); the weight gradient decodes both of its K-major Q_col
operands with ``decode_rows`` and a k-tile mask (``gmlp.cutedsl.sm90.wgrad``).

The values are the Triton dequantize's (``gmlp.triton_ref._dequantize_kernel``), bit for bit:
``bf16(float(q) * 2**(e - 127))`` with the fp32 multiply rounded to nearest, no flush to zero
(``e8m0_to_float``: byte 0 is the subnormal 2**-127). fp8 -> f16 is exact for E4M3 and E5M2, and
f16 -> fp32 is exact, so going through ``cvt.rn.f16x2.{e4m3,e5m2}x2`` changes nothing. The GEMM
that reads the decoded tile therefore equals the bf16 GEMM of the dequantized operand bit for bit.

Layouts (checked against cute's swizzled layouts in tests/cutedsl/sm90/test_decode.py):
- fp8 slot (TMA, one per pipeline stage): 128 rows x 64 bytes, 64B-swizzled: row r's 16-byte
  chunk c (bytes 16c .. 16c + 15) is chunk ``4 r + (c ^ ((r >> 1) & 3))`` of the slot;
- bf16 buffer (the wgmma operand): 128 rows x 64 bf16, 128B-swizzled: row r's 16-byte chunk c
  (elements 8c .. 8c + 7) is chunk ``8 r + (c ^ (r & 7))`` of the buffer.

Work split: each consumer warpgroup decodes the rows its own wgmmas read (all 128 with one
MMA warpgroup, its 64-row half with two): thread t of the warpgroup takes row ``t // P`` of
them and ``4 / P`` consecutive fp8 chunks (P = 1 or 2 threads a row), so a thread's chunks lie
in ``2 / P`` scale blocks. Every lane of a warp reads and writes distinct 16-byte bank groups
per instruction (4 wavefronts per 512 bytes, the minimum).

Ordering, per k-tile i (the slot's full barrier waited):
1. decode slot i into bf16 buffer ``i mod 3`` (``DECODE_BUFFERS``);
2. ``fence.proxy.async`` (generic-proxy stores made visible to the wgmma's async proxy) and a
   named barrier of the warpgroup (every warp's rows written before any warp's wgmma);
3. the wgmmas of k-tile i, then ``wait_group(1)``: those of k-tile i - 1 are complete.
Three buffers make one barrier enough: buffer ``i mod 3`` was last read by k-tile i - 3's
wgmmas, which every warp waited for (at k-tile i - 2) before it passed k-tile i - 1's barrier.
The scale bytes of k-tile i + 1 are loaded while k-tile i is decoded (L1-resident after the
first k-tile: a row's scales are contiguous bytes).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass import BFloat16, Int32, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from gmlp.contract.operands import describe
from gmlp.cutedsl._quantize_kernel import _select
from gmlp.cutedsl.sm90._compile import fake_matrix
from gmlp.cutedsl.sm90._pipeline import THREADS_PER_WARPGROUP, TILE_K, mma_k_tiles
from gmlp.cutedsl.sm90._schedule import TILE_M
from gmlp.mxfp8.spec import ElementFormat
from gmlp.mxfp8.tensor import MXFP8Tensor, QuantAxis

__all__ = [
    "DECODE_BUFFERS", "BLOCK", "BUFFER_BYTES", "FIRST_BARRIER", "buffers_bytes", "barrier_id",
    "decoded_operand", "token_operand", "fake_operand", "fake_token_operand", "Decoder", "make_decoder", "mainloop",
    "buffer_layout", "chunks", "shifted_k_tiles", "shifted_scale_indices", "fp8_chunk", "bf16_chunk", "DecodeSplit",
    "load_scales", "decode_k_tile",
    "decode_rows", "publish", "mma_decoded_k_tiles"
]

DECODE_BUFFERS = 3  # bf16 tiles in rotation (see the ordering argument above)
BLOCK = 32  # MXFP8 block: one E8M0 scale byte per 32 values of a row
BUFFER_BYTES = TILE_M * TILE_K * 2  # 16 KB
_FP8_CHUNKS_PER_ROW = TILE_K // 16  # 4 chunks of 16 fp8 values
_BF16_CHUNKS_PER_ROW = TILE_K // 8  # 8 chunks of 8 bf16 values
_SUBNORMAL_2_POW_MINUS_127 = 0x00400000
# named barriers of the consumer warpgroups' decode: FIRST_BARRIER + 0, + 1 (0 is the CTA's, 1 the
# quantizing epilogues' 256-thread barrier, which a warpgroup may still be using while the other
# decodes the next item's first k-tile)
FIRST_BARRIER = 2


def shifted_k_tiles(rows: Int32, shift: Int32) -> Int32:
    """k-tiles of an item of ``rows`` tokens whose tiles start ``shift`` tokens before its first: 0
    for an empty one, else ceil((rows + shift) / BK)."""
    return cutlass.select_(rows > 0, (rows + shift + TILE_K - 1) // TILE_K, Int32(0))


def buffers_bytes(operands: int) -> int:
    """Shared memory of the bf16 buffers of ``operands`` decoded 128 x 64 tiles (outside the ring)."""
    return operands * DECODE_BUFFERS * BUFFER_BYTES


def barrier_id(mma_warpgroup):
    """The decode barrier of consumer warpgroup ``mma_warpgroup`` (1, 2)."""
    return FIRST_BARRIER - 1 + mma_warpgroup


def token_operand(name: str, value) -> tuple[torch.Tensor, torch.Tensor | None, ElementFormat | None]:
    """(matrix (T, K), scales or None, element format or None) of a launcher's token-row operand:
    a contiguous bf16 matrix, or a rowwise MXFP8Tensor that the kernel decodes (its fp8 bytes as
    uint8 and its compact scales)."""
    if isinstance(value, MXFP8Tensor):
        return decoded_operand(name, value)
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16 and value.dim() == 2
            and value.is_contiguous()):
        raise TypeError(f"{name} must be a contiguous bf16 (T, K) matrix or a rowwise MXFP8Tensor, got "
                        f"{describe(value)}")
    return value, None, None


def decoded_operand(name: str, value: MXFP8Tensor) -> tuple[torch.Tensor, torch.Tensor, ElementFormat]:
    """(fp8 bytes as uint8 (T, K), compact scales (T, K / 32), element format) of an MXFP8 A that
    a kernel decodes: rowwise, compact scales, both contiguous; raises naming ``name`` otherwise."""
    if value.axis is not QuantAxis.ROWWISE or value.swizzled:
        raise ValueError(f"{name} decoded in the kernel must be a rowwise MXFP8Tensor with compact scales, "
                         f"got {value!r}")
    data, scales = value.data, value.scales
    tokens, k = data.shape
    if not (data.is_contiguous() and scales.is_contiguous() and scales.shape == (tokens, k // BLOCK)):
        raise ValueError(f"{name}'s data (T, K) and scales (T, K/32) must be contiguous, got {tuple(data.shape)} "
                         f"and {tuple(scales.shape)}")
    return data.view(torch.uint8), scales, value.element_format


def fake_operand(rows, k, row_alignment: int = BLOCK) -> tuple:
    """Symbolic stand-ins of a decoded operand for ahead-of-time compiles: its fp8 bytes (rows, K)
    as uint8 (row stride a multiple of ``row_alignment``: K for a rowwise quantization, a multiple
    of 32; T for a columnwise one, a multiple of 16 for TMA) and its compact scales (rows,
    blocks)."""
    data = fake_matrix(Uint8, rows, k, divisibility=row_alignment)
    scales = fake_matrix(Uint8, rows, cute.sym_int(), divisibility=1, align=1)
    return data, scales


def fake_token_operand(rows, k, a_format: ElementFormat | None) -> tuple:
    """Symbolic stand-ins of a token-row operand as ``token_operand`` gives it: a bf16 (rows, K)
    matrix and no scales (``a_format`` None), else the decoded operand's (``fake_operand``)."""
    if a_format is None:
        return fake_matrix(BFloat16, rows, k), None
    return fake_operand(rows, k)


def buffer_layout(mA: cute.Tensor, tile_shape_mnk: tuple[int, int, int]) -> cute.ComposedLayout:
    """The bf16 buffers' layout: A's wgmma operand layout (that of a bf16 A of ``mA``'s major
    mode), ``DECODE_BUFFERS`` deep."""
    return sm90_utils.make_smem_layout_a(utils.LayoutEnum.from_tensor(mA), tile_shape_mnk, BFloat16, DECODE_BUFFERS)


def chunks(field, elements: int) -> cute.Tensor:
    """A shared-memory struct field of ``elements`` values as (4, chunks) Uint32 words: one
    16-byte chunk per column, unswizzled (the chunk positions above apply the swizzles)."""
    words = cute.recast_tensor(field.get_tensor(cute.make_layout(elements)), Uint32)
    return cute.zipped_divide(words, (4,))


def fp8_chunk(row, chunk):
    """Slot position (in 16-byte chunks) of fp8 chunk ``chunk`` (0..3) of tile row ``row``."""
    return row * _FP8_CHUNKS_PER_ROW + (chunk ^ ((row >> 1) & 3))


def bf16_chunk(row, chunk):
    """Buffer position (in 16-byte chunks) of bf16 chunk ``chunk`` (0..7) of tile row ``row``."""
    return row * _BF16_CHUNKS_PER_ROW + (chunk ^ (row & 7))


def _e8m0_to_f32_bits(e: Uint32) -> Uint32:
    """fp32 bits of 2**(e - 127) (as ``e8m0_to_float``: 0 gives the subnormal 2**-127)."""
    return _select(e == Uint32(0), _SUBNORMAL_2_POW_MINUS_127, e << 23)


@dsl_user_op
def _decode_pair(word: Uint32, scale_bits: Uint32, high: bool, e5m2: bool, second_scale_bits: Uint32 | None = None,
                 *, loc=None, ip=None) -> Uint32:
    """bf16x2 of fp8 bytes 0, 1 (``high``: 2, 3) of ``word`` times the fp32 scale, the first byte
    in the low half: cvt to f16x2 (exact), each half to fp32 (exact), mul.rn.f32, cvt.rn.bf16x2.
    ``second_scale_bits``: the second byte's own scale (a pair at a block boundary)."""
    fmt = "e5m2x2" if e5m2 else "e4m3x2"
    half = "hi" if high else "lo"
    two = second_scale_bits is not None
    asm = ("{ .reg .b16 lo, hi, a, b; .reg .b32 h2; .reg .f32 x, y, s" + (", t" if two else "") + ";\n"
           "mov.b32 {lo, hi}, $1;\n"
           f"cvt.rn.f16x2.{fmt} h2, {half};\n"
           "mov.b32 {a, b}, h2;\n"
           "cvt.f32.f16 x, a; cvt.f32.f16 y, b;\n"
           "mov.b32 s, $2;\n" + ("mov.b32 t, $3;\n" if two else "")
           + "mul.rn.f32 x, x, s; mul.rn.f32 y, y, " + ("t" if two else "s") + ";\n"
           "cvt.rn.bf16x2.f32 $0, y, x; }")
    values = [Uint32(word).ir_value(loc=loc, ip=ip), Uint32(scale_bits).ir_value(loc=loc, ip=ip)]
    if two:
        values.append(Uint32(second_scale_bits).ir_value(loc=loc, ip=ip))
    return Uint32(llvm.inline_asm(T.i32(), values, asm, "=r,r,r" + (",r" if two else ""), has_side_effects=False,
                                  is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


class DecodeSplit:
    """The static part of a consumer warpgroup's share of a tile's decode (see the module
    docstring): with ``num_mma_warpgroups`` (1, 2) each warpgroup decodes 128 / that rows, a
    thread ``chunks`` (4 or 2) fp8 chunks of one row, spanning ``blocks`` (2 or 1) scale blocks."""

    def __init__(self, num_mma_warpgroups: int, e5m2: bool):
        self.rows = TILE_M // num_mma_warpgroups
        self.threads_per_row = THREADS_PER_WARPGROUP // self.rows  # 1 or 2
        self.chunks = _FP8_CHUNKS_PER_ROW // self.threads_per_row
        self.blocks = self.chunks // 2
        self.e5m2 = e5m2

    def thread_position(self, mma_warpgroup, local_tid):
        """(tile row, first fp8 chunk) of a thread of consumer warpgroup ``mma_warpgroup`` (1, 2)."""
        row = (mma_warpgroup - 1) * self.rows + local_tid // self.threads_per_row
        return row, (local_tid % self.threads_per_row) * self.chunks


@cute.jit
def load_scales(split: cutlass.Constexpr, mScales: cute.Tensor, row: Int32, first_chunk: Int32, first_row: Int32,
                k_tile: Int32, scales: cute.Tensor, blocks: tuple | None = None, shifted: cutlass.Constexpr = False):
    """Write into ``scales`` (2 Uint32 registers) the fp32 scale bits of the thread's blocks of
    ``k_tile`` (tile row ``row`` of the item whose tile starts at ``first_row``; ``mScales`` (rows,
    blocks) E8M0 bytes); rows past the tensor and blocks past its K / 32 (TMA zero fill) get 1.0
    (byte 127), as the Triton dequantize's masked loads. ``blocks`` (first, end): the item's
    blocks are columns first .. end - 1 of ``mScales`` (a columnwise quantization's expert).
    ``shifted`` (with ``blocks``, one thread a row): the item's k-tiles start up to 15 tokens
    before its first token (``decode_rows``' ``shift``), so k-tile k spans blocks 2k - 1, 2k and
    2k + 1: those three go into ``scales`` (3 registers), a block before the first as 1.0."""
    num_rows, num_blocks = mScales.shape
    global_row = first_row + row
    for b in cutlass.range_constexpr(split.blocks + 1 if shifted else split.blocks):
        block = k_tile * (TILE_K // BLOCK) + first_chunk // 2 + b
        if const_expr(shifted):
            block = k_tile * (TILE_K // BLOCK) - 1 + b
        byte = Uint32(127)
        if const_expr(blocks is None):
            if global_row < num_rows and block < num_blocks:
                byte = Uint32(mScales[global_row, block])
        elif const_expr(shifted):
            if global_row < num_rows and block >= 0 and blocks[0] + block < blocks[1]:
                byte = Uint32(mScales[global_row, blocks[0] + block])
        else:
            if global_row < num_rows and blocks[0] + block < blocks[1]:
                byte = Uint32(mScales[global_row, blocks[0] + block])
        scales[b] = _e8m0_to_f32_bits(byte)


@cute.jit
def decode_k_tile(split: cutlass.Constexpr, sA8: cute.Tensor, sA16: cute.Tensor, row: Int32, first_chunk: Int32,
                  slot: Int32, buffer: Int32, scales: cute.Tensor, barrier_id: Int32):
    """fp8 slot ``slot`` of ``sA8`` -> bf16 buffer ``buffer`` of ``sA16`` (``decode_rows``), then
    ``publish``: the buffer is complete for the warpgroup's wgmmas."""
    decode_rows(split, sA8, sA16, row, first_chunk, slot, buffer, scales)
    publish(barrier_id, THREADS_PER_WARPGROUP)


@cute.jit
def publish(barrier_id: Int32, threads: cutlass.Constexpr):
    """The decoded buffers' stores made visible to the wgmmas (async proxy), then the named
    barrier of the ``threads`` that decoded them."""
    cute.arch.fence_proxy("async.shared", space="cta")
    cute.arch.barrier(barrier_id=barrier_id, number_of_threads=threads)


def shifted_scale_indices(chunk: int) -> tuple[int, int]:
    """Which of a shifted k-tile's scales (blocks 2k - 1, 2k, 2k + 1) fp8 chunk ``chunk`` (0..3) of
    a row takes: (before byte ``shift``, from it on). Column 16 chunk + e of k-tile k is token
    64 k + 16 chunk + e - shift of the item (0 <= shift < 16): in block 2k + chunk // 2 from e = shift
    on, before it in the block that precedes the chunk's first token's (even chunks straddle)."""
    return (chunk + 1) // 2, 1 + chunk // 2


@cute.jit
def _low_bytes(count: Int32) -> Uint32:
    """The mask of a word's bytes 0 .. count - 1: count <= 0 none, >= 4 all."""
    kept = cutlass.min(cutlass.max(count, Int32(0)), Int32(4))
    return _select(kept >= Int32(4), 0xFFFFFFFF, (Uint32(1) << (Uint32(kept) * Uint32(8))) - Uint32(1))


@cute.jit
def decode_rows(split: cutlass.Constexpr, sA8: cute.Tensor, sA16: cute.Tensor, row: Int32, first_chunk: Int32,
                slot: Int32, buffer: Int32, scales: cute.Tensor, valid: tuple | None = None,
                shift: Int32 | None = None):
    """fp8 slot ``slot`` of ``sA8`` -> bf16 buffer ``buffer`` of ``sA16`` (both as 16-byte chunks,
    ``chunks``) for the thread's chunks. ``valid`` (first, end): only the k-tile's columns first ..
    end - 1 hold the item's values, the others are decoded as 0 (a weight gradient's tokens of
    the neighbouring experts). ``shift`` (0 .. 15, one thread a row): the item's k-tiles start
    ``shift`` tokens before its first token, so column c of k-tile k is in the item's block
    (64 k + c - shift) // 32: ``scales`` holds blocks 2k - 1, 2k, 2k + 1 (``load_scales(shifted=True)``)
    and ``shifted_scale_indices`` says which a chunk's bytes take."""
    for j in cutlass.range_constexpr(split.chunks):
        chunk = first_chunk + j
        src = cute.make_rmem_tensor((4,), Uint32)
        cute.autovec_copy(sA8[None, slot * (TILE_M * _FP8_CHUNKS_PER_ROW) + fp8_chunk(row, chunk)], src)
        if const_expr(valid is not None):
            for w in cutlass.range_constexpr(4):
                first_byte = chunk * 16 + 4 * w
                mask = _low_bytes(valid[1] - first_byte) & (_low_bytes(valid[0] - first_byte) ^ Uint32(0xFFFFFFFF))
                src[w] = src[w] & mask
        low_scale = high_scale = scales[j // 2]
        if const_expr(shift is not None):
            low_index, high_index = shifted_scale_indices(j)
            low_scale, high_scale = scales[low_index], scales[high_index]
        for half in cutlass.range_constexpr(2):  # fp8 words 2 half, 2 half + 1 -> bf16 chunk 2 chunk + half
            dst = cute.make_rmem_tensor((4,), Uint32)
            for w in cutlass.range_constexpr(2):
                word = src[2 * half + w]
                for high in cutlass.range_constexpr(2):  # bytes 0, 1 or 2, 3 of the word
                    if const_expr(shift is None or len(set(shifted_scale_indices(j))) == 1):  # one block
                        dst[2 * w + high] = _decode_pair(word, high_scale, high == 1, split.e5m2)
                    else:  # the chunk straddles a block boundary at byte ``shift``
                        byte = 8 * half + 4 * w + 2 * high
                        dst[2 * w + high] = _decode_pair(
                            word, _select(Int32(byte) < shift, low_scale, high_scale), high == 1, split.e5m2,
                            _select(Int32(byte + 1) < shift, low_scale, high_scale))
            position = buffer * (TILE_M * _BF16_CHUNKS_PER_ROW) + bf16_chunk(row, 2 * chunk + half)
            cute.autovec_copy(dst, sA16[None, position])


@cute.jit
def _decoded_k_tile_mmas(tiled_mma: cute.TiledMma, tCrA: cute.Tensor, buffer: Int32, slot: Int32, operands: tuple):
    """The wgmmas of one k-tile: A from bf16 buffer ``buffer``, B from pipeline slot ``slot``.
    Returns the tiled MMA (its ACCUMULATE field set), for the caller to rebind."""
    cute.nvgpu.warpgroup.fence()
    for k_block in cutlass.range_constexpr(cute.size(tCrA, mode=[2])):
        for o in cutlass.range_constexpr(len(operands)):
            cute.gemm(tiled_mma, operands[o][0], tCrA[(None, None, k_block, buffer)],
                      operands[o][1][(None, None, k_block, slot)], operands[o][0])
        tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
    cute.nvgpu.warpgroup.commit_group()
    return tiled_mma


@cute.jit
def mma_decoded_k_tiles(tiled_mma: cute.TiledMma, mainloop, read_state, release_state, k_tiles: Int32,
                        tCrA: cute.Tensor, operands: tuple, split: cutlass.Constexpr, decode_args: tuple,
                        barrier_id: Int32, first_row: Int32, decoded: Int32):
    """``_pipeline.mma_k_tiles`` with A decoded: per k-tile, wait for the slot, decode its fp8 A
    into the next bf16 buffer (``decoded`` counts the buffers filled so far, across work items:
    the rotation must continue over them), then its wgmmas (``tCrA``: (MMA, MMA_M, MMA_K,
    buffers)). The scale bytes of the next k-tile are loaded before this one is decoded. Returns
    (tiled_mma, read_state, release_state, decoded), to be rebound by the caller. ``decode_args``:
    (sA8, sA16, mScales, row, first_chunk) of the thread (``DecodeSplit.thread_position``)."""
    sA8, sA16, mScales, row, first_chunk = decode_args
    scales = cute.make_rmem_tensor((2,), Uint32)
    next_scales = cute.make_rmem_tensor((2,), Uint32)
    load_scales(split, mScales, row, first_chunk, first_row, 0, scales)
    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
    # k-tile 0: nothing in flight to wait for
    mainloop.consumer_wait(read_state)
    load_scales(split, mScales, row, first_chunk, first_row, 1, next_scales)
    buffer = decoded % DECODE_BUFFERS
    decode_k_tile(split, sA8, sA16, row, first_chunk, read_state.index, buffer, scales, barrier_id)
    tiled_mma = _decoded_k_tile_mmas(tiled_mma, tCrA, buffer, read_state.index, operands)
    read_state.advance()
    decoded += 1
    for k_tile in range(1, k_tiles):
        scales.store(next_scales.load())
        mainloop.consumer_wait(read_state)
        load_scales(split, mScales, row, first_chunk, first_row, k_tile + 1, next_scales)
        buffer = decoded % DECODE_BUFFERS
        decode_k_tile(split, sA8, sA16, row, first_chunk, read_state.index, buffer, scales, barrier_id)
        tiled_mma = _decoded_k_tile_mmas(tiled_mma, tCrA, buffer, read_state.index, operands)
        cute.nvgpu.warpgroup.wait_group(1)  # k-tile - 1's wgmmas are complete: release its slot
        mainloop.consumer_release(release_state)
        release_state.advance()
        read_state.advance()
        decoded += 1
    cute.nvgpu.warpgroup.wait_group(0)
    mainloop.consumer_release(release_state)
    release_state.advance()
    return tiled_mma, read_state, release_state, decoded


class Decoder:
    """What one consumer thread's decode needs through its work-item loop (``make_decoder``):
    the static split, the smem views, the scales, its position, its barrier."""

    def __init__(self, split: DecodeSplit, args: tuple, barrier):
        self.split, self.args, self.barrier = split, args, barrier


def make_decoder(storage, sA, a_smem_layout, a16_layout, mScales: cute.Tensor | None, mma_warpgroup,
                 num_mma_warpgroups: int, local_tid, a_format: ElementFormat | None):
    """(the wgmmas' A tensor, the ``Decoder`` or None) of a consumer thread of warpgroup
    ``mma_warpgroup``: a bf16 A (``a_format`` None) is read from its slots ``sA`` as loaded, with
    no decoder; a decoded one from the bf16 buffers (``storage`` has the fields ``sA``, the fp8
    slots, and ``sA16``), which the decoder fills."""
    if a_format is None:
        return sA, None
    sA16 = storage.sA16.get_tensor(a16_layout.outer, swizzle=a16_layout.inner)
    split = DecodeSplit(num_mma_warpgroups, a_format is ElementFormat.E5M2)
    row, first_chunk = split.thread_position(mma_warpgroup, local_tid)
    args = (chunks(storage.sA, cute.cosize(a_smem_layout)), chunks(storage.sA16, cute.cosize(a16_layout)), mScales,
            row, first_chunk)
    return sA16, Decoder(split, args, barrier_id(mma_warpgroup))


def mainloop(decoder: Decoder | None, tiled_mma, pipeline, read_state, release_state, k_tiles, tCrA, operands,
             first_row, decoded):
    """One work item's mainloop, traced: ``_pipeline.mma_k_tiles``, or with a ``decoder`` (A
    decoded) ``mma_decoded_k_tiles``. Returns (tiled_mma, read_state, release_state, decoded)
    for the caller to rebind (``decoded`` passes through without a decoder)."""
    if decoder is None:
        tiled_mma, read_state, release_state = mma_k_tiles(tiled_mma, pipeline, read_state, release_state, k_tiles,
                                                           tCrA, operands)
        return tiled_mma, read_state, release_state, decoded
    return mma_decoded_k_tiles(tiled_mma, pipeline, read_state, release_state, k_tiles, tCrA, operands, decoder.split,
                               decoder.args, decoder.barrier, first_row, decoded)
