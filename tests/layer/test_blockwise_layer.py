"""GroupedMLP with the FP8 blockwise recipe (gmlp.FP8BlockwiseRecipe): forward and backward on
the Triton kernels (interpreted on the CPU) with every op cross-checked against the torch path,
close to the unquantized layer, its plan and the reasons it gives, torch.compile without graph
breaks, main_grad accumulation, the weight cache (both orientations from one pass), and the
argument errors."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch._dynamo

import gmlp
import gmlp.layer.steps
from gmlp.contract.gate_up import GateUpLayout
from gmlp.contract.outputs import FC1Output, FC2DgradOutput
from gmlp.contract.reasons import ReasonKind
from gmlp.debug import CrossCheckError, cross_check
from gmlp.dispatch.paths import Path
from gmlp.dispatch.providers import cutedsl_common
from gmlp.dispatch.providers.cutedsl_sm100 import composition_reason
from gmlp.dispatch.sites import BLOCKWISE_SITES, Op
from gmlp.fp8_blockwise.tensor import FP8BlockwiseQuantized, FP8BlockwiseTensor
from gmlp.layer import autograd
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick, stored_gate_up
from tests.support.site_calls import count_site_calls

EXPERTS, HIDDEN, FFN = 4, 256, 128
SPLITS = [0, 129, 43, 128]  # an empty expert, one past a 128-token block, one exactly a block


def _module(recipe=None, **kwargs) -> gmlp.GroupedMLP:
    torch.manual_seed(0)
    return gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN, recipe=recipe or gmlp.FP8BlockwiseRecipe(), device=kernel_device(),
                           **kwargs)


def _step(mlp: gmlp.GroupedMLP, dtype=torch.bfloat16, splits=SPLITS, call=None):
    """y and the gradients of x, probs and every parameter, for fixed inputs and dy, through
    ``call`` (a compiled ``mlp``; the module itself by default)."""
    generator = torch.Generator().manual_seed(1)
    tokens, device = sum(splits), kernel_device()
    x = torch.randn(tokens, HIDDEN, generator=generator).to(device, dtype).requires_grad_()
    probs = torch.rand(tokens, generator=generator).to(device).requires_grad_()
    dy = torch.randn(tokens, HIDDEN, generator=generator).to(device, dtype)
    mlp.zero_grad(set_to_none=True)
    y = (mlp if call is None else call)(x, torch.tensor(splits, device=device), probs)
    y.backward(dy)
    grads = {name: p.grad for name, p in mlp.named_parameters()}
    return {"y": y.detach(), "x": x.grad, "probs": probs.grad, **grads}


@parametrize_quick("recipe", [gmlp.FP8BlockwiseRecipe(), gmlp.FP8BlockwiseRecipe("e5m2", False)],
                   ids=["e4m3-pow2", "e5m2-fp32-scales"])
@parametrize_quick("activation", ["swiglu", "srelu"])
def test_every_op_agrees_with_the_torch_path_and_the_layer_with_the_unquantized_one(recipe, activation):
    """Each op's kernel against its torch twin (the cross-check raises on any element beyond its
    bound, the quantizes compared bit for bit), and the whole step within fp8's error of the
    unquantized fp64 layer (cosine similarity; E4M3 keeps 3 mantissa bits)."""
    mlp = _module(recipe, activation=activation, bias=True)
    if mlp.plan(torch.zeros(1, HIDDEN, device=kernel_device(), dtype=torch.bfloat16)).path("fc1") is Path.TORCH:
        pytest.skip("fc1 runs on torch here: nothing to cross-check it with")
    with cross_check(action="raise"):
        got = _step(mlp)
    reference = gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN, activation=activation, bias=True, recipe=None,
                                dtype=torch.float64, device=kernel_device())
    reference.load_state_dict({name: value.double() for name, value in mlp.state_dict().items()})
    want = _step(reference, torch.float64)
    for name, value in got.items():
        similarity = torch.nn.functional.cosine_similarity(value.double().flatten(), want[name].flatten(), dim=0)
        assert similarity > 0.99, (name, float(similarity))


def test_the_plan_names_the_blockwise_ops_and_why_cutedsl_does_not_run_them():
    mlp = _module()
    plan = mlp.plan(torch.zeros(8, HIDDEN, device=kernel_device(), dtype=torch.bfloat16))
    assert plan.blockwise and set(plan.decisions) == {name for name, site in BLOCKWISE_SITES.items()
                                                     if not site.bias_only}
    assert plan.site("fc1").op is Op.BLOCKWISE_FC1 and plan.site("fc2").op is Op.BLOCKWISE_GEMM
    text = mlp.explain(torch.zeros(8, HIDDEN, device=kernel_device(), dtype=torch.bfloat16))
    assert "the FP8 blockwise recipe" in text and "fc1_forward_blockwise" in text
    assert "fp8 blockwise power-of-two scales, grads e4m3" in repr(mlp)
    reason = cutedsl_common.no_kernel_reason(Op.BLOCKWISE_QUANTIZE)  # what an SM90 / SM100 GPU says
    assert reason.kind is ReasonKind.RECIPE and "no CuTeDSL kernel of the FP8 blockwise recipe's" in reason.message
    for op in (Op.BLOCKWISE_FC1, Op.BLOCKWISE_GEMM, Op.BLOCKWISE_FC2_DGRAD, Op.BLOCKWISE_WGRAD):
        assert cutedsl_common.no_kernel_reason(op) is None  # SM90's kernels (support.py's rules)
    problem = mlp._layer_problem(torch.zeros(8, HIDDEN, dtype=torch.bfloat16))
    assert "blockwise recipe runs on Triton" in composition_reason(problem).message


@pytest.mark.slow
def test_compiled_fullgraph_equals_eager():
    mlp = _module()
    want = _step(mlp)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(mlp)(torch.zeros(300, HIDDEN, dtype=torch.bfloat16, device=kernel_device()),
                                             torch.tensor(SPLITS, device=kernel_device()))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager", dynamic=True)
    got = _step(mlp, call=compiled)
    torch._dynamo.reset()
    for name, value in got.items():
        assert torch.equal(value, want[name]), name


@pytest.mark.slow
def test_main_grad_accumulation():
    mlp = _module(accumulate_main_grad=True)
    for param in mlp.parameters():
        param.main_grad = torch.ones(param.shape, dtype=torch.float32, device=param.device)
    _step(mlp)
    plain = _step(_module())
    for name, param in mlp.named_parameters():
        assert param.grad is None
        torch.testing.assert_close(param.main_grad - 1, plain[name].float(), rtol=2**-7, atol=1e-6)


def test_argument_errors():
    with pytest.raises(ValueError, match="multiples of 128, got hidden_size=192"):
        gmlp.GroupedMLP(2, 192, 128, recipe=gmlp.FP8BlockwiseRecipe())
    with pytest.raises(TypeError, match="bfloat16 or float32 parameters"):
        gmlp.GroupedMLP(2, 128, 128, recipe=gmlp.FP8BlockwiseRecipe(), dtype=torch.float16)
    with pytest.raises(ValueError, match="grad_format must be one of"):
        gmlp.FP8BlockwiseRecipe(grad_format="e3m4")
    with pytest.raises(TypeError, match="power_of_two_scales must be a bool"):
        gmlp.FP8BlockwiseRecipe(power_of_two_scales=1)


WEIGHT_SITES = ("quantize w1", "quantize w2", "quantize w1^T", "quantize w2^T")


def _kept_fp8(kept: list[torch.Tensor]) -> list[tuple[int, ...]]:
    """The shapes of the kept fp8 tensors, sorted (the fp32 scales left out: a scale grid with a
    dimension of 1 and its transpose are one memory, kept once)."""
    return sorted(tuple(t.shape) for t in kept if t.dtype == torch.float8_e4m3fn)


def _both_orientations(*shapes: tuple[int, int, int]) -> list[tuple[int, ...]]:
    """The fp8 tiles a weight cache of the FP8 blockwise recipe keeps for weights of ``shapes``
    (E, N, K): each one's and its transpose's (one byte an element each), sorted."""
    return sorted(shape for (e, n, k) in shapes for shape in ((e, n, k), (e, k, n)))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.slow)])
def test_weight_cache_quantizes_both_orientations_once(monkeypatch, backend):
    """weight_cache="update" quantizes each weight once, W's tiles and W^T's from one read, and
    keeps both (one byte an element each, and the scales); "reuse" quantizes no weight, forward
    or backward. Every micro-batch's output and gradients are bit for bit those of a step without
    the cache (triton: the interpreted kernels, every op cross-checked, the one-pass quantize too)."""
    monkeypatch.setenv("GMLP_BACKEND", backend)
    calls = count_site_calls(monkeypatch)
    mlp = _module(bias=True)
    plain = _step(mlp)
    assert {site: calls[site] for site in WEIGHT_SITES} == dict.fromkeys(WEIGHT_SITES, 1)
    kinds = [("update", {"quantize w1": 1, "quantize w2": 1}), *[("reuse", {})] * 2]
    for weight_cache, weight_calls in kinds:
        calls.clear()
        with contextlib.nullcontext() if backend == "torch" else cross_check(action="raise"):
            got = _step(mlp, call=lambda x, split_sizes, probs: mlp(x, split_sizes, probs, weight_cache=weight_cache))
        assert {site: calls[site] for site in WEIGHT_SITES if calls[site]} == weight_calls, weight_cache
        assert calls["fc2 dgrad"] == calls["fc1 dgrad"] == 1
        for name, value in got.items():
            assert torch.equal(value, plain[name]), (weight_cache, name)
    assert _kept_fp8(mlp._kept_weights.tensors) == _both_orientations((EXPERTS, 2 * FFN, HIDDEN),
                                                                      (EXPERTS, HIDDEN, FFN))


def test_weight_cache_refuses_changed_weights_and_keeps_mxfp8_as_it_was(monkeypatch):
    """A weight changed in place since "update" is refused, and quantized again by the next
    "update"; the MXFP8 recipe's cache still keeps W's and W^T's values, made at their own sites."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    calls = count_site_calls(monkeypatch)
    mlp = _module()
    x, split_sizes = torch.zeros(4, HIDDEN, dtype=torch.bfloat16), torch.tensor([4, 0, 0, 0])
    mlp(x, split_sizes, weight_cache="update")
    with torch.no_grad():
        mlp.w2.add_(1.0)
    with pytest.raises(ValueError, match="w2 was changed in place"):
        mlp(x, split_sizes, weight_cache="reuse")
    assert torch.equal(mlp(x, split_sizes, weight_cache="update"), mlp(x, split_sizes))
    calls.clear()
    mxfp8 = gmlp.GroupedMLP(EXPERTS, HIDDEN, FFN)
    mxfp8(x, split_sizes, weight_cache="update")
    assert {site: n for site, n in calls.items() if "w" in site} == dict.fromkeys(
        ("qdq w1", "qdq w2", "qdq w1^T", "qdq w2^T"), 1)


@pytest.mark.parametrize("layout", [GateUpLayout.SEPARATE, GateUpLayout.INTERLEAVED], ids=lambda layout: layout.value)
def test_weight_cache_with_gate_and_up_stored_apart(monkeypatch, layout):
    """W1's gate and up stored apart: each half quantized apart both ways, the halves' tiles
    stacked once and kept stacked; the update and reuse micro-batches give the bits of W1 as one
    (E, 2F, H) tensor without a cache (y and every gradient), and reuse quantizes no weight."""
    monkeypatch.setenv("GMLP_BACKEND", "torch")
    calls = count_site_calls(monkeypatch)
    mlp = _module(bias=True)
    generator = torch.Generator().manual_seed(3)
    tokens = sum(SPLITS)
    x, dy = (torch.randn(tokens, HIDDEN, generator=generator).bfloat16() for _ in range(2))
    probs, split_sizes = torch.rand(tokens, generator=generator), torch.tensor(SPLITS)
    halves = [mlp.w1.detach().clone().requires_grad_()]
    stored = [t.requires_grad_() for t in stored_gate_up(layout, *(t.detach() for t in mlp.w1.chunk(2, dim=1)))]

    def step(w1: list[torch.Tensor], gate_up: GateUpLayout, weight_cache=None, reused=None):
        """(y and the gradients of x, probs, gate, up, b1, w2, b2; the kept weights' tensors)."""
        config = dataclasses.replace(mlp._config(weight_cache, None), gate_up=gate_up)
        leaves = [t.detach().clone().requires_grad_() for t in (x, probs)]
        for t in (*w1, *mlp.parameters()):
            t.grad = None
        w3 = w1[1] if len(w1) == 2 else None
        outputs = autograd.grouped_mlp(leaves[0], split_sizes, leaves[1], w1[0], mlp.b1, mlp.w2, mlp.b2, config,
                                       reused, w3=w3)
        outputs[0].backward(dy)
        kept = (autograd.kept_weights(outputs, config.encode(), leaves[0], split_sizes, leaves[1], w1[0], mlp.b1,
                                      mlp.w2, mlp.b2, w3=w3)[0] if weight_cache == "update" else None)
        if gate_up is GateUpLayout.HALVES:
            dgate, dup = w1[0].grad.chunk(2, dim=1)
        elif gate_up is GateUpLayout.INTERLEAVED:
            dgate, dup = w1[0].grad.unbind(2)
        else:
            dgate, dup = (t.grad for t in w1)
        return [outputs[0].detach(), *(t.grad for t in leaves), dgate, dup, mlp.b1.grad, mlp.w2.grad, mlp.b2.grad], kept

    want, _ = step(halves, GateUpLayout.HALVES)
    calls.clear()
    got, kept = step(stored, layout, "update")
    assert {site: calls[site] for site in WEIGHT_SITES} == {"quantize w1": 2, "quantize w2": 1, "quantize w1^T": 0,
                                                            "quantize w2^T": 0}  # W1's halves apart
    assert _kept_fp8(kept) == _both_orientations((EXPERTS, 2 * FFN, HIDDEN), (EXPERTS, HIDDEN, FFN))
    calls.clear()
    reused, _ = step(stored, layout, "reuse", kept)
    assert not any(calls[site] for site in WEIGHT_SITES)
    for grads in (got, reused):
        for name, mine, ref in zip(("y", "dx", "dprobs", "dgate", "dup", "db1", "dw2", "db2"), grads, want):
            assert torch.equal(mine, ref), name


@pytest.mark.slow
def test_deterministic():
    """Two steps on the same inputs give the same bits (no atomics: dprobs and db1 are summed in
    a fixed order)."""
    mlp = _module(bias=True)
    first, second = _step(mlp), _step(mlp)
    for name, value in first.items():
        assert torch.equal(value, second[name]), name


@pytest.mark.gpu
def test_a_cuda_graph_replays_over_changing_routing():
    """No host sync anywhere: the step captures in a CUDA graph once and replays with other split
    sizes written into the captured tensor, each replay equal to an eager step bit for bit."""
    mlp = _module()
    if mlp.plan(torch.zeros(1, HIDDEN, device="cuda", dtype=torch.bfloat16)).path("fc1") is not Path.TRITON:
        pytest.skip("the Triton path does not run here")
    tokens = sum(SPLITS)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, HIDDEN, generator=generator).to("cuda", torch.bfloat16).requires_grad_()
    dy = torch.randn(tokens, HIDDEN, generator=generator).to("cuda", torch.bfloat16)
    split_sizes = torch.tensor(SPLITS, device="cuda")
    for _ in range(2):  # compile and warm the allocator outside the capture
        mlp(x, split_sizes).backward(dy)
    graph = torch.cuda.CUDAGraph()
    x.grad = None
    mlp.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        y = mlp(x, split_sizes)
        y.backward(dy)
    for routing in ([300, 0, 0, 0], [75, 75, 75, 75], SPLITS):
        split_sizes.copy_(torch.tensor(routing))
        graph.replay()
        torch.cuda.synchronize()
        captured = (y.clone(), x.grad.clone(), mlp.w1.grad.clone(), mlp.w2.grad.clone())
        eager_x = x.detach().clone().requires_grad_()
        eager = _module()
        eager.load_state_dict(mlp.state_dict())
        eager_y = eager(eager_x, torch.tensor(routing, device="cuda"))
        eager_y.backward(dy)
        for name, got, want in zip(("y", "dx", "dw1", "dw2"), captured,
                                   (eager_y, eager_x.grad, eager.w1.grad, eager.w2.grad)):
            assert torch.equal(got, want), (routing, name)


def _planted(output, where: list):
    """``output`` with one element made wrong (the top exponent bit of an fp8 element flipped, or a
    value negated and moved); ``where`` receives the element's index in the source's orientation."""
    if isinstance(output, FP8BlockwiseQuantized):
        return dataclasses.replace(output, rowwise=_planted(output.rowwise, where))
    if isinstance(output, (FC1Output, FC2DgradOutput)):
        name = "c" if isinstance(output, FC1Output) else "dh_rowwise"
        return dataclasses.replace(output, **{name: _planted(getattr(output, name), where)})
    if isinstance(output, FP8BlockwiseTensor):  # rowwise or tiles: the data is in the source's orientation
        data = output.data.clone()
        index = tuple(s // 2 for s in data.shape)
        data.view(torch.uint8)[index] ^= 0x40
        where.append(index)
        return dataclasses.replace(output, data=data)
    output = output.clone()
    index = tuple(s // 2 for s in output.shape)
    output[index] = -2 * output[index] - 1
    where.append(index)
    return output


@parametrize_quick("site", list(BLOCKWISE_SITES))
def test_one_planted_element_is_caught_and_located(monkeypatch, site):
    """One wrong element in the output of a site's chosen path (Triton) is reported against the
    torch path, with its index: every blockwise site's comparison has teeth."""
    mlp = _module(bias=True)
    plan = mlp.plan(torch.zeros(1, HIDDEN, device=kernel_device(), dtype=torch.bfloat16))
    chosen, reference = plan.path(site), plan.references[site]
    if reference is None:
        pytest.skip(f"{site} runs on {chosen.value}, the last path here: nothing to compare it with")
    where: list = []
    real = gmlp.layer.steps.implementation

    def implementation(site_, path, capability=None):
        run = real(site_, path, capability)
        if site_.name != site or path is not chosen:
            return run
        return lambda *args, **kwargs: _planted(run(*args, **kwargs), where)

    monkeypatch.setattr(gmlp.layer.steps, "implementation", implementation)
    with cross_check(action="raise"), pytest.raises(CrossCheckError) as error:
        _step(mlp)
    message = str(error.value)
    assert f"cross-check: {site} ({BLOCKWISE_SITES[site].op.value}) on {chosen.value} differs from " \
           f"{reference.value}" in message
    assert " 1 of " in message, message  # exactly the planted element
    axes = ("expert", "row", "column") if len(where[0]) == 3 else ("row", "column")
    assert ", ".join(f"{axis} {value}" for axis, value in zip(axes, where[0])) in message, message


@pytest.mark.slow
def test_a_planted_byte_in_the_columnwise_padding_is_caught(monkeypatch):
    """Q_col(a)'s block padding must hold zeros (a weight gradient reads it as it is): one byte
    there in FC1's chosen path is reported as a mismatch of the padding."""
    mlp = _module()
    plan = mlp.plan(torch.zeros(1, HIDDEN, device=kernel_device(), dtype=torch.bfloat16))
    if plan.references["fc1"] is None:
        pytest.skip("fc1 runs on torch here: nothing to compare it with")
    real = gmlp.layer.steps.implementation
    padding_column = SPLITS[1]  # expert 1 (the first with tokens: 129) fills blocks 0 and 1's first column
    assert SPLITS[0] == 0 and SPLITS[1] % 128

    def planted(output):
        data = output.a_columnwise.data.clone()
        data.view(torch.uint8)[0, padding_column] = 0x38  # 1.0 in E4M3, past expert 1's tokens
        return dataclasses.replace(output, a_columnwise=dataclasses.replace(output.a_columnwise, data=data))

    def implementation(site_, path, capability=None):
        run = real(site_, path, capability)
        if site_.name != "fc1" or path is not plan.path("fc1"):
            return run
        return lambda *args, **kwargs: planted(run(*args, **kwargs))

    monkeypatch.setattr(gmlp.layer.steps, "implementation", implementation)
    with cross_check(action="raise"), pytest.raises(CrossCheckError) as error:
        _step(mlp)
    assert "block padding" in str(error.value) and " 1 of " in str(error.value), str(error.value)


@parametrize_quick("dtype", [torch.bfloat16, torch.float32])
def test_empty_batches_fp32_parameters_and_meta_tensors(dtype):
    """An idle rank's empty batch runs forward and backward (zero weight gradients); fp32
    parameters are quantized from fp32 (outputs and gradients in fp32); meta tensors give meta
    outputs of the right shapes through the ops' fake implementations."""
    mlp = gmlp.GroupedMLP(3, 128, 128, recipe=gmlp.FP8BlockwiseRecipe(), bias=True, dtype=dtype, device=kernel_device())
    x = torch.zeros(0, 128, dtype=dtype, device=kernel_device(), requires_grad=True)
    with cross_check(action="raise"):
        y = mlp(x, torch.zeros(3, dtype=torch.int64, device=kernel_device()))
        y.sum().backward()
    assert y.shape == (0, 128) and not mlp.w1.grad.any() and not mlp.b2.grad.any()
    mlp.zero_grad(set_to_none=True)
    x = torch.randn(50, 128, dtype=dtype, device=kernel_device(), requires_grad=True)
    with cross_check(action="raise"):
        y = mlp(x, torch.tensor([20, 0, 30], device=kernel_device()))
        y.float().sum().backward()
    assert y.dtype == x.grad.dtype == mlp.w1.grad.dtype == dtype
    meta = gmlp.GroupedMLP(3, 128, 128, recipe=gmlp.FP8BlockwiseRecipe(), dtype=dtype, device="meta")
    x = torch.zeros(50, 128, dtype=dtype, device="meta", requires_grad=True)
    y = meta(x, torch.tensor([20, 0, 30], device="meta"))
    y.sum().backward()
    assert y.is_meta and y.shape == (50, 128) and x.grad.shape == (50, 128) and meta.w1.grad.shape == (3, 256, 128)
