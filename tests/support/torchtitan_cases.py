"""A small torchtitan MoE layer, stock or with gmlp's experts, for the torchtitan tests."""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

GMLP_EXPERTS = "gmlp.integrations.torchtitan.gmlp_experts"
DIM, HIDDEN, EXPERTS, TOP_K = 64, 96, 4, 2


def moe_config(experts: int = EXPERTS, dim: int = DIM, hidden: int = HIDDEN, balanced: bool = False):
    """torchtitan's ``MoE.Config``: a softmax top-2 router (with ``balanced``, its debug round-robin
    routing: token i's k-th choice is expert (2i + k) mod E), the standard (all-to-all) dispatcher
    and stock ``GroupedExperts``, every weight drawn from N(0, 0.08^2)."""
    from torchtitan.models.common.config_utils import make_moe_config, make_routed_experts_config, make_router_config

    init = functools.partial(nn.init.normal_, std=0.08)
    router = make_router_config(dim=dim, num_experts=experts, gate_param_init={"weight": init}, top_k=TOP_K,
                                score_func="softmax", route_norm=True)
    routed = make_routed_experts_config(dim=dim, hidden_dim=hidden, num_experts=experts, top_k=TOP_K,
                                        param_init={name: init for name in ("w1_EFD", "w2_EDF", "w3_EFD")},
                                        comm_backend="standard")
    router._debug_force_load_balance = balanced
    return make_moe_config(num_experts=experts, router=router, routed_experts=routed)


def overridden(config, **kwargs):
    """A copy of ``config`` with gmlp's experts, applied by torchtitan's override mechanism (what
    ``--override.imports gmlp.integrations.torchtitan.gmlp_experts=<kwargs>`` does)."""
    from torchtitan.config.override import OverrideConfig, apply_overrides

    config = copy.deepcopy(config)
    applied = apply_overrides(OverrideConfig(imports=[(GMLP_EXPERTS, kwargs)]), config)
    assert len(applied) == 1 and "GmlpGroupedExperts.Config" in applied[0], applied
    return config


def built(config, seed: int = 0, device: torch.device | str = "cpu"):
    """The module of ``config``, its parameters and buffers initialized by torchtitan's
    ``init_states`` from ``seed``."""
    torch.manual_seed(seed)
    with torch.device(device):
        module = config.build()
        module.init_states()
    return module


def import_model_package(name: str):
    """torchtitan's model package ``torchtitan.models.<name>``, or pytest.skip with the import
    error: torchtitan 0.3.0's model packages import FSDP names of a newer torch than 2.11 (the
    H200 machine's), where its ``models.common`` (MoE, dispatchers) still works."""
    import importlib

    import pytest

    try:
        return importlib.import_module(f"torchtitan.models.{name}")
    except ImportError as error:
        pytest.skip(f"torchtitan.models.{name} does not import with torch {torch.__version__}: {error}")

