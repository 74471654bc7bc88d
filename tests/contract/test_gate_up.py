"""``gmlp.contract.gate_up``: every layout's gate and up are views of the stored weights, and a weight
that does not fit the layout it is said to have is refused with what was expected."""

from __future__ import annotations

import pytest
import torch

from gmlp.contract.gate_up import GateUp, GateUpLayout, gate_up_views
from tests.support.cases import stored_gate_up

E, F, H = 3, 4, 8


def _values():
    return torch.randn(E, F, H), torch.randn(E, F, H)


@pytest.mark.parametrize("layout", list(GateUpLayout), ids=lambda layout: layout.value)
def test_views_hold_the_gate_and_up_values_in_place(layout):
    gate, up = _values()
    stored = stored_gate_up(layout, gate, up)
    views = gate_up_views(layout, *stored)
    assert torch.equal(views.gate, gate) and torch.equal(views.up, up) and views.shape == (E, F, H)
    gate_before = gate.clone()
    stored[0].add_(1)  # a write through the stored weight shows in the views: nothing was copied
    assert torch.equal(views.gate, gate_before + 1)


def test_the_layouts_mismatches_are_named():
    gate, up = _values()
    with pytest.raises(ValueError, match=r"w1 in the HALVES layout must be \(E, 2F, H\), got torch.float32 \(3, 5, 8\)"):
        gate_up_views(GateUpLayout.HALVES, torch.zeros(E, 5, H))
    with pytest.raises(ValueError, match=r"INTERLEAVED layout must be \(E, F, 2, H\)"):
        gate_up_views(GateUpLayout.INTERLEAVED, torch.zeros(E, F, 3, H))
    with pytest.raises(ValueError, match="w3 .* SEPARATE layout only, got layout HALVES"):
        gate_up_views(GateUpLayout.HALVES, torch.cat([gate, up], 1), up)
    with pytest.raises(ValueError, match="w3 .* SEPARATE layout only, got layout SEPARATE and w3=None"):
        gate_up_views(GateUpLayout.SEPARATE, gate)
    with pytest.raises(TypeError, match="layout must be a GateUpLayout, got str"):
        gate_up_views("halves", gate)


def test_gate_and_up_must_be_alike_with_contiguous_rows():
    gate, up = _values()
    with pytest.raises(ValueError, match="must match in shape"):
        GateUp(gate, up[:, :2])
    with pytest.raises(ValueError, match="must match in shape, dtype"):
        GateUp(gate, up.double())
    with pytest.raises(ValueError, match=r"GateUp.up must have contiguous rows \(last stride 1\)"):
        GateUp(gate, up.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(TypeError, match=r"GateUp.gate must be an \(E, F, H\) tensor, got torch.float32 \(4, 8\)"):
        GateUp(gate[0], up)
