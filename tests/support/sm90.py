"""What the SM90 kernels' tests share: the GPU check, the routings and operands of the GPU tests,
bitwise comparison, what every config's PTX must show per kernel (grouped GEMM, FC1, FC2
dgrad), and the configs of the tuned table."""

from __future__ import annotations

import re

import torch

from gmlp.cutedsl.sm90 import tuned
from tests.support.cases import config_id
from tests.support.ptx import check_register_split, kernel_resources, sass

__all__ = ["on_sm90", "SPLITS", "expert_weights", "assert_same_bits", "fc1_operands", "fc2_dgrad_operands",
           "check_ptx", "check_fc1_ptx", "check_fc2_dgrad_ptx", "check_fp8_binary", "QUANTIZE_SHUFFLES",
           "tuned_knobs"]


def check_tma_loads(ptx: str, cluster: int = 1) -> None:
    """The token-row kernels' TMA loads: A's 2-D tiles into the CTA, B's 3-D ones (multicast to
    the cluster's CTAs with ``cluster`` 2)."""
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    b_load = ("shared::cta.global.tile.mbarrier::complete_tx::bytes" if cluster == 1
              else "shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster")
    assert re.search(rf"cp\.async\.bulk\.tensor\.3d\.{re.escape(b_load)}", ptx)


def check_ptx(compiled, *, tile_n: int, b_k_major: bool) -> None:
    """What every config's PTX must show: the target, 128 + 128 * (tile_n / 128) threads, bf16
    wgmma with fp32 accumulators of B's major mode, TMA loads (``check_tma_loads``, by the
    config's cluster), no local memory, no spills (the cubin's resources where a cuobjdump reads
    it, else the PTX's ld/st.local), no predicated R2UR in the SASS."""
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx
    assert f".reqntid {128 * (1 + tile_n // 128)}, 1, 1" in ptx
    # wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.bf16.bf16 {d...}, a-desc, b-desc, scale-d,
    # imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b (1: B is N-major in smem)
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_n}k16\.f32\.bf16\.bf16 \{{[^}}]*\}}, "
                        r"%rd\d+, %rd\d+, %?\w+, 1,\s*1, (\d), (\d);", ptx)
    assert wgmmas and all(trans == ("0", "0" if b_k_major else "1") for trans in wgmmas), wgmmas[:2]
    check_tma_loads(ptx, compiled.config.cluster)
    assert "ld.local" not in ptx and "st.local" not in ptx
    code = sass(compiled.cubin)
    if code is not None:
        assert "HGMMA.64x" in code
        # A predicated R2UR near TMA issue is an illegal instruction on sm_90a (NVIDIA's hopper
        # grouped_gemm example works around ptxas emitting one): none here.
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources)
    if resources is not None:  # else the PTX check above is the spill check
        assert resources["stack"] == resources["local"] == 0, resources
        assert resources["registers"] <= 232, resources



def check_fp8_binary(compiled, producer: int = 40, consumer: int = 232) -> str | None:
    """What every FP8 blockwise kernel's binary must show: no local memory and no flush to zero in
    the PTX, Hopper's fp8 ``QGMMA`` in the SASS, the register split, no spills (the cubin's
    resources where a cuobjdump reads them). Returns the SASS (None without a cuobjdump)."""
    ptx = compiled.ptx
    assert "ld.local" not in ptx and "st.local" not in ptx and ".ftz" not in ptx
    code = sass(compiled.cubin)
    if code is not None:
        assert "QGMMA.64x128x32" in code  # Hopper's fp8 warpgroup MMA
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources, producer, consumer)
    if resources is not None:
        assert resources["stack"] == resources["local"] == 0, resources
    return code

def check_weight_gradient_tma_stores(ptx: str, accumulate: bool, bf16: bool) -> None:
    """A weight gradient's TMA-store epilogue in its PTX: subtiles through shared memory (stmatrix
    for bf16, 32-bit shared stores for fp32), then 3-D TMA stores of out (E, M, N), reduce-adds
    with ``accumulate``; no global stores or pair loads of out."""
    stores = set(re.findall(r"cp\.(reduce\.)?async\.bulk\.tensor\.3d\.global\.shared::cta\.(add\.)?tile", ptx))
    assert stores == ({("reduce.", "add.")} if accumulate else {("", "")}), stores
    assert ("stmatrix.sync.aligned" in ptx) == bf16
    assert "st.global" not in ptx and not re.search(r"ld\.global\.(v2\.b32|v2\.f32|b64)", ptx)  # out's pairs


def on_sm90() -> bool:
    """Whether an sm_90 GPU (H100/H200) is here, for the kernels' GPU tests."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


SPLITS = {
    "ragged-with-empty": [0, 37, 64, 1, 90],
    "one-expert-gets-all": [0, 0, 300, 0],
    "all-empty-but-last": [0, 0, 0, 5],
    "tile-multiples": [128, 256, 0, 128],
    "many-tiny": [1, 2, 3, 0, 5, 8, 13, 0, 21, 34, 55, 0, 89, 1, 1, 1],
}


def expert_weights(experts: int, n: int, k: int, transposed: bool) -> torch.Tensor:
    """B_g (N, K) per expert: stacked (E, N, K) (K-major), or a transposed view of W (E, K, N)."""
    if not transposed:
        return (torch.randn(experts, n, k, device="cuda") / 8).bfloat16()
    return (torch.randn(experts, k, n, device="cuda") / 8).bfloat16().transpose(1, 2)


def check_fc1_ptx(compiled, *, gated: bool, b_k_major: bool = True) -> None:
    """What every config's PTX must show: the target, 384 threads (a producer warpgroup and two
    consumer warpgroups), bf16 m64n128k16 wgmma with fp32 accumulators (two per k-block and
    warpgroup when gated: gate and up share the A descriptor), TMA loads, no local memory, no
    spills (the cubin's resources where a cuobjdump reads them), no predicated R2UR in the SASS."""
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx
    assert ".reqntid 384, 1, 1" in ptx
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16 \{[^}]*\}, "
                        r"(%rd\d+), (%rd\d+), %?\w+, 1,\s*1, (\d), (\d);", ptx)
    assert wgmmas and all(w[2:] == ("0", "0" if b_k_major else "1") for w in wgmmas), wgmmas[:2]
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == len(wgmmas)  # no other shape
    pairs = gated
    if pairs:  # each A descriptor feeds two wgmmas (gate, up) with different B descriptors
        by_a = {}
        for a_desc, b_desc, *_ in wgmmas:
            by_a.setdefault(a_desc, set()).add(b_desc)
        assert all(len(b) == 2 for b in by_a.values()), by_a
    assert len(wgmmas) % (8 if pairs else 4) == 0, len(wgmmas)
    check_tma_loads(ptx, compiled.config.cluster)
    assert "ld.local" not in ptx and "st.local" not in ptx
    code = sass(compiled.cubin)
    if code is not None:
        assert "HGMMA.64x128x16.F32.BF16" in code
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources)
    if resources is not None:
        assert resources["stack"] == resources["local"] == 0, resources
        assert resources["registers"] <= 232, resources


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Bitwise equality of two tensors of the same shape and dtype (NaNs included), with where."""
    assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape, got.dtype, want.dtype)
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[got.element_size()]
    differ = (got.contiguous().view(as_int) != want.contiguous().view(as_int)).nonzero()
    assert differ.numel() == 0, f"{name}: {differ.shape[0]} elements differ, first at {differ[:5].tolist()}"


def assert_same_outputs(got, want, names: tuple[str, ...]) -> None:
    """The named fields of two kernels' outputs bit for bit: tensors (``assert_same_bits``), None
    on both sides, or quantized tensors (their scales, MXFP8's or FP8 blockwise's, and data)."""
    for name in names:
        mine, theirs = getattr(got, name), getattr(want, name)
        if mine is None or theirs is None:
            assert mine is None and theirs is None, name
        elif isinstance(mine, torch.Tensor):
            assert_same_bits(mine, theirs, name)
        else:
            scales = "scales" if hasattr(mine, "scales") else "scale_inv"
            assert_same_bits(getattr(mine, scales), getattr(theirs, scales), f"{name} {scales}")
            assert_same_bits(mine.data, theirs.data, f"{name} data")


def fc1_operands(splits, hidden, ffn, activation, bias, with_probs, transposed=False):
    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    tokens, experts = sum(splits), len(splits)
    n1 = (2 if activation.gated else 1) * ffn
    x = torch.randn(tokens, hidden, device="cuda").bfloat16()
    if transposed:  # W1^T stored (E, H, N1), read as the (E, N1, H) view
        w1 = (torch.randn(experts, hidden, n1, device="cuda") / 8).bfloat16().transpose(1, 2)
    else:
        w1 = (torch.randn(experts, n1, hidden, device="cuda") / 8).bfloat16()
    b1 = (torch.randn(experts, n1, device="cuda") * 0.1).bfloat16() if bias else None
    probs = torch.rand(tokens, device="cuda") if with_probs else None
    return x, w1, split_sizes, b1, probs


def check_fc2_dgrad_ptx(compiled) -> None:
    """What every config's PTX must show (the options read from ``compiled.config``): the target,
    384 threads (a producer warpgroup and two consumer warpgroups), bf16 m64n{tile_n}k16 wgmma with
    fp32 accumulators (one B tile, K-major or N-major), 2-D (dy) and 3-D (w2t) TMA loads, butterfly
    shuffles for the dprobs partials (quad) and the db1 warp sums, the epilogue's global loads and
    stores, no local memory, no spills (the cubin's resources), no predicated R2UR in the SASS."""
    ptx, config = compiled.ptx, compiled.config
    tile_n, quantized, b_k_major = config.tile_n, config.quantized, config.b_k_major
    probs, bias_grad = config.probs_dtype is not None, config.bias_grad
    pairs = tile_n // 4  # a thread's column pairs of the tile: 2 rows x tile_n / 8 column groups
    assert ".target sm_90a" in ptx
    assert ".reqntid 384, 1, 1" in ptx
    wgmmas = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_n}k16\.f32\.bf16\.bf16 \{{[^}}]*\}}, "
                        r"(%rd\d+), (%rd\d+), %?\w+, 1,\s*1, (\d), (\d);", ptx)
    assert wgmmas and all(w[2:] == ("0", "0" if b_k_major else "1") for w in wgmmas), wgmmas[:2]
    assert len(wgmmas) % 4 == 0, len(wgmmas)
    producer, consumer = (24, 240) if quantized else (40, 232)  # MXFP8: 8 more a consumer thread
    check_tma_loads(ptx, compiled.config.cluster)
    shuffles = len(re.findall(r"shfl\.sync\.bfly\.b32", ptx))
    halves = 2 if config.activation.gated else 1
    # dprobs: 2 rows x 2 quad steps; db1: the thread's tile_n / 4 columns x 3 steps per half;
    # MXFP8: each quantized tile's 41 (check_quantized_ptx)
    quantizing = QUANTIZE_SHUFFLES * halves if quantized else 0
    assert shuffles == quantizing + (4 if probs else 0) + (3 * pairs * halves if bias_grad else 0), shuffles
    # one pass: each of the thread's pairs of c (gate, and up) loaded once as a 32-bit word (beside
    # the schedule's 32-bit loads; bf16 dh: one subtile ahead); bf16 dh pairs, db1 warp sums and
    # dprobs partials stored as 32-bit words
    assert len(re.findall(r"ld\.global\.v2\.b16", ptx)) == 0
    assert len(re.findall(r"ld\.global\.b32", ptx)) >= pairs * halves
    tma_store = config.store == "tma"  # bf16 dh through shared memory and 4-D TMA stores (the ragged view)
    stores = (0 if quantized or tma_store else pairs * halves) + (pairs * halves if bias_grad else 0) + (2 if probs else 0)
    assert len(re.findall(r"st\.global\.b32", ptx)) == stores
    assert bool(re.search(r"cp\.async\.bulk\.tensor\.4d\.global\.shared::cta\.tile\.bulk_group", ptx)) == tma_store
    # tile_n / 32 subtiles of 16 values a thread: one 4-matrix stmatrix per 8 of d gate, of d up
    assert len(re.findall(r"stmatrix\.sync\.aligned", ptx)) == (tile_n // 32 * 2 * halves if tma_store else 0)
    assert "ld.local" not in ptx and "st.local" not in ptx
    code = sass(compiled.cubin)
    if code is not None:
        assert f"HGMMA.64x{tile_n}x16.F32.BF16" in code
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)
    resources = kernel_resources(compiled.cubin)
    check_register_split(ptx, resources, producer, consumer)
    if resources is not None:
        assert resources["stack"] == resources["local"] == 0, resources
        assert resources["registers"] <= consumer, resources


# Butterfly shuffles of one quantized 128 x 128 tile: Q_row's quad reduce-scatter (2 row slots x
# 3), Q_col's column reduce-scatter (16 + 8 + 4) and scale gather (1 + 2 + 4).
QUANTIZE_SHUFFLES = 2 * 3 + 16 + 8 + 4 + 1 + 2 + 4


def fc2_dgrad_operands(splits, hidden, ffn, activation, with_probs, transposed=False):
    torch.manual_seed(0)
    split_sizes = torch.tensor(splits, device="cuda")
    tokens, experts = sum(splits), len(splits)
    n1 = (2 if activation.gated else 1) * ffn
    dy = torch.randn(tokens, hidden, device="cuda").bfloat16()
    if transposed:  # the stacked W2 (E, H, F) read as its (E, F, H) transpose
        w2t = (torch.randn(experts, hidden, ffn, device="cuda") / 8).bfloat16().transpose(1, 2)
    else:
        w2t = (torch.randn(experts, ffn, hidden, device="cuda") / 8).bfloat16()
    c = torch.randn(tokens, n1, device="cuda").bfloat16()
    probs = torch.rand(tokens, device="cuda") if with_probs else None
    return dy, w2t, c, split_sizes, probs


# each site's kernel config in the bf16 layer (HALVES W1, probs, no bias), before the table's knobs
_SITE_KNOBS = {
    "fc1": dict(activation="swiglu", probs_dtype=torch.float32),
    "fc2": dict(b_k_major=True),
    "fc2 dgrad": dict(activation="swiglu", b_k_major=False, probs_dtype=torch.float32),
    "fc1 dgrad": dict(b_k_major=False),
    "fc2 wgrad": dict(out_dtype=torch.bfloat16),
    "fc1 wgrad": dict(out_dtype=torch.bfloat16),
}


def tuned_knobs(op: str) -> list[dict]:
    """The kernel-config knobs of every distinct launch of ``op`` that the package's tuned table
    chooses (its site's bf16 layer config with the entry's knobs): the compile tests check each."""
    table = tuned.read_table(tuned.TABLE_FILE) if tuned.TABLE_FILE.exists() else None
    distinct = {}
    for entry in (table.entries if table else ()):
        if entry.op == op:
            knobs = {**_SITE_KNOBS[entry.site], **entry.options}
            distinct[config_id(knobs)] = knobs
    return list(distinct.values())
