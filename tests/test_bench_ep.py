"""``torchrun -m gmlp.bench ep`` on two gloo CPU ranks against one rank with the same global batch:
the same losses (the experts see the same rows; only FSDP's reductions are summed in another
order). Round-robin routing: gloo's all-to-all needs equal splits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

STEPS = 2


def _run(tmp_path, ranks: int) -> dict:
    out = tmp_path / f"ranks{ranks}"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "gmlp.bench", "ep", "--device", "cpu", "--balanced", "--runs", "gmlp-bf16",
               "--steps", str(STEPS), "--warmup", "1", "--window", "1", "--batch", str(2 // ranks),
               "--seq-len", "32", "--out", str(out)]
    env = {**os.environ, "GMLP_BACKEND": "torch"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (path,) = out.glob("ep*-of-*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_two_expert_parallel_ranks_train_as_one(tmp_path):
    two, one = _run(tmp_path, 2), _run(tmp_path, 1)
    assert two["settings"]["ep"] == 2 and one["settings"]["ep"] == 1 and two["complete"]
    got, want = two["runs"]["gmlp-bf16"]["loss"], one["runs"]["gmlp-bf16"]["loss"]
    assert len(got) == STEPS
    assert got[0] == pytest.approx(want[0], abs=1e-4)  # the same weights and tokens: rounding apart
    assert got == pytest.approx(want, abs=1e-3)
