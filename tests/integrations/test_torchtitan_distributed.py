"""gmlp's experts under torchtitan's expert parallelism and under FSDP2, two CPU processes over
gloo (``tests/support/torchtitan_workers.py``), each rank against the single-process MoE.

What gloo cannot run: under torchtitan's default spmd_types backend, the EP dispatcher exchanges
tokens with ``torch.distributed.all_to_all`` of a list of unequal chunks, which
``ProcessGroupGloo::alltoall`` refuses ("invalid tensor size at index 1"), so that case routes
round-robin (torchtitan's debug balanced routing). Under partial_dtensor the exchange is
``all_to_all_single`` with split sizes, which gloo runs: those tests keep the router's own,
uneven routing.

All of them are ``slow`` (processes started, gloo groups formed): ``-m "not slow"`` leaves them out.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

from tests.support.torchtitan_workers import expert_parallel_worker, fsdp_worker, run_workers  # noqa: E402

pytestmark = pytest.mark.slow
RECIPES = ["bf16", "mxfp8"]


@pytest.mark.parametrize("spmd_backend", ["spmd_types", "partial_dtensor"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_expert_parallel_moe_equals_one_process(recipe, spmd_backend):
    run_workers(expert_parallel_worker, 2, recipe, spmd_backend)


@pytest.mark.parametrize("recipe", RECIPES)
def test_fully_sharded_moe_equals_one_process(recipe):
    run_workers(fsdp_worker, 2, recipe)
