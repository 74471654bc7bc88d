"""The cross-check: clean runs pass, and one planted wrong element in any op's output is caught
and located. On the CPU the Triton kernels run in the interpreter and are checked against the
torch twins; on a GPU the same tests check the compiled kernels."""

from __future__ import annotations

import dataclasses
import math
import re
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


@pytest.mark.slow
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
    with cross_check(ops=ops):
        assert gmlp.debug.active_settings().ops == frozenset([ops])


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


@pytest.mark.slow
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


@pytest.mark.slow
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
    with cross_check(action="raise") as report:
        settings = gmlp.debug.active_settings()
        worker = threading.Thread(target=lambda: seen.append(gmlp.debug.active_settings()))
        worker.start()
        worker.join()
    assert seen == [settings] and seen[0].report is report and gmlp.debug.active_settings() is None

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


def _bounded(report, plan) -> dict:
    """site -> its record, asserting that each op was compared with the plan's next path down with
    no mismatch, bit for bit (quantizes, dequantizes) or within its bound (a finite largest error)."""
    records = {}
    for record in report.compared:
        assert (record.path, record.reference) == (plan.path(record.site).value,
                                                   plan.references[record.site].value), record
        assert record.calls >= 1 and record.outputs and record.mismatches == 0, record
        bitwise = "quantize" in record.op
        for name, output in record.outputs.items():
            assert output.elements > 0 and output.bitwise == bitwise, (record.site, name, output)
            if not bitwise:
                assert math.isfinite(output.max_error) and 0 <= output.bound_used <= 1, (record.site, name, output)
        records[record.site] = record
    return records


def test_a_clean_runs_report_lists_every_op_within_its_bound():
    """The block's report lists every op of the step, forward and backward (the backward run after
    the block: its forward's settings, so its report), each on triton against torch with every
    output's largest error inside its bound; the table names them all."""
    _require_triton_layer()
    device = kernel_device()
    torch.manual_seed(0)
    splits = [37, 0, 60, 3]
    mlp = gmlp.GroupedMLP(len(splits), 64, 64, bias=True, recipe=gmlp.MXFP8Recipe(), device=device)
    split_sizes = torch.tensor(splits, device=device)
    x = torch.randn(sum(splits), 64, device=device).bfloat16().requires_grad_()
    probs = torch.rand(sum(splits), device=device, requires_grad=True)
    with cross_check(action="raise") as report:
        y = mlp(x, split_sizes, probs)
    y.backward(torch.randn_like(y))
    plan = mlp.plan(x, split_sizes)
    records = _bounded(report, plan)
    assert set(records) == set(plan.decisions) and not report.uncompared and report.mismatches == 0
    assert records["dequantize"].calls == 6  # x and a for FC1, FC2; dh for FC1 dgrad; dh, x, a for the wgrads
    assert {name for name in records["fc2 dgrad"].outputs} == {"dh_rowwise", "dh_columnwise", "dprobs", "db1"}
    table = str(report)
    assert table.startswith(f"cross-check: {len(plan.decisions)} ops compared (") and "bit for bit" in table
    assert "not compared:" not in table
    assert all(f"  {site} " in table for site in plan.decisions), table


def test_the_report_records_a_planted_error_that_raises(monkeypatch):
    """The error is raised as before, and the report holds the mismatch: one element, past its bound."""
    _require_triton_layer()
    _plant_at(monkeypatch, "fc2", _chosen("fc2"), [])
    with pytest.raises(CrossCheckError, match="fc2"):
        with cross_check(action="raise") as report:
            _layer_step(gmlp.MXFP8Recipe())
    fc2 = report.compared[-1]  # the last op compared: the step stopped there
    assert fc2.site == "fc2" and fc2.mismatches == report.mismatches == 1 and fc2.outputs["out"].bound_used > 1
    header = r"cross-check: \d+ ops compared \(\d+ calls, 1 mismatching element\), 0 not compared\n"
    assert re.match(header, str(report)), str(report)


def test_the_report_of_a_run_on_torch_lists_every_op_as_not_compared(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    mlp = gmlp.GroupedMLP(2, 64, 64, bias=True)
    x, split_sizes = torch.randn(8, 64).bfloat16().requires_grad_(), torch.tensor([3, 5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CrossCheckWarning)  # said once per process: see the test above
        with cross_check(action="raise") as report:
            mlp(x, split_sizes).backward(torch.randn(8, 64).bfloat16())
    assert not report.compared
    assert {record.site for record in report.uncompared} == set(mlp.plan(x, split_sizes).decisions)
    assert all((record.path, record.reason) == ("torch", "torch is the last path here") and record.calls >= 1
               for record in report.uncompared), report.uncompared
    assert {record.site: record.calls for record in report.uncompared}["dequantize"] == 6
    assert str(report).splitlines()[:2] == [f"cross-check: 0 ops compared (0 calls, 0 mismatching elements), "
                                            f"{len(report.uncompared)} not compared", "not compared:"]


def test_the_report_measures_each_output_against_its_bound():
    """Per output, over calls: elements, mismatches, the largest |got - want| and the largest share
    of its element's bound (both NaN: no error; a zero error against a zero bound: none either)."""
    from gmlp.debug.compare import Comparison, bitwise, within_bound

    want = torch.tensor([1.0, 2.0, 0.0, float("nan")])
    delta = torch.tensor([0.5, 0.5, 0.0, 0.0])
    report = gmlp.debug.CrossCheckReport()
    for error in (0.25, 0.125, 1.0):  # the last one past its bound (0.5 + 2 * 2**-24)
        comparison = Comparison()
        within_bound(comparison, "out", want + torch.tensor([error, 0.0, 0.0, 0.0]), want, delta)
        bitwise(comparison, "exact", want, want.clone())
        report.add("fc2", "grouped_gemm", "triton", "torch", comparison)
    (record,) = report.compared
    out, exact = record.outputs["out"], record.outputs["exact"]
    assert (record.calls, out.elements, out.mismatches, out.max_error) == (3, 12, 1, 1.0)
    assert out.bound_used == pytest.approx(1.0 / (0.5 + 2.0**-23))
    assert exact.bitwise and (exact.elements, exact.mismatches, exact.max_error) == (12, 0, None)
    assert "bit for bit" in str(report) and report.mismatches == 1
    report.clear()
    assert not report.compared and str(report).startswith("cross-check: 0 ops compared")


def test_the_environment_setting_records_in_the_process_report(monkeypatch):
    """GMLP_CROSSCHECK's checks fill ``environment_report()``; a block's go to the block's report."""
    _require_triton_layer()
    monkeypatch.setenv("GMLP_CROSSCHECK", "raise")
    environment = gmlp.debug.environment_report()
    environment.clear()
    x = torch.randn(100, 64, device=kernel_device()).bfloat16()
    try:
        gmlp.quantize_mxfp8(x, rowwise=True, columnwise=True)
        (record,) = environment.compared
        assert (record.site, record.calls, record.mismatches) == ("quantize_mxfp8", 1, 0)
        with cross_check() as report:
            gmlp.quantize_mxfp8(x, rowwise=True)
        assert environment.compared[0].calls == 1 and report.compared[0].calls == 1
    finally:
        environment.clear()


def test_both_orientations_of_a_weight_are_compared_bit_for_bit():
    """The FP8 blockwise weight quantize's pair (W's tiles and W^T's from one read, a weight
    cache's "update"): each orientation compared bit for bit, a byte wrong in one named there."""
    from gmlp.debug.compare import Comparison, bitwise
    from gmlp.fp8_blockwise.reference import quantize_weights_fp8_blockwise_ref

    w = torch.randn(2, 256, 128).bfloat16()
    want = quantize_weights_fp8_blockwise_ref(w, both_orientations=True)
    data = want.transposed.data.clone()
    data.view(torch.uint8)[1, 5, 7] ^= 0x40
    got = dataclasses.replace(want, transposed=dataclasses.replace(want.transposed, data=data))
    comparison = Comparison()
    bitwise(comparison, "out", got, want)
    assert {name: record[0] for name, record in comparison.outputs.items()} == {"out.tiles": 0, "out.transposed": 1}
