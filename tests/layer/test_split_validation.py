"""Bad split sizes never give a result: the forward op validates them (gmlp.layer.autograd.validate_split_sizes).
On the CPU a ValueError naming them, eagerly, under torch.compile and from the op itself; on a GPU a
device-side assert (run in a subprocess: it ends the CUDA context), or with GMLP_VALIDATE=1 a
synchronous ValueError, which a CUDA graph capture refuses clearly."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo

import gmlp
from tests.support.cases import parametrize_quick

RECIPES = [None, gmlp.MXFP8Recipe()]
RECIPE_IDS = ["bf16", "mxfp8"]
TOKENS = 24
BAD_SPLITS = {  # (sizes, what the message says)
    "sum-too-large": ([10, 0, 20], r"split_sizes must sum to x's row count 24, got sum=30 from \[10, 0, 20\]"),
    "sum-too-small": ([10, 0, 10], r"split_sizes must sum to x's row count 24, got sum=20 from \[10, 0, 10\]"),
    "negative": ([30, -6, 0], r"split_sizes must be non-negative, got \[30, -6, 0\]"),
}
REPO = pathlib.Path(__file__).resolve().parents[2]


def _module_and_input(recipe, device="cpu"):
    torch.manual_seed(0)
    mlp = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, device=device)
    x = torch.randn(TOKENS, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    return mlp, x


@pytest.mark.parametrize("bad", list(BAD_SPLITS), ids=list(BAD_SPLITS))
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_bad_split_sizes_raise_on_the_cpu(recipe, bad):
    sizes, message = BAD_SPLITS[bad]
    mlp, x = _module_and_input(recipe)
    with pytest.raises(ValueError, match=message):
        mlp(x, torch.tensor(sizes))


@parametrize_quick("bad", list(BAD_SPLITS), ids=list(BAD_SPLITS))
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_bad_split_sizes_raise_from_the_op_and_under_compile(recipe, bad):
    """The check is inside the forward op: the op called directly and a compiled module (whose
    graph holds the op) raise the same ValueError, at run time."""
    sizes, message = BAD_SPLITS[bad]
    mlp, x = _module_and_input(recipe)
    mlp(x, torch.tensor([10, 0, 14]))  # good sizes: fine
    with pytest.raises(ValueError, match=message):
        torch.ops.gmlp.grouped_mlp_forward(x, torch.tensor(sizes), None, mlp.w1, None, None, mlp.w2, None, [],
                                           mlp._encoded_config(None))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(mlp, fullgraph=True, backend="aot_eager", dynamic=True)
        compiled(x, torch.tensor([0, 24, 0]))  # compiles with good sizes
        with pytest.raises(ValueError, match=message):
            compiled(x, torch.tensor(sizes))
    finally:
        torch._dynamo.reset()


# -- GPU ---------------------------------------------------------------------------------------

_CUDA_SCRIPT = """
import torch, gmlp
recipe = {recipe}
mlp = gmlp.GroupedMLP(3, 64, 64, recipe=recipe, device="cuda")
x = torch.randn(24, 64, device="cuda", dtype=torch.bfloat16)
y = mlp(x, torch.tensor({sizes}, device="cuda"))
torch.cuda.synchronize()
print("NO ERROR", "finite" if bool(y.isfinite().all()) else "not finite", flush=True)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("bad", list(BAD_SPLITS), ids=list(BAD_SPLITS))
@pytest.mark.parametrize("recipe", ["None", "gmlp.MXFP8Recipe()"], ids=RECIPE_IDS)
def test_bad_split_sizes_stop_the_device(recipe, bad):
    """The device-side assert (torch._assert_async) ends the process with its message; the
    forward never returns a result, finite or not."""
    sizes, _ = BAD_SPLITS[bad]
    env = {name: value for name, value in os.environ.items() if name != "GMLP_VALIDATE"}
    env["GMLP_BACKEND"] = "triton"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    code = textwrap.dedent(_CUDA_SCRIPT.format(recipe=recipe, sizes=sizes))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert "NO ERROR" not in done.stdout, done.stdout
    assert done.returncode != 0, (done.stdout, done.stderr[-4000:])
    assert "split_sizes" in done.stderr, done.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("bad", list(BAD_SPLITS), ids=list(BAD_SPLITS))
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_gmlp_validate_raises_on_the_gpu(recipe, bad, monkeypatch):
    monkeypatch.setenv("GMLP_VALIDATE", "1")
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    sizes, message = BAD_SPLITS[bad]
    mlp, x = _module_and_input(recipe, "cuda")
    with pytest.raises(ValueError, match=message):
        mlp(x, torch.tensor(sizes, device="cuda"))
    y = mlp(x, torch.tensor([10, 0, 14], device="cuda"))  # the context lives on: good sizes run
    torch.cuda.synchronize()
    assert y.isfinite().all()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_gmlp_validate_refuses_a_cuda_graph_capture(recipe, monkeypatch):
    monkeypatch.setenv("GMLP_BACKEND", "triton")
    mlp, x = _module_and_input(recipe, "cuda")
    split_sizes = torch.tensor([10, 0, 14], device="cuda")
    mlp(x, split_sizes).float().sum().backward()  # compile the kernels outside the capture
    torch.cuda.synchronize()
    monkeypatch.setenv("GMLP_VALIDATE", "1")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="GMLP_VALIDATE=1 reads split_sizes on the host.*CUDA graph capture"):
        with torch.cuda.graph(graph):
            mlp(x.detach(), split_sizes)  # good sizes: the capture itself is refused
    monkeypatch.delenv("GMLP_VALIDATE")
    y = mlp(x.detach(), split_sizes)  # the context lives on
    torch.cuda.synchronize()
    assert y.isfinite().all()
