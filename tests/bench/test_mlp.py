"""``python -m gmlp.bench mlp``'s sides on a tiny shape on the CPU: what each computes, never how fast.

``torch._grouped_mm`` runs forward and backward on the CPU (torch 2.13), so the torch baselines
are the bench's own builders, with the activation eager or through ``torch.compile`` (inductor's
C++ backend here). Every side gets the same probs and must return dprobs; all sides compute one
function of the same weights, so they agree to within their formats' rounding.
"""

from __future__ import annotations

import pytest
import torch

from gmlp.bench.mlp import (
    BASELINES,
    EAGER_ACT,
    W1_APART,
    compiled_swiglu_probs,
    layer_runs,
    layer_tensors,
    make_layers,
    router_probs,
    split_sizes_for,
    swiglu_probs,
    training_step,
)
from gmlp.mxfp8.spec import ElementFormat
from tests.support.site_calls import count_site_calls
from tests.support.tolerances import BF16_UNIT, relative_rms_bound, relative_rms_error, unit_roundoff

EXPERTS, TOKENS, HIDDEN, FFN = 4, 200, 64, 64
CPU = torch.device("cpu")
E4M3_UNIT = unit_roundoff(ElementFormat.E4M3)


@pytest.fixture(scope="module")
def compiled_act():
    """One compiled activation for the module's tests: both call it on (TOKENS, 2 FFN), so it
    compiles once (forward and backward)."""
    return compiled_swiglu_probs()


@pytest.mark.slow  # inductor's C++ compile of the activation, forward and backward
def test_compiled_activation_is_the_eager_one_to_bf16_rounding(compiled_act):
    """Not bit for bit: inductor keeps silu(gate) * up in fp32 where eager rounds each product to
    bf16, so the two differ by a few bf16 roundings, forward and backward."""
    torch.manual_seed(0)
    h = torch.randn(TOKENS, 2 * FFN, dtype=torch.bfloat16, requires_grad=True)
    probs = router_probs(TOKENS, CPU)
    grad = torch.randn(TOKENS, FFN, dtype=torch.bfloat16)
    results = {}
    for name, activation in (("eager", swiglu_probs), ("compiled", compiled_act)):
        h.grad = probs.grad = None
        a = activation(h, probs)
        a.backward(grad)
        results[name] = (a.detach(), h.grad, probs.grad)
    bound = relative_rms_bound(BF16_UNIT, BF16_UNIT, BF16_UNIT)
    for what, got, want in zip(("a", "dh", "dprobs"), results["compiled"], results["eager"]):
        assert got.dtype == want.dtype == (torch.float32 if what == "dprobs" else torch.bfloat16), what
        assert relative_rms_error(got, want) <= bound, what


@pytest.mark.slow
def test_every_side_multiplies_by_probs_and_returns_dprobs(compiled_act):
    x, dy = layer_tensors(TOKENS, HIDDEN, CPU)
    probs = router_probs(TOKENS, CPU)
    split_sizes = split_sizes_for("skewed", EXPERTS, TOKENS, CPU)
    assert split_sizes[-1] == 0  # an empty expert
    layers, torch_weights = make_layers(EXPERTS, HIDDEN, FFN, CPU)
    runs = layer_runs(layers, torch_weights, x, probs, split_sizes, compiled_act)
    assert set(runs) == {*BASELINES.values(), "gmlp-mxfp8", "gmlp-bf16", "gmlp-mxfp8-reused-weights", W1_APART}
    results = {}
    for name, (forward, leaves) in runs.items():
        assert any(leaf is probs for leaf in leaves), name  # its step clears dprobs first
        y = forward().detach()
        training_step(forward, leaves, dy)
        assert probs.grad is not None and probs.grad.dtype == torch.float32 and probs.grad.shape == (TOKENS,), name
        results[name] = (y, x.grad, probs.grad)
    # W1's gate and up as two tensors: the bf16 layer's bits (the layout moves no value)
    assert all(torch.equal(apart, halves) for apart, halves in zip(results[W1_APART], results["gmlp-bf16"]))
    want = results[EAGER_ACT]
    for name, got in results.items():
        # one rounding per operand of each GEMM and of the activation, in the side's format
        unit = E4M3_UNIT if "mxfp8" in name else BF16_UNIT
        bound = relative_rms_bound(unit, unit, unit, unit, BF16_UNIT)
        errors = {what: relative_rms_error(g, w) for what, g, w in zip(("y", "dx", "dprobs"), got, want)}
        assert all(error <= bound for error in errors.values()), f"{name}: {errors} > {bound}"


def test_sides_are_chosen_and_the_baselines_always_run(compiled_act):
    """``--sides``: only the named sides are built, beside both baselines; SonicMoE is not a
    default side (it needs its own process) and an unknown side is refused."""
    from gmlp.bench import mlp, sonicmoe

    x, _ = layer_tensors(TOKENS, HIDDEN, CPU)
    probs = router_probs(TOKENS, CPU)
    split_sizes = split_sizes_for("balanced", EXPERTS, TOKENS, CPU)
    layers, torch_weights = make_layers(EXPERTS, HIDDEN, FFN, CPU)
    runs = layer_runs(layers, torch_weights, x, probs, split_sizes, compiled_act, sides=("gmlp-bf16",))
    assert set(runs) == {*BASELINES.values(), "gmlp-bf16"}
    assert sonicmoe.SIDE in mlp.SIDES and sonicmoe.SIDE not in mlp.DEFAULT_SIDES
    with pytest.raises(SystemExit):
        mlp.main(["--sides", "gmlp-bf16,nope"])


def test_the_blockwise_reused_weights_side_is_a_later_micro_batch(monkeypatch, compiled_act):
    """``gmlp-fp8-blockwise-reused-weights`` (asked for with ``--sides``, not a default side): the
    blockwise layer's step with the tiles its first micro-batch kept, no weight quantized, the
    bits of the plain blockwise side (torch path); refused, as that side is, where H or F is not
    a multiple of 128."""
    from gmlp.bench.mlp import BLOCKWISE, BLOCKWISE_REUSED, DEFAULT_SIDES, SIDES

    monkeypatch.setenv("GMLP_BACKEND", "torch")
    calls = count_site_calls(monkeypatch)
    hidden = ffn = 128
    x, dy = layer_tensors(TOKENS, hidden, CPU)
    probs = router_probs(TOKENS, CPU)
    split_sizes = split_sizes_for("skewed", EXPERTS, TOKENS, CPU)
    layers, torch_weights = make_layers(EXPERTS, hidden, ffn, CPU)
    runs = layer_runs(layers, torch_weights, x, probs, split_sizes, compiled_act, sides=(BLOCKWISE, BLOCKWISE_REUSED))
    assert set(runs) == {*BASELINES.values(), BLOCKWISE, BLOCKWISE_REUSED}
    assert BLOCKWISE_REUSED in SIDES and BLOCKWISE_REUSED not in DEFAULT_SIDES
    assert calls["quantize w1"] == calls["quantize w2"] == 1  # the first micro-batch's, building the side
    results = {}
    for name in (BLOCKWISE, BLOCKWISE_REUSED):
        forward, leaves = runs[name]
        assert any(leaf is probs for leaf in leaves), name
        calls.clear()
        training_step(forward, leaves, dy)
        weight_sites = {site for site in calls if site.startswith("quantize w")}
        assert weight_sites == (set() if name == BLOCKWISE_REUSED else
                                {"quantize w1", "quantize w2", "quantize w1^T", "quantize w2^T"}), name
        results[name] = [forward().detach(), x.grad, probs.grad, *(p.grad for p in layers[BLOCKWISE].parameters())]
    assert all(torch.equal(reused, plain) for reused, plain in zip(results[BLOCKWISE_REUSED], results[BLOCKWISE]))
    small, small_weights = make_layers(EXPERTS, HIDDEN, FFN, CPU)
    x_small, _ = layer_tensors(TOKENS, HIDDEN, CPU)
    with pytest.raises(ValueError, match=f"--sides {BLOCKWISE_REUSED}: the FP8 blockwise recipe needs H and F "
                                         "multiples of 128, got H=64, F=64"):
        layer_runs(small, small_weights, x_small, probs, split_sizes, compiled_act, sides=(BLOCKWISE_REUSED,))
