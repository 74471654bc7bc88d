"""The pieces behind ``python -m gmlp.bench torchtitan``'s figures: the token source, the gap
statistics of the summary, and the attention core the runs use."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

from gmlp.bench.torchtitan import (  # noqa: E402
    SUCCESSORS,
    CausalSDPAttention,
    MarkovTokens,
    moving_gap,
    profiled_kernels,
    summary,
    training_step,
)


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
    first = training_step(model, optimizer, schedule, tokens)
    assert first == want  # the next-token loss of the weights before the step
    assert training_step(model, optimizer, schedule, tokens) < first
    assert all(p.grad is None for p in model.parameters())  # zeroed for the next step
    assert profiled_kernels(lambda: training_step(model, optimizer, schedule, tokens), torch.device("cpu")) == []
