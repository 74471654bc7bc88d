"""The pieces behind ``python -m gmlp.bench torchtitan``'s figures: the token source, the gap
statistics of the summary, and the attention core the runs use."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

from gmlp.bench.torchtitan import (  # noqa: E402
    SUCCESSORS,
    CausalSDPAttention,
    MarkovTokens,
    profiled_kernels,
    training_step,
)
from gmlp.bench.torchtitan_report import moving_gap, summary  # noqa: E402


def test_the_token_source_is_its_markov_chain_and_the_same_every_time():
    first, second = (MarkovTokens(16, 3, 2, 40, seed=5, device=torch.device("cpu")) for _ in range(2))
    for step in range(3):
        assert torch.equal(first.batch(step), second.batch(step))
        assert first.batch(step).shape == (2, 41)
    tokens = first.tokens
    assert (first.table[tokens[:, :-1], tokens[:, 1:]] > 0).all()  # every step goes to a successor
    assert (first.table > 0).sum(1).le(SUCCESSORS).all()
    assert 0 < first.entropy < math.log(SUCCESSORS)  # weighted successors: below the uniform choice's


def test_summary_gaps_and_ratios():
    runs = {"stock": {"loss": [2.0, 1.0, 1.0, 1.0], "tokens_per_s": 100.0},
            "other": {"loss": [2.2, 1.2, 1.0, 1.0], "tokens_per_s": 50.0}}
    assert moving_gap(runs["other"]["loss"], runs["stock"]["loss"], 2) == pytest.approx([0.2, 0.1, 0.0])
    got = summary(runs, 2)["other"]
    assert got["max_moving_gap_to_stock"] == pytest.approx(0.2)
    assert got["final_loss"] == 1.0 and got["final_gap_to_stock_relative"] == 0.0
    assert got["tokens_per_s_vs_stock"] == 0.5
    short = summary(runs, 20)  # a window longer than the run: means over the steps there are
    assert short["stock"]["final_gap_to_stock_relative"] == 0.0
    assert short["other"]["final_gap_to_stock_relative"] == pytest.approx(5.4 / 5.0 - 1)


def test_the_causal_core_is_causal_attention_and_refuses_masks():
    core = CausalSDPAttention(CausalSDPAttention.Config())
    q, k, v = (torch.randn(2, 12, 4, 8) for _ in range(3))  # (B, L, N, H)
    out = core(q, k, v)
    scores = torch.einsum("blnh,bmnh->bnlm", q, k) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bnlm,bmnh->blnh", scores.softmax(-1), v)
    torch.testing.assert_close(out, want)
    with pytest.raises(NotImplementedError, match="one causal document per sequence only"):
        core(q, k, v, attention_masks=object())


class _Bigram(torch.nn.Module):
    """A model with torchtitan's call: tokens and positions in, logits out."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, tokens, positions=None):
        assert positions.shape == tokens.shape and (positions[:, 1:] - positions[:, :-1] == 1).all()
        return self.table(tokens)


def test_a_training_step_lowers_the_loss_and_a_cpu_profile_has_no_kernels():
    torch.manual_seed(0)
    model = _Bigram(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    tokens = torch.randint(8, (2, 17))
    with torch.no_grad():
        want = torch.nn.functional.cross_entropy(model.table(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    first = training_step(model, optimizer, schedule, tokens, micro_batch=2)
    assert first == want  # the next-token loss of the weights before the step
    assert training_step(model, optimizer, schedule, tokens, micro_batch=2) < first
    assert all(p.grad is None for p in model.parameters())  # zeroed for the next step
    assert profiled_kernels(lambda: training_step(model, optimizer, schedule, tokens, 2), torch.device("cpu")) == []


def test_a_step_in_micro_batches_is_the_step_on_their_rows_together():
    """Gradient accumulation: micro-batches of equal size, each loss over their count, give the
    whole batch's mean loss and gradient (float64, so only the sums' order rounds)."""
    tokens = torch.randint(8, (4, 17), generator=torch.Generator().manual_seed(1))
    steps = {}
    for micro_batch in (4, 1):
        torch.manual_seed(0)
        model = _Bigram(8).double()
        initial = model.table.weight.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        steps[micro_batch] = training_step(model, optimizer, schedule, tokens, micro_batch), model.table.weight
        assert not torch.equal(model.table.weight, initial)  # the step moved the weights
    (whole_loss, whole_weight), (micro_loss, micro_weight) = steps[4], steps[1]
    torch.testing.assert_close(micro_loss, whole_loss)
    torch.testing.assert_close(micro_weight, whole_weight)


def _results(seed: int, runs: dict, window: int = 2) -> dict:
    """A results file's fields that ``--table`` reads, one experiment (debug model, CPU)."""
    return {"settings": {"model": "debug", "layers_built": 8, "batch": 1, "seq_len": 64, "steps": 4, "seed": seed,
                         "window": window},
            "environment": {"device": "cpu", "commit": "0123456789", "nvidia-cutlass-dsl": "not installed"},
            "runs": runs}


def _run(losses: list[float], tokens_per_s: float, peak: float | None = 2.0, share: float | None = 0.5) -> dict:
    return {"loss": losses, "tokens_per_s": tokens_per_s, "peak_memory_gb": peak, "mfu": None,
            "profile": {"experts_share": share}}


def test_the_table_gathers_runs_of_one_experiment_from_several_files_and_judges_gaps_by_the_spread(tmp_path):
    from gmlp.bench.torchtitan_report import bars, curves, table

    stock = [2.0, 1.0, 1.0, 1.0]
    files = {"seed0-stock-fused.json": _results(0, {"stock": _run(stock, 100.0),
                                                   "torchtitan-fused": _run([2.0, 1.2, 1.0, 1.0], 110.0)}),
             "seed0-gmlp.json": _results(0, {"gmlp-bf16": _run([2.0, 1.1, 1.0, 1.0], 150.0, peak=1.0)}),
             "seed1.json": _results(1, {"stock": _run(stock, 300.0),
                                         "torchtitan-fused": _run([2.0, 1.0, 1.0, 1.0], 330.0),
                                         "gmlp-bf16": _run([2.6, 1.0, 1.0, 1.0], 450.0, peak=1.0)})}
    for name, results in files.items():
        (tmp_path / name).write_text(json.dumps(results))
    cells = [[cell.strip() for cell in line.strip("|").split("|")]
             for line in table(sorted(tmp_path.glob("*.json"))).splitlines()[2:]]
    rows = {row[1]: row for row in cells}
    # columns: experiment, run, seeds, tokens/s, vs stock, MFU, peak, vs stock, share, final loss, max gap, within
    assert rows["stock"][2:5] == ["2", "200", "1.00"]
    assert rows["gmlp-bf16"][2:5] == ["2", "300", "1.50"] and rows["gmlp-bf16"][6:8] == ["1.0", "0.50"]
    assert rows["torchtitan-fused"][10] == "0.1000"  # seed 0's (0.2 + 0) / 2, the larger of the two seeds
    assert rows["gmlp-bf16"][10:12] == ["0.3000", "no"]  # seed 1's first window: (0.6 + 0) / 2 > the spread
    assert rows["torchtitan-fused"][11] == "yes" and rows["stock"][11] == ""
    assert cells[-1][1] == "bf16 spread: torchtitan-fused's max gap over 2 seeds" and cells[-1][10] == "0.1000"
    assert bars(sorted(tmp_path.glob("*.json")), tmp_path / "bars.png").stat().st_size > 0
    assert curves(sorted(tmp_path.glob("*.json")), tmp_path / "curves.png").stat().st_size > 0
    assert rows["stock"][5] == "n/a"  # no MFU on a CPU


def test_the_table_refuses_a_run_twice_for_one_seed(tmp_path):
    from gmlp.bench.torchtitan_report import table

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(_results(0, {"stock": _run([1.0, 1.0], 1.0)})))
    with pytest.raises(ValueError, match=r"run 'stock' of seed 0 is in two files .*b.json"):
        table(sorted(tmp_path.glob("*.json")))


def test_the_table_keeps_micro_batched_steps_apart_and_names_them(tmp_path):
    from gmlp.bench.torchtitan_report import table

    accumulated = _results(0, {"stock": _run([1.0, 1.0], 8.0)})
    accumulated["settings"]["accumulate"] = 8
    (tmp_path / "one.json").write_text(json.dumps(_results(0, {"stock": _run([1.0, 1.0], 1.0)})))
    (tmp_path / "eight.json").write_text(json.dumps(accumulated))  # the same run and seed: another experiment
    experiments = [line.split("|")[1].strip() for line in table(sorted(tmp_path.glob("*.json"))).splitlines()[2:]
                   if "spread" not in line]
    assert sorted(experiments) == ["debug (8), 1 x 64 x 8 micro-batches, 4 steps, cpu, gmlp 0123456, Triton only",
                                   "debug (8), 1 x 64, 4 steps, cpu, gmlp 0123456, Triton only"]


def test_the_parts_table_averages_each_part_per_step_over_seeds_and_skips_runs_without_parts(tmp_path):
    from gmlp.bench.torchtitan_report import parts_table

    def parted(step_ms: float, experts: float, optimizer: float) -> dict:
        run = _run([1.0, 1.0], 1.0)
        run["step_ms"] = step_ms
        run["profile"] = {"steps": 2, "experts_share": 0.5,
                          "parts_ms": {"experts": 2 * experts, "optimizer": 2 * optimizer, "other": 0.0}}
        return run

    (tmp_path / "old.json").write_text(json.dumps(_results(0, {"stock": _run([1.0, 1.0], 1.0)})))
    assert parts_table([tmp_path / "old.json"]) is None  # a file from before parts_ms
    (tmp_path / "s0.json").write_text(json.dumps(_results(0, {"gmlp-bf16": parted(10.0, 1.0, 3.0)})))
    (tmp_path / "s1.json").write_text(json.dumps(_results(1, {"gmlp-bf16": parted(12.0, 3.0, 5.0)})))
    lines = parts_table(sorted(tmp_path.glob("s*.json"))).splitlines()
    assert lines[0] == "| experiment | run | step ms | experts | optimizer | other |"
    assert lines[2].endswith("| gmlp-bf16 | 11.0 | 2.0 (33%) | 4.0 (67%) | 0.0 (0%) |")


def test_the_halfway_step_is_where_the_moving_mean_first_reaches_halfway_down_stocks_curve():
    from gmlp.bench.torchtitan_report import halfway_step

    stock = [10.0, 10.0, 6.0, 2.0, 2.0, 2.0]  # first window mean 10, last 2: halfway is 6
    assert halfway_step(stock, stock, 2) == 3  # (6 + 2) / 2 = 4 <= 6 at the window ending at step 3
    assert halfway_step([10.0, 10.0, 10.0, 10.0, 2.0, 2.0], stock, 2) == 4  # (10 + 2) / 2 = 6, one step later
    assert halfway_step([10.0] * 6, stock, 2) is None  # never learns


def test_a_gmlp_run_under_gmlp_settings_is_its_own_row_beside_the_plain_run(tmp_path):
    from gmlp.bench.torchtitan_report import table

    stock = [10.0, 10.0, 6.0, 2.0]
    plain = _results(0, {"stock": _run(stock, 1.0), "gmlp-bf16": _run(stock, 1.0)})
    variant = _results(0, {"gmlp-bf16": _run([10.0] * 4, 1.0), "stock": _run(stock, 1.0)})
    variant["environment"]["gmlp_settings"] = {"GMLP_COMMIT": "0123456", "GMLP_BACKEND": "triton"}
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    (tmp_path / "variant.json").write_text(json.dumps({**variant, "runs": {"gmlp-bf16": variant["runs"]["gmlp-bf16"]}}))
    rows = {row[1]: row for row in ([cell.strip() for cell in line.strip("|").split("|")]
                                    for line in table(sorted(tmp_path.glob("*.json"))).splitlines()[2:])}
    assert set(rows) >= {"stock", "gmlp-bf16", "gmlp-bf16 [GMLP_BACKEND=triton]"}  # the commit is no setting
    assert rows["gmlp-bf16"][12] == "0: 3" and rows["gmlp-bf16 [GMLP_BACKEND=triton]"][12] == "0: -"
    assert rows["stock"][12] == "0: 3"


def test_training_collects_garbage_as_torchtitans_trainer_does_and_restores_automatic_collection():
    import gc

    from gmlp.bench.torchtitan import trainer_garbage_collection

    collected = []
    gc.callbacks.append(lambda phase, info: collected.append(info["generation"]) if phase == "start" else None)
    try:
        assert gc.isenabled()
        with trainer_garbage_collection(3) as collect:
            assert not gc.isenabled() and collected == [1]  # automatic collection off, one collection first
            ran = [collect(step) for step in range(1, 8)]
            assert ran == [False, False, True, False, False, True, False] and collected == [1, 1, 1]
        assert gc.isenabled()
        gc.disable()
        with trainer_garbage_collection(3):
            pass
        assert not gc.isenabled()  # as it was
    finally:
        gc.enable()
        gc.callbacks.pop()


def test_train_runs_its_steps_under_the_trainers_garbage_collection(monkeypatch):
    import argparse
    import gc

    import gmlp.bench.torchtitan as bench

    calls = []
    real = bench.trainer_garbage_collection

    def recorded(every):  # torchtitan's handler, each step's call recorded, automatic collection seen off
        with real(every) as collect:
            yield lambda step: calls.append((step, gc.isenabled())) or collect(step)

    monkeypatch.setattr(bench, "trainer_garbage_collection", contextlib.contextmanager(recorded))
    args = argparse.Namespace(steps=4, warmup=1, batch=2, accumulate=1, seq_len=16, profile_steps=1, gc_every=2,
                              lr=0.1)
    data = bench.MarkovTokens(8, args.steps, args.batch, args.seq_len, 0, torch.device("cpu"))
    result = bench.train("stock", _Bigram(8), data, args, progress=lambda line: None)
    assert calls == [(1, False), (2, False), (3, False), (4, False)] and gc.isenabled()
    assert len(result["loss"]) == len(result["step_host_ms"]) == 4 and result["tokens_per_s"] > 0


def test_the_kernel_speed_is_stocks_kernel_time_per_profiled_step_over_the_runs(tmp_path):
    from gmlp.bench.torchtitan_report import table

    def profiled(kernels_ms: float | None, steps: int) -> dict:
        run = _run([1.0, 1.0], 1.0)
        run["profile"] = {"experts_share": 0.5, "kernels_ms": kernels_ms, "steps": steps}
        return run

    (tmp_path / "a.json").write_text(json.dumps(_results(0, {"stock": profiled(240.0, 2), "gmlp-bf16": profiled(100.0, 1),
                                                            "torchtitan-fused": profiled(None, 2)})))
    rows = {row[1]: row for row in ([cell.strip() for cell in line.strip("|").split("|")]
                                    for line in table([tmp_path / "a.json"]).splitlines()[2:])}
    assert rows["gmlp-bf16"][13] == "1.20"  # stock's 120 ms a step over gmlp's 100
    assert rows["stock"][13] == "1.00" and rows["torchtitan-fused"][13] == "n/a"  # no kernels: a CPU run
