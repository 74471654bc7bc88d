"""``python -m gmlp.integrations.torchtitan_check TRAINER-ARGS``: a torchtitan trainer's command
line, checked on any machine (a CPU one included) without training.

torchtitan's trainer needs a GPU and torchrun before it reads its overrides, so on a CPU a
misspelled gmlp setting would go unreported. This parses the same arguments with torchtitan's
``ConfigManager``, applies the overrides as the trainer does, and says which experts became
gmlp's and with which settings; a bad setting exits with gmlp's sentence. Example::

    python -m gmlp.integrations.torchtitan_check --module qwen3 --config qwen3_moe_debug \\
        --override.imports 'gmlp.integrations.torchtitan.gmlp_experts={"recipe": "bf16"}'
"""

from __future__ import annotations

import sys

from torchtitan.config.manager import ConfigManager
from torchtitan.config.override import apply_overrides
from torchtitan.models.common.moe import GroupedExperts

from gmlp.dispatch.paths import FallbackError
from gmlp.fp8_blockwise.recipe import FP8BlockwiseRecipe
from gmlp.integrations.torchtitan import GmlpGroupedExperts, recipe_from_name
from gmlp.mxfp8.recipe import MXFP8Recipe


def _settings(config: GmlpGroupedExperts.Config) -> str:
    """The settings gmlp's experts of ``config`` run with: the recipe's own (MXFP8: scale mode and
    gradient format; FP8 blockwise: gradient format and power-of-two scales; bf16: none) and strict."""
    recipe = recipe_from_name(config.recipe, config.scale_mode, config.grad_format)
    if isinstance(recipe, FP8BlockwiseRecipe):
        own = f", grad_format={recipe.grad_format.value}, power_of_two_scales={recipe.power_of_two_scales}"
    elif isinstance(recipe, MXFP8Recipe):
        own = f", scale_mode={recipe.scale_mode.value}, grad_format={recipe.grad_format.value}"
    else:
        own = ""
    return f"recipe={config.recipe}{own}, strict={config.strict}"


def check(argv: list[str]) -> str:
    """The report for trainer arguments ``argv``; raises gmlp's error for a bad setting."""
    config = ConfigManager().parse_args(argv)
    applied = apply_overrides(config.override, config)
    experts = [c for _, c, _, _ in config.model_spec.model.traverse(GroupedExperts.Config)]
    ours = [c for c in experts if isinstance(c, GmlpGroupedExperts.Config)]
    settings = sorted({_settings(c) for c in ours})
    lines = [*applied, f"{len(ours)} of {len(experts)} experts modules run gmlp's experts"
             + (f" ({'; '.join(settings)})" if settings else "")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    try:
        print(check(sys.argv[1:] if argv is None else argv))
    except (ValueError, TypeError, FallbackError) as error:
        if "gmlp" not in str(error):  # not one of gmlp's settings: torchtitan's own error, as it is
            raise
        sys.exit(f"torchtitan check: {error}")


if __name__ == "__main__":
    main()
