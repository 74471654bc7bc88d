"""The torchao side of ``bench mlp`` (``gmlp.bench.torchao_rowwise``): which routings it takes. No GPU."""

import torch

from gmlp.bench import mlp, torchao_rowwise


def test_the_side_takes_only_routings_of_whole_16_row_groups():
    assert torchao_rowwise.unsupported_reason(mlp.split_sizes_for("balanced", 32, 32768, "cpu")) is None
    reason = torchao_rowwise.unsupported_reason(mlp.split_sizes_for("skewed", 32, 32768, "cpu"))
    assert "a multiple of 16" in reason
    assert torchao_rowwise.unsupported_reason(torch.tensor([16, 0, 32])) is None
    assert torchao_rowwise.SIDE in mlp.SIDES
