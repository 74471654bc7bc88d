"""``bench profile``'s arguments (the profiled run itself needs a GPU)."""

from __future__ import annotations

import pytest

from gmlp.bench import profile


def test_every_mode_has_a_recipe_and_an_unknown_one_is_named(capsys):
    assert set(profile.MODES) == {"mxfp8", "bf16", "fp8-blockwise"}
    assert [type(profile.MODES[mode]()).__name__ for mode in ("mxfp8", "bf16", "fp8-blockwise")] == [
        "MXFP8Recipe", "NoneType", "FP8BlockwiseRecipe"]
    with pytest.raises(SystemExit):
        profile.main(["--modes", "mxfp8,fp4"])
    assert "--modes: ['fp4'] not among ['mxfp8', 'bf16', 'fp8-blockwise']" in capsys.readouterr().err
