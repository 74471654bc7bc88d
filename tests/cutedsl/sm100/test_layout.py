"""The SM100 kernels' row padding and gate/up interleaving, against plain loops."""

from __future__ import annotations

import pytest
import torch

from gmlp.cutedsl.sm100.layout import (
    GLU_BLOCK,
    M_ALIGNED,
    deinterleave_gate_up,
    from_padded,
    interleave_gate_up,
    padded_group_sizes,
    padded_rows,
    split_interleaved,
    to_padded,
)


@pytest.mark.parametrize("splits", [[0, 37, 256, 1, 300, 0], [512], [0, 0, 0], [255, 257]], ids=str)
def test_padded_rows_match_a_loop(splits):
    tokens = sum(splits)
    rows = padded_rows(torch.tensor(splits), tokens)
    ends, start, index = [], 0, []
    for m in splits:
        index += list(range(start, start + m))
        start += -(-m // M_ALIGNED) * M_ALIGNED
        ends.append(start)
    assert rows.offsets.dtype == torch.int32 and rows.offsets.tolist() == ends
    assert rows.index.tolist() == index
    assert rows.num_rows % M_ALIGNED == 0 and rows.num_rows >= (ends[-1] if ends else 0)
    sizes = [b - a for a, b in zip([0] + ends, ends)] + [rows.num_rows - ends[-1]]
    assert padded_group_sizes(rows.offsets, rows.num_rows).tolist() == sizes
    x = torch.randn(tokens, 8)
    padded = to_padded(x, rows)
    assert torch.equal(from_padded(padded, rows), x)
    assert float(padded.abs().sum()) == pytest.approx(float(x.abs().sum()))  # padding rows are zeros


def test_gate_up_interleaving():
    experts, ffn, hidden = 2, 3 * GLU_BLOCK, 5
    w1 = torch.randn(experts, 2 * ffn, hidden)
    interleaved = interleave_gate_up(w1)
    for block in range(ffn // GLU_BLOCK):
        gate = slice(block * GLU_BLOCK, (block + 1) * GLU_BLOCK)
        assert torch.equal(interleaved[:, 2 * block * GLU_BLOCK:(2 * block + 1) * GLU_BLOCK], w1[:, gate])
        assert torch.equal(interleaved[:, (2 * block + 1) * GLU_BLOCK:(2 * block + 2) * GLU_BLOCK], w1[:, ffn:][:, gate])
    # the kernels' C = x @ interleaved^T; split_interleaved gives back gmlp's [gate | up] columns
    x = torch.randn(4, hidden)
    c = x @ interleaved[0].t()
    assert torch.equal(split_interleaved(c), x @ w1[0].t())
    assert torch.equal(deinterleave_gate_up(interleaved), w1)
    with pytest.raises(ValueError, match="multiple of 32"):
        interleave_gate_up(torch.zeros(1, 48, 4))
