"""The CuTeDSL sm_90a FC1 forward (gmlp.cutedsl.sm90.fc1) compiled without a GPU, with checks on
its PTX, SASS and ptxas' resource report (the helpers of tests/test_sm90_compile.py), and (marker
``gpu``, H100/H200 only) run against the reference and the Triton twin with the tolerances of
tests/test_triton_fc1.py.

The kernel is shape-generic (T, H, F, E are runtime values), so the design shapes share the
compile of their config (about 1 s each, cached); each shape is still checked against the
kernel's support. Skipped, with the import error, where cutlass-dsl is missing or broken.
"""

from __future__ import annotations

import re

import pytest
import torch

from gmlp.activations import Activation, ActivationKind, activation_from
from gmlp.cutedsl import import_error
from tests.cases import BANDED_SPLITS
from tests.test_sm90_compile import ptxas_report, sass

_IMPORT_ERROR = import_error()
pytestmark = pytest.mark.skipif(_IMPORT_ERROR is not None, reason=f"CuTeDSL kernels unavailable: {_IMPORT_ERROR}")

# (E, T, H, F) design shapes
DESIGN_SHAPES = [(8, 16384, 4096, 14336), (32, 32768, 7168, 2048), (128, 65536, 2048, 768)]
# Odd problems (T, H, F, E): one token, tiny and empty experts, F not a multiple of the 128-column
# tile, H below one 64-wide k-tile, many experts.
ODD_SHAPES = [(1, 32, 32, 1), (37 + 64 + 1 + 90, 64, 96, 5), (3, 32, 160, 4096), (300, 96, 32, 4)]
ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu"]


def _config(activation="swiglu", **kwargs):
    from gmlp.cutedsl.sm90.fc1 import FC1Config

    return FC1Config(activation_from(activation), **kwargs)


def check_fc1_ptx(compiled, *, gated: bool, b_k_major: bool = True) -> None:
    """What every config's PTX must show: the target, 384 threads (a producer warpgroup and two
    consumer warpgroups), bf16 m64n128k16 wgmma with fp32 accumulators (two per k-block and
    warpgroup when gated: gate and up share the A descriptor), TMA loads, no local memory, no
    spills (ptxas -v where a ptxas reads the PTX), no predicated R2UR in the SASS."""
    ptx = compiled.ptx
    assert ".target sm_90a" in ptx
    assert ".reqntid 384, 1, 1" in ptx
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16 \{[^}]*\}, "
                        r"(%rd\d+), (%rd\d+), %?\w+, 1,\s*1, (\d), (\d);", ptx)
    assert wgmmas and all(w[2:] == ("0", "0" if b_k_major else "1") for w in wgmmas), wgmmas[:2]
    if gated:  # each A descriptor feeds two wgmmas (gate, up) with different B descriptors
        by_a = {}
        for a_desc, b_desc, *_ in wgmmas:
            by_a.setdefault(a_desc, set()).add(b_desc)
        assert all(len(b) == 2 for b in by_a.values()), by_a
    assert len(wgmmas) % (8 if gated else 4) == 0, len(wgmmas)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert re.search(r"cp\.async\.bulk\.tensor\.3d\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx)
    assert "ld.local" not in ptx and "st.local" not in ptx
    code = sass(compiled.cubin)
    if code is not None:
        assert "HGMMA.64x128x16.F32.BF16" in code
        assert not re.search(r"@!?U?P\w+\s+R2UR", code)
    report = ptxas_report(ptx, "sm_90a")
    if report is not None:
        assert report["spill_stores"] == report["spill_loads"] == report["stack"] == 0, report
        assert report["registers"] <= 232, report


def check_activation_math(ptx: str, activation: Activation) -> None:
    """The epilogue's transcendental ops are Triton's (ex2.approx.f32, div.full.f32: see the
    Triton FC1 PTX), one of each per element of a thread's 64 a values; none for srelu."""
    expected = 0 if activation.kind is ActivationKind.SRELU else 64  # geglu's tanh is 2 sigmoid(2x) - 1
    assert len(re.findall(r"ex2\.approx\.f32", ptx)) == expected
    assert len(re.findall(r"div\.full\.f32", ptx)) == expected
    assert "ex2.approx.ftz" not in ptx


@pytest.mark.parametrize("shape", DESIGN_SHAPES, ids=lambda s: "E{}-T{}-H{}-F{}".format(*s))
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_design_shapes_compile(shape, activation):
    """The layer's FC1: stacked W1 (K-major), bf16 b1, fp32 probs."""
    from gmlp.cutedsl.sm90.fc1 import compile_fc1

    experts, tokens, hidden, ffn = shape
    config = _config(activation, bias_dtype=torch.bfloat16, probs_dtype=torch.float32)
    compiled = compile_fc1("sm_90a", config, shape=(tokens, hidden, ffn, experts))
    check_fc1_ptx(compiled, gated=config.activation.gated)
    check_activation_math(compiled.ptx, config.activation)


@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "T{}-H{}-F{}-E{}".format(*s))
@pytest.mark.parametrize("variant", ["plain", "fp32-bias-bf16-probs", "n-major-w1", "two-stages"])
@pytest.mark.parametrize("activation", ["swiglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5)],
                         ids=["swiglu", "srelu", "qgeglu-clamped"])
def test_odd_shapes_compile(shape, variant, activation):
    from gmlp.cutedsl.sm90.fc1 import compile_fc1

    kwargs = {"plain": {}, "fp32-bias-bf16-probs": dict(bias_dtype=torch.float32, probs_dtype=torch.bfloat16),
              "n-major-w1": dict(b_k_major=False, probs_dtype=torch.float32), "two-stages": dict(stages=2)}[variant]
    config = _config(activation, **kwargs)
    compiled = compile_fc1("sm_90a", config, shape=shape)
    check_fc1_ptx(compiled, gated=config.activation.gated, b_k_major=config.b_k_major)


def test_stage_counts():
    """A 48 KB slot (x tile + gate and up tiles) gets 4 stages; srelu's 32 KB slot 7."""
    assert _config("swiglu").num_stages() == 4
    assert _config("srelu").num_stages() == 7
    with pytest.raises(ValueError, match=r"stages must be in \[2, 4\] for swiglu"):
        _config("swiglu", stages=5)
    with pytest.raises(ValueError, match="bias_dtype must be one of"):
        _config("swiglu", bias_dtype=torch.float16)
    with pytest.raises(TypeError, match="activation must be"):
        from gmlp.cutedsl.sm90.fc1 import FC1Config

        FC1Config("swiglu")


@pytest.mark.parametrize("shape,match", [
    ((64, 48, 64, 2), r"H=48 and F=64 must be positive multiples of 32"),
    ((64, 64, 0, 2), r"H=64 and F=0"),
    ((64, 64, 64, 4097), r"E=4097 outside \[1, 4096\]"),
])
def test_unsupported_shapes_are_refused(shape, match):
    from gmlp.cutedsl.sm90.fc1 import compile_fc1

    with pytest.raises(ValueError, match=match):
        compile_fc1("sm_90a", shape=shape)


def test_launcher_refuses_bad_operands():
    from gmlp.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc1 import fc1_forward
    from gmlp.recipe import MXFP8Recipe

    x, w1 = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    splits = torch.tensor([4, 4])
    kwargs = dict(ffn_hidden_size=32, activation=SWIGLU, recipe=None)
    with pytest.raises(ValueError, match="16-byte aligned CUDA tensors"):
        fc1_forward(x, w1, splits, **kwargs)
    with pytest.raises(ValueError, match=r"w1 must hold 2 experts' \(64, 64\) matrices, got \(64, 32\) each"):
        fc1_forward(x, w1[:, :, :32], splits, **kwargs)
    with pytest.raises(ValueError, match="H=64 and F=48"):
        fc1_forward(x, torch.zeros(2, 96, 64, dtype=torch.bfloat16), splits, **{**kwargs, "ffn_hidden_size": 48})
    with pytest.raises(NotImplementedError, match="MXFP8 epilogue"):
        fc1_forward(x, w1, splits, **{**kwargs, "recipe": MXFP8Recipe()})
    with pytest.raises(ValueError, match=r"w1 \(E, N, K\) must be K-major"):
        fc1_forward(x, torch.zeros(2, 64, 128, dtype=torch.bfloat16)[:, :, ::2], splits, **kwargs)


# ---------------------------------------------------------------------------------------------
# On an sm_90 GPU: against the reference and the Triton twin
# ---------------------------------------------------------------------------------------------


def _on_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


SPLITS = {
    "ragged-with-empty": [0, 37, 64, 1, 90],
    "one-expert-gets-all": [0, 0, 300, 0],
    "tile-multiples": [128, 256, 0, 128],
    "many-tiny": [1, 2, 3, 0, 5, 8, 13, 0, 21, 34, 55, 0, 89, 1, 1, 1],
}
GPU_ACTIVATIONS = ["swiglu", "geglu", "qgeglu", "srelu", Activation(ActivationKind.QGEGLU, limit=0.5)]


@pytest.mark.gpu
@pytest.mark.skipif(not _on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", GPU_ACTIVATIONS, ids=lambda a: a if isinstance(a, str) else "qgeglu-clamped")
@pytest.mark.parametrize("bias,with_probs", [(True, True), (False, False), (True, False)],
                         ids=["bias-probs", "plain", "bias"])
@pytest.mark.parametrize("hidden,ffn", [(64, 96), (96, 160), (512, 256)], ids=["H64-F96", "H96-F160", "H512-F256"])
@pytest.mark.parametrize("splits", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("transposed", [False, True], ids=["stacked", "transposed-weight"])
def test_fc1_matches_reference_and_triton(activation, bias, with_probs, hidden, ffn, splits, transposed):
    """Tolerance of tests/test_triton_fc1.py (bf16 recipe): c within one bf16 step (2**-7 |v|) +
    delta_h = H * 2**-24 * max sum_k |x_k w_k| of the fp64 reference, a within one bf16 step +
    delta_a = delta_h * (2 max|h| + 2); against the Triton kernel the same bound (both are fp32
    accumulations, each within delta_h of the exact h). Every row and column is compared, so an
    unwritten (torch.empty) or misplaced element fails."""
    from gmlp.cutedsl.sm90.fc1 import fc1_forward
    from gmlp.mlp_ref import fc1_forward_ref
    from gmlp.triton_ref.fc1 import fc1_forward as triton_fc1_forward
    from tests.tolerances import within_steps

    activation = activation_from(activation)
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
    kwargs = dict(ffn_hidden_size=ffn, activation=activation, recipe=None, b1=b1, probs=probs)
    got = fc1_forward(x, w1, split_sizes, **kwargs)
    want = fc1_forward_ref(x, w1, split_sizes, **kwargs)
    twin = triton_fc1_forward(x, w1, split_sizes, **kwargs)
    magnitude = max((x.float().abs() @ w1[g].float().abs().t()).max().item() for g in range(experts))
    delta_h = hidden * 2.0**-24 * magnitude
    delta_a = delta_h * (2 * want.c.float().abs().max().item() + 2)
    assert got.c.shape == want.c.shape == (tokens, n1) and got.c.dtype == torch.bfloat16
    assert got.a.shape == want.a.shape == (tokens, ffn) and got.a.dtype == torch.bfloat16
    assert got.a_rowwise is None and got.a_columnwise is None
    for other, factor in ((want, 1), (twin, 2)):  # the twin is itself within the bound of the reference
        assert within_steps(got.c, other.c, 2.0**-7, factor * delta_h)
        assert within_steps(got.a, other.a, 2.0**-7, factor * delta_a)

@pytest.mark.gpu
@pytest.mark.skipif(not _on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
@pytest.mark.parametrize("activation", ["swiglu", "srelu"])
def test_fc1_over_several_bands(activation):
    """20 m-tiles (bands of 8, 8, 4 in the schedule) x several n-tiles, an empty expert."""
    test_fc1_matches_reference_and_triton(activation, True, True, 256, 384, BANDED_SPLITS, False)


@pytest.mark.gpu
@pytest.mark.skipif(not _on_sm90(), reason="needs an sm_90 GPU (H100/H200)")
def test_fc1_is_deterministic_and_syncless():
    """Same inputs, bitwise the same outputs; no host sync in the launch."""
    from gmlp.activations import SWIGLU
    from gmlp.cutedsl.sm90.fc1 import fc1_forward

    splits = torch.tensor([0, 300, 7, 129], device="cuda")
    x = torch.randn(436, 256, device="cuda").bfloat16()
    w1 = (torch.randn(4, 512, 256, device="cuda") / 8).bfloat16()
    probs = torch.rand(436, device="cuda")
    kwargs = dict(ffn_hidden_size=256, activation=SWIGLU, recipe=None, probs=probs)
    first = fc1_forward(x, w1, splits, **kwargs)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = fc1_forward(x, w1, splits, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first.c, second.c) and torch.equal(first.a, second.a)
