"""Device group offsets: exact for valid split sizes, in bounds and flagged for invalid ones."""

from __future__ import annotations

import pytest
import torch

from gmlp.mxfp8.routing import device_groups


def _prefix(values):
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


@pytest.mark.parametrize("splits", [[0, 37, 200, 63, 0], [300], [1, 31, 33, 1, 0, 105, 129]])
def test_valid_splits(splits):
    groups = device_groups(torch.tensor(splits), sum(splits))
    assert groups.row_start.tolist() == _prefix(splits)
    assert groups.tile_start.tolist() == _prefix([-(-m // 128) for m in splits])
    assert groups.block_start.tolist() == _prefix([-(-m // 32) for m in splits])
    assert bool(groups.valid)


@pytest.mark.parametrize("splits,rows", [([40, -8, 32], 64), ([10, 20], 64), ([64, 64], 64), ([-5], 0)])
def test_invalid_splits_stay_in_bounds(splits, rows):
    groups = device_groups(torch.tensor(splits), rows)
    assert not bool(groups.valid)
    starts = groups.row_start.tolist()
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] <= rows
    assert groups.tile_start[-1].item() <= (rows + 127 * len(splits)) // 128
