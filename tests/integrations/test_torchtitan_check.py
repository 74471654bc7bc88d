"""``python -m gmlp.integrations.torchtitan_check``: the trainer's command line checked on a CPU,
where the trainer itself cannot start (it needs torchrun and a GPU before it reads overrides)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is the gmlp[torchtitan] extra")

from tests.support.torchtitan_cases import GMLP_EXPERTS, import_model_package  # noqa: E402

TRAINER_ARGS = ["--module", "qwen3", "--config", "qwen3_moe_debug", "--override.imports"]


@pytest.fixture(scope="module")
def check():
    import_model_package("qwen3")  # skips, with the reason, where torchtitan's model packages do not import
    from gmlp.integrations import torchtitan_check

    return torchtitan_check


@pytest.mark.parametrize("settings,said", [
    ('{"grad_format": "e5m2"}', "recipe=mxfp8, scale_mode=rceil, grad_format=e5m2, strict=None"),
    ('{"recipe": "fp8_blockwise", "strict": true}',
     "recipe=fp8_blockwise, grad_format=e4m3, power_of_two_scales=True, strict=True"),
    ('{"recipe": "bf16", "scale_mode": "floor"}', "recipe=bf16, strict=None"),  # bf16 quantizes nothing
], ids=["mxfp8", "fp8_blockwise", "bf16"])
def test_the_trainer_flag_is_checked_on_a_cpu(check, capsys, settings, said):
    """The report names the settings each recipe runs with, and only those."""
    check.main([*TRAINER_ARGS, f"{GMLP_EXPERTS}={settings}"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"8 of 8 experts modules run gmlp's experts ({said})"


@pytest.mark.parametrize("settings,said", [
    ('{"recipe": "bf16x"}', "recipe must be one of ('mxfp8', 'fp8_blockwise', 'bf16'), got 'bf16x'"),
    ('{"scale": "floor"}', "unexpected keyword argument 'scale'"),
], ids=["misspelled-value", "misspelled-name"])
def test_a_misspelled_setting_is_reported_with_gmlps_sentence(check, settings, said):
    with pytest.raises(SystemExit, match="^torchtitan check: .*" + said.replace("(", r"\(").replace(")", r"\)")):
        check.main([*TRAINER_ARGS, f"{GMLP_EXPERTS}={settings}"])
