"""The cross-check: clean runs pass, and one planted wrong element in any op's output is caught
and located. On the CPU the Triton kernels run in the interpreter and are checked against the
torch twins; on a GPU the same tests check the compiled kernels."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import gmlp
import gmlp.layer.steps
from gmlp.contract.outputs import FC1Output, FC2DgradOutput
from gmlp.debug import CrossCheckError, CrossCheckWarning, cross_check
from gmlp.dispatch.paths import Path
from gmlp.dispatch.sites import SITES
from gmlp.mxfp8.tensor import MXFP8Quantized, MXFP8Values
from tests.support.backends import kernel_device
from tests.support.cases import parametrize_quick

SPLITS = {"skewed-with-empty": [37, 0, 60, 3], "one-expert": [40]}


def _layer_step(recipe, activation="swiglu", splits=(37, 0, 60, 3), bias=True, seed=0):
    device = kernel_device()
    torch.manual_seed(seed)
    mlp = gmlp.GroupedMLP(len(splits), 64, 64, activation=activation, bias=bias, recipe=recipe, device=device)
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(sum(splits), 64, device=device).bfloat16().requires_grad_()
    probs = torch.rand(sum(splits), device=device, requires_grad=True)
    y = mlp(x, split_sizes, probs)
    y.backward(torch.randn_like(y))
    return mlp, x


def _require_triton_layer():
    """These tests cross-check the Triton layer against the torch twins; skipped, with the true
    reason, where its GEMMs take another path."""
    mlp = gmlp.GroupedMLP(2, 64, 64, device=kernel_device())
    path = mlp.plan(torch.zeros(4, 64, device=kernel_device())).path("fc1")
    if path is Path.TORCH:
        pytest.skip("fc1 runs on torch here (no GPU and no Triton interpreter): the last path, nothing below it")
    if path is not Path.TRITON:
        pytest.skip(f"fc1 takes {path.value} here, not triton: these tests cross-check the Triton layer "
                    "(the CuTeDSL sites are cross-checked in tests/layer/test_mlp_sm90_path.py)")


@parametrize_quick("recipe,activation", [(gmlp.MXFP8Recipe(), "swiglu"), (gmlp.MXFP8Recipe(), "qgeglu"),
                                         (gmlp.MXFP8Recipe(), "srelu"), (None, "geglu")],
                   ids=["mxfp8-swiglu", "mxfp8-qgeglu", "mxfp8-srelu", "bf16-geglu"])
@parametrize_quick("splits", list(SPLITS.values()), ids=list(SPLITS))
def test_clean_runs_pass(recipe, activation, splits):
    _require_triton_layer()
    with cross_check(action="raise"):
        _layer_step(recipe, activation, splits)


def _planted(output, where: list):
    """output with one element made wrong; ``where`` receives the element's index."""
    if isinstance(output, MXFP8Quantized):
        return dataclasses.replace(output, rowwise=_planted(output.rowwise, where))
    if isinstance(output, MXFP8Values):  # a quantize-dequantize: the orientation it made
        axis = "rowwise" if output.rowwise is not None else "columnwise"
        return dataclasses.replace(output, **{axis: _planted(getattr(output, axis), where)})
    if isinstance(output, (FC1Output, FC2DgradOutput)):
        name = "c" if isinstance(output, FC1Output) else ("dh" if output.dh is not None else "dh_rowwise")
        return dataclasses.replace(output, **{name: _planted(getattr(output, name), where)})
    if not isinstance(output, torch.Tensor):  # an MXFP8Tensor: flip the top exponent bit of one fp8 element
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


# every site of the MXFP8 layer's step sequence (the SM100 composition's: tests/cutedsl/sm100), and
# the sites of the bf16 layer (on SM90 its FC1 and FC2 dgrad run on CuTeDSL, checked against Triton)
PLANTED = [(site, "mxfp8") for site, s in SITES.items() if s.sm100 is not True] + [
    (site, "bf16") for site, s in SITES.items() if not s.mxfp8_only]


def _plant_at(monkeypatch, site: str, chosen: Path, where: list) -> None:
    """Make ``site``'s op on ``chosen`` (the path its plan takes; the cross-check's reference
    runs unpatched) return one wrong element; ``where`` receives its index."""
    real = gmlp.layer.steps.implementation

    def implementation(site_, path, capability=None):
        run = real(site_, path, capability)
        if site_.name != site or path is not chosen:
            return run
        return lambda *args, **kwargs: _planted(run(*args, **kwargs), where)

    monkeypatch.setattr(gmlp.layer.steps, "implementation", implementation)


def _chosen(site: str, recipe=gmlp.MXFP8Recipe(), experts: int = 4) -> Path:
    """The path the plan of a layer like _layer_step's takes at ``site``."""
    plan = gmlp.GroupedMLP(experts, 64, 64, bias=True, recipe=recipe, device=kernel_device()).plan(
        torch.zeros(100, 64, device=kernel_device()))
    return plan.path(site)


@parametrize_quick("site,recipe_name", PLANTED, ids=[f"{site}-{recipe}" for site, recipe in PLANTED])
def test_one_planted_element_is_caught_and_located(monkeypatch, site, recipe_name):
    """One wrong element in the output of the site's chosen path (CuTeDSL or Triton) is reported
    against the next path down, with its index."""
    _require_triton_layer()
    recipe = gmlp.MXFP8Recipe() if recipe_name == "mxfp8" else None
    plan = gmlp.GroupedMLP(4, 64, 64, bias=True, recipe=recipe, device=kernel_device()).plan(
        torch.zeros(100, 64, device=kernel_device()))
    chosen, reference = plan.path(site), plan.references[site]
    where: list = []
    _plant_at(monkeypatch, site, chosen, where)
    with cross_check(action="raise"), pytest.raises(CrossCheckError) as error:
        _layer_step(recipe)
    message = str(error.value)
    assert f"cross-check: {site} ({SITES[site].op.value}) on {chosen.value} differs from {reference.value}" in message
    index = where[0]
    assert " 1 of " in message, message  # exactly the planted element
    axes = ("expert", "row", "column") if len(index) == 3 else ("row", "column")
    assert ", ".join(f"{axis} {value}" for axis, value in zip(axes, index)) in message, message


def test_warn_mode_keeps_going_and_names_the_values(monkeypatch):
    _require_triton_layer()
    where: list = []
    _plant_at(monkeypatch, "fc2", _chosen("fc2"), where)
    with cross_check(ops=["grouped_gemm"]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlp, x = _layer_step(gmlp.MXFP8Recipe())
    messages = [str(w.message) for w in caught if issubclass(w.category, CrossCheckWarning)]
    assert len(messages) == 1 and "fc2 (grouped_gemm)" in messages[0] and "got " in messages[0] and "want " in messages[0]
    assert x.grad is not None and mlp.w1.grad is not None  # the step finished


def test_settings_are_checked():
    with pytest.raises(ValueError, match=r"unknown names 'fc3'; valid are the site names \[.*'fc1'.*\] and the op "
                                         r"names \[.*'grouped_gemm'.*\]"):
        with cross_check(ops=["fc3", "fc1"]):
            pass
    with pytest.raises(ValueError, match="unknown names 'fc3', 'quantize'"):
        with cross_check(ops="quantize fc3".split()):
            pass
    with pytest.raises(ValueError, match="action must be"):
        with cross_check(action="ignore"):
            pass


@pytest.mark.parametrize("ops", ["fc1", "quantize x", "grouped_gemm"])
def test_one_name_as_a_string_is_one_name(ops):
    with cross_check(ops=ops) as settings:
        assert settings.ops == frozenset([ops])


@pytest.mark.parametrize("value,action", [("raise", "raise"), ("RAISE", "raise"), ("warn", "warn"), ("1", "warn"),
                                          ("yes", "warn"), ("On", "warn"), ("true", "warn"), ("0", None), ("no", None),
                                          ("off", None), ("False", None), ("", None)])
def test_environment_switch(monkeypatch, value, action):
    from gmlp.debug import active_settings

    monkeypatch.setenv("GMLP_CROSSCHECK", value)
    settings = active_settings()
    assert (settings.action if settings is not None else None) == action


def test_environment_switch_rejects_other_values(monkeypatch):
    from gmlp.debug import active_settings

    monkeypatch.setenv("GMLP_CROSSCHECK", "maybe")
    with pytest.raises(ValueError, match=r"GMLP_CROSSCHECK='maybe': expected one of warn, raise, 1/0, true/false"):
        active_settings()


@parametrize_quick("hidden,ffn,splits", [(96, 32, [0, 0, 0, 70]), (32, 96, [1, 31, 33, 1, 0, 45])],
                   ids=["all-in-last", "tiny-experts"])
def test_clean_runs_pass_on_other_shapes(hidden, ffn, splits):
    _require_triton_layer()
    device = kernel_device()
    torch.manual_seed(1)
    mlp = gmlp.GroupedMLP(len(splits), hidden, ffn, bias=True, device=device)
    x = torch.randn(sum(splits), hidden, device=device).bfloat16().requires_grad_()
    with cross_check(action="raise"):
        mlp(x, torch.tensor(splits, device=device)).backward(torch.randn(sum(splits), hidden, device=device).bfloat16())


def test_tolerance_override_replaces_the_derived_bound(monkeypatch):
    _require_triton_layer()
    _plant_at(monkeypatch, "fc2", _chosen("fc2"), [])
    with cross_check(ops=["fc2"], action="raise", tolerance=(10.0, 10.0)):  # |3v + 1| <= 10 + 10 |v|
        _layer_step(gmlp.MXFP8Recipe())
    with cross_check(ops=["fc2"], action="raise", tolerance=(0.0, 1e-3)), pytest.raises(CrossCheckError):
        _layer_step(gmlp.MXFP8Recipe())


def test_standalone_quantize_is_cross_checked(monkeypatch):
    _require_triton_layer()
    device = kernel_device()
    x = torch.randn(100, 64, device=device).bfloat16()
    with cross_check(action="raise"):
        gmlp.quantize_mxfp8(x, rowwise=True, columnwise=True)
    chosen = gmlp.plan_quantize(x).path
    real = gmlp.dispatch.quantize.launcher
    monkeypatch.setattr(gmlp.dispatch.quantize, "launcher",
                        lambda path, device: (lambda *a, **k: _planted(real(path, device)(*a, **k), []))
                        if path is chosen else real(path, device))
    with cross_check(action="raise"), pytest.raises(CrossCheckError, match=rf"quantize_mxfp8 on {chosen.value} differs"):
        gmlp.quantize_mxfp8(x, rowwise=True, columnwise=True)


def test_ops_on_the_last_path_are_said_once(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr("gmlp.debug.crosscheck._said_uncompared", set())
    mlp = gmlp.GroupedMLP(2, 64, 64)
    x, split_sizes = torch.randn(8, 64).bfloat16(), torch.tensor([3, 5])
    with cross_check(action="raise"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mlp(x, split_sizes)
        mlp(x, split_sizes)
    messages = [str(w.message) for w in caught if issubclass(w.category, CrossCheckWarning)]
    assert len(messages) == 1 and "(torch is the last path here)" in messages[0], messages
    assert all(f"{site} (" in messages[0] for site in mlp.plan(x).decisions)  # every op, backward ones included


def test_a_block_reaches_backward_threads_and_the_forwards_settings_its_backward(monkeypatch):
    """On a GPU autograd runs the backward in its own device thread, where the block's context
    variable is not set: the open block is seen there too; and a backward run after the block
    still uses the settings its forward ran under."""
    import threading

    seen = []
    with cross_check(action="raise") as settings:
        worker = threading.Thread(target=lambda: seen.append(gmlp.debug.active_settings()))
        worker.start()
        worker.join()
    assert seen == [settings] and gmlp.debug.active_settings() is None

    _require_triton_layer()
    where: list = []
    _plant_at(monkeypatch, "fc1 dgrad", _chosen("fc1 dgrad", experts=2), where)
    device = kernel_device()
    mlp = gmlp.GroupedMLP(2, 64, 64, device=device)
    x = torch.randn(40, 64, device=device).bfloat16().requires_grad_()
    with cross_check(action="raise"):
        y = mlp(x, torch.tensor([30, 10], device=device))
    with pytest.raises(CrossCheckError, match="fc1 dgrad"):
        y.backward(torch.randn_like(y))
