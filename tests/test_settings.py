"""One settings class per analysis: recipe keys, Python API and command-line flags agree."""

import dataclasses

import pytest
from conftest import REPO

from probe.cli import build_parser
from probe.cli.layers import recipe_from_args
from probe.errors import ConfigError
from probe.formats import load_checkpoint
from probe.report.recipe import Recipe, resolve_recipe
from probe.settings import (
    ForgettingSettings,
    InterventionSettings,
    ProbeSettings,
    PromptSettings,
    ReadoutSettings,
    SimilaritySettings,
    flag_overrides,
)

SECTIONS = {
    "prompts": PromptSettings,
    "readout": ReadoutSettings,
    "similarity": SimilaritySettings,
    "probes": ProbeSettings,
    "forgetting": ForgettingSettings,
    "interventions": InterventionSettings,
}


def test_recipe_sections_are_the_analysis_settings_with_help_for_every_key():
    fields = {f.name: f for f in dataclasses.fields(Recipe)}
    for section, cls in SECTIONS.items():
        assert type(fields[section].default_factory()) is cls
        for f in dataclasses.fields(cls):
            if f.name != "learners" or cls is not ForgettingSettings:  # a list of sweeps, documented in README
                assert f.metadata.get("help"), f"{section}.{f.name} has no help text"


def _parse(argv):
    return build_parser().parse_args([*argv, "--out", "unused"])


def test_flags_set_the_same_values_as_recipe_overrides():
    args = _parse(["probes", "--steps", "7", "--lr", "0.1", "0.01", "--no-controls", "--kinds", "mlp",
                   "--test-prompts", "33", "--seed", "4"])
    via_flags = resolve_recipe("quick", flag_overrides(args))
    via_set = resolve_recipe("quick", [{"probes": {"steps": 7, "lr": [0.1, 0.01], "controls": False, "kinds": ["mlp"]}},
                                       {"prompts": {"eval": 33, "seed": 4}}])
    assert via_flags.to_dict() == via_set.to_dict()
    assert via_flags.probes == ProbeSettings(steps=7, lr=(0.1, 0.01), controls=False, kinds=("mlp",),
                                             prompts=via_set.probes.prompts, patience=via_set.probes.patience,
                                             eval_every=via_set.probes.eval_every, hidden=via_set.probes.hidden)
    untouched = resolve_recipe("quick", flag_overrides(_parse(["probes"])))
    assert untouched.to_dict() == resolve_recipe("quick").to_dict()  # no flag given: the recipe's values


def test_ablate_applies_seed_and_bootstrap_and_ablates_heads_unless_told_not_to():
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    recipe = recipe_from_args(_parse(["ablate", "--seed", "5", "--bootstrap", "7", "--prompts", "9"]), ckpt)
    assert (recipe.prompts.seed, recipe.similarity.bootstrap, recipe.interventions.prompts) == (5, 7, 9)
    assert resolve_recipe("quick").interventions.heads is False
    assert recipe.interventions.heads is True  # the command's own default
    assert recipe_from_args(_parse(["ablate", "--no-heads"]), ckpt).interventions.heads is False


def test_patch_learners_flag_selects_or_skips_the_map_check():
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    recipe = recipe_from_args(_parse(["patch"]), ckpt)
    assert recipe.interventions.learner_labels(recipe.sweeps) == ["newton", "gd_log"]
    recipe = recipe_from_args(_parse(["patch", "--learners"]), ckpt)
    assert recipe.interventions.learner_labels(recipe.sweeps) == []
    with pytest.raises(ConfigError, match="Did you mean: newton"):
        recipe_from_args(_parse(["patch", "--learners", "newtn"]), ckpt)


@pytest.mark.parametrize("cls,kwargs,match", [
    (ProbeSettings, {"lr": ()}, "probes.lr and probes.hidden need at least one value"),
    (ProbeSettings, {"prompts": 1}, "probes.prompts"),
    (ProbeSettings, {"prefixes": ()}, "probes.prefixes is empty"),
    (InterventionSettings, {"sites": ("q",)}, "unknown site 'q'"),
    (InterventionSettings, {"query": -1}, "interventions.query"),
    (ReadoutSettings, {"method": "lasso"}, "readout.method"),
    (PromptSettings, {"seed": 1.5}, "prompts.seed must be an integer"),
])
def test_bad_settings_name_their_recipe_key(cls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)
