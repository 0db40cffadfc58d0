"""One settings class per analysis: recipe keys, Python API and command-line flags agree."""

import dataclasses

import pytest
import torch
from conftest import REPO

from probe.analysis.forgetting import ForgettingSettings
from probe.analysis.probe_study import ProbeSettings
from probe.analysis.readout import ReadoutSettings
from probe.cli import build_parser
from probe.cli.layers import recipe_from_args
from probe.core.errors import ConfigError, RenamedSetting
from probe.core.settings import PromptSettings, SimilaritySettings, flag_overrides
from probe.interventions.pipeline import InterventionSettings
from probe.io.formats import load_checkpoint
from probe.reporting.recipe import Recipe, resolve_recipe

SECTIONS = {
    "prompts": PromptSettings,
    "readout": ReadoutSettings,
    "similarity": SimilaritySettings,
    "probes": ProbeSettings,
    "forgetting": ForgettingSettings,
    "interventions": InterventionSettings,
}


def test_recipe_sections_are_the_analysis_settings_with_help_for_every_key():
    recipe = Recipe(sweeps=[{"label": "gd", "learner": "gd"}])  # built-in sections and registered stages' alike
    for section, cls in SECTIONS.items():
        assert type(getattr(recipe, section)) is cls
        for f in dataclasses.fields(cls):
            if f.name != "learners" or cls is not ForgettingSettings:  # a list of sweeps, documented in README
                assert f.metadata.get("help"), f"{section}.{f.name} has no help text"


def _parse(argv):
    return build_parser().parse_args([*argv, "--out", "unused"])


def test_flags_set_the_same_values_as_recipe_overrides():
    args = _parse(["probes", "--max-iter", "7", "--alphas", "0.1", "0.01", "--no-controls", "--kinds", "mlp",
                   "--test-prompts", "33", "--seed", "4"])
    via_flags = resolve_recipe("quick", flag_overrides(args))
    via_set = resolve_recipe("quick", [{"probes": {"max_iter": 7, "alphas": [0.1, 0.01], "controls": False, "kinds": ["mlp"]}},
                                       {"prompts": {"test": 33, "seed": 4}}])
    assert via_flags.to_dict() == via_set.to_dict()
    assert via_flags.probes == ProbeSettings(max_iter=7, alphas=(0.1, 0.01), controls=False, kinds=("mlp",),
                                             prompts=via_set.probes.prompts, hidden=via_set.probes.hidden)
    untouched = resolve_recipe("quick", flag_overrides(_parse(["probes"])))
    assert untouched.to_dict() == resolve_recipe("quick").to_dict()  # no flag given: the recipe's values


def test_ablate_applies_seed_and_bootstrap_and_ablates_heads_unless_told_not_to():
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    recipe = recipe_from_args(_parse(["ablate", "--seed", "5", "--bootstrap", "27", "--prompts", "9"]), ckpt)
    assert (recipe.prompts.seed, recipe.similarity.bootstrap, recipe.interventions.prompts) == (5, 27, 9)
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
    (ProbeSettings, {"alphas": ()}, "probes.alphas is empty; give at least one value"),
    (ProbeSettings, {"gtol": float("nan")}, "probes.gtol"),
    (ProbeSettings, {"prompts": 2}, "probes.prompts"),
    (ProbeSettings, {"prefixes": ()}, "probes.prefixes is empty"),
    (InterventionSettings, {"sites": ("q",)}, "Unknown site 'q'. Known: attn_out, mlp_out, resid"),
    (InterventionSettings, {"query": -1}, "interventions.query"),
    (ReadoutSettings, {"method": "lasso"}, "readout.method"),
    (PromptSettings, {"seed": 1.5}, "prompts.seed must be an integer"),
])
def test_bad_settings_name_their_recipe_key(cls, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        cls(**kwargs)


def test_renamed_prompt_keys_still_work_with_a_warning_and_override_the_new_name(tmp_path):
    with pytest.warns(RenamedSetting) as warned:
        old = resolve_recipe("quick", [{"prompts": {"eval": 33, "simw": 5, "evaluate": 70}}])
    assert sorted(str(w.message).split(" is now ")[0] for w in warned) == ["prompts.eval", "prompts.evaluate", "prompts.simw"]
    assert (old.prompts.test, old.prompts.induced, old.prompts.curve) == (33, 5, 70)  # quick.toml says test = 256
    assert old.to_dict() == resolve_recipe("quick", [{"prompts": {"test": 33, "induced": 5, "curve": 70}}]).to_dict()
    recipe = tmp_path / "old.toml"
    recipe.write_text((REPO / "analyses" / "quick.toml").read_text().replace("test = 256", "eval = 256", 1)
                      .replace("induced = 64", "simw = 64", 1))  # [prompts]: the first; [token_probes] has a test too
    with pytest.warns(RenamedSetting) as warned:
        assert resolve_recipe(str(recipe)).to_dict() == resolve_recipe("quick").to_dict() | {"name": "old"}
    assert [str(w.message) for w in warned] == [f"prompts.{old} is now prompts.{new}; the old name still works for now"
                                                for old, new in (("eval", "test"), ("simw", "induced"))]
    both = tmp_path / "both.toml"
    both.write_text(recipe.read_text().replace("eval = 256", "eval = 256\ntest = 128"))
    with pytest.raises(ConfigError, match=r"prompts\.eval and prompts\.test are both given; .* keep only prompts\.test"):
        resolve_recipe(str(both))


def test_renamed_flags_still_work_with_one_warning_line(capsys):
    from probe.cli import main

    argv = ["heatmap", "missing-run", "--out", "unused", "--eval-prompts", "9", "--simw-prompts", "3"]
    assert main(argv) == 2  # the run directory is missing
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["icl-probe: warning: --eval-prompts is now --test-prompts; the old name still works for now",
                       "icl-probe: warning: --simw-prompts is now --induced-prompts; the old name still works for now"]
    with pytest.warns(RenamedSetting, match="is now --"):
        args = _parse(["span", "--eval-prompts", "9", "--simw-prompts", "3"])
    assert resolve_recipe("quick", flag_overrides(args)).prompts == PromptSettings(
        curve=1280, train=1024, val=256, test=9, induced=3)


def test_layer_settings_default_sweeps_are_the_quick_recipes():
    from probe.analysis.pipeline import LayerSettings
    from probe.core.config import to_dict

    assert to_dict(list(LayerSettings().sweeps)) == to_dict(resolve_recipe("quick").sweeps)


def test_heatmap_similarity_switches_are_the_recipe_keys():
    args = _parse(["heatmap", "--no-simw", "--include-first"])
    recipe = resolve_recipe("quick", flag_overrides(args))
    assert (recipe.similarity.simw, recipe.similarity.include_first) == (False, True)
    assert resolve_recipe("quick", flag_overrides(_parse(["heatmap"]))).similarity == SimilaritySettings(bootstrap=500)


def test_the_random_weights_control_leaves_the_global_random_state_alone():
    """Library code draws the control model's weights from its own seed (probe/core/seeds.py) without
    moving torch's global generator; the same seed gives the same model."""
    from conftest import build_cfg

    from probe.models import random_weights_model

    cfg = build_cfg(layers=2).model
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = random_weights_model(cfg, 0)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = random_weights_model(cfg, 0)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_streams_are_named_and_distinct():
    """Every stream is its own generator: no two names share a value, no stream of seed s equals
    another stream of a nearby seed (the old seed + k offsets), and the source has no raw seeding of
    analysis draws left (probe/core/seeds.py)."""
    import re
    from pathlib import Path

    from probe.core.seeds import Stream, stream_generator, stream_seed

    assert len({int(s) for s in Stream}) == len(Stream)
    seeds = {stream_seed(seed, stream) for seed in range(100) for stream in Stream}
    assert len(seeds) == 100 * len(Stream)
    first = torch.rand(4, generator=stream_generator(0, Stream.BOOTSTRAP))
    assert not torch.equal(first, torch.rand(4, generator=torch.Generator().manual_seed(0)))
    root = Path(__file__).resolve().parents[1] / "probe"
    raw = [
        f"{p.relative_to(root)}: {line.strip()}"
        for p in root.rglob("*.py")
        for line in p.read_text().splitlines()
        if re.search(r"manual_seed\((\w+\.)?seed( [+-]|\))", line) and "planted" not in str(p)
    ]
    allowed = {"learners/stochastic.py", "learners/network.py", "models/oracle.py", "training/train.py"}
    assert [r for r in raw if r.split(":")[0] not in allowed] == []


def test_library_calls_leave_the_global_generator_alone(tmp_path):
    """Training initialises its model from train.seed without moving torch's global generator, and
    the same seed gives the same initial model whatever the global state was."""
    from conftest import build_cfg

    from probe.training.train import train

    cfg = build_cfg(layers=1, steps=1, eval_every=1, save_every=1, log_every=1)
    models = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        state = torch.random.get_rng_state()
        models.append(train(cfg, tmp_path / f"run{global_seed}", progress=False))
        assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(models[0].parameters(), models[1].parameters()))


def test_one_rule_for_the_induced_weights_queries():
    """The layers stage, analyse_layers / analyse_spectrum and the study's ILW refuse fewer fresh
    queries than d with the one rule (0 means 4 d)."""
    from probe.core.errors import ConfigError
    from probe.core.settings import check_induced_queries

    assert check_induced_queries(0, 3) == 12 and check_induced_queries(3, 3) == 3
    with pytest.raises(ConfigError, match=r"^queries = 2 is fewer than d = 3 on ck: .* need queries >= d \(0 means 4 d; or x\)$"):
        check_induced_queries(2, 3, key="queries", where="ck", off="x")
