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


def test_the_trainer_flag_is_checked_on_a_cpu(check, capsys):
    check.main([*TRAINER_ARGS, f'{GMLP_EXPERTS}={{"recipe": "bf16", "scale_mode": "floor"}}'])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "8 of 8 experts modules run gmlp's experts (recipe=bf16, scale_mode=floor, grad_format=e4m3, strict=None)"


@pytest.mark.parametrize("settings,said", [
    ('{"recipe": "bf16x"}', "recipe must be one of ('mxfp8', 'fp8_blockwise', 'bf16'), got 'bf16x'"),
    ('{"scale": "floor"}', "unexpected keyword argument 'scale'"),
], ids=["misspelled-value", "misspelled-name"])
def test_a_misspelled_setting_is_reported_with_gmlps_sentence(check, settings, said):
    with pytest.raises(SystemExit, match="^torchtitan check: .*" + said.replace("(", r"\(").replace(")", r"\)")):
        check.main([*TRAINER_ARGS, f"{GMLP_EXPERTS}={settings}"])
