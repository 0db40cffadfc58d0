import pytest
from conftest import REPO, build_cfg

from probe.core.config import RunConfig, Stage, TaskConfig, load_recipe, merge, parse_override
from probe.core.errors import ConfigError


def test_round_trip_is_exact():
    cfg = build_cfg()
    cfg.curriculum.dims = Stage(1, 3, 1, 10)
    again = RunConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_recipes_validate(recipe):
    RunConfig.from_dict(load_recipe(recipe))


def test_unknown_key_suggests_close_match():
    with pytest.raises(ConfigError, match=r"Unknown key 'n_layers'\. Did you mean: n_layer\?"):
        RunConfig.from_dict({"model": {"n_layers": 3}})


def test_bad_values_name_the_field():
    with pytest.raises(ConfigError, match=r"train\.lr must be > 0"):
        RunConfig.from_dict({"train": {"lr": -1}})
    with pytest.raises(ConfigError, match=r"model\.n_embd \(30\) must be divisible by model\.n_head \(4\)"):
        RunConfig.from_dict({"model": {"n_embd": 30, "n_head": 4}})
    with pytest.raises(ConfigError, match=r"task\.name: Unknown name 'linear_regresion'\. Did you mean: linear_regression"):
        TaskConfig(name="linear_regresion")
    with pytest.raises(ConfigError, match=r"model\.n_dims \(4\) must equal task\.n_dims \(5\)"):
        RunConfig.from_dict({"task": {"n_dims": 5}})
    with pytest.raises(ConfigError, match=r"train\.steps must be an integer"):
        RunConfig.from_dict({"train": {"steps": "ten"}})


def test_override_parsing_and_merge():
    data = merge({"train": {"lr": 1.0, "steps": 3}}, parse_override("train.lr=3e-4"))
    assert data == {"train": {"lr": 3e-4, "steps": 3}}
    assert parse_override("model.family=lstm") == {"model": {"family": "lstm"}}
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        parse_override("train.lr")


def test_curriculum_stage():
    s = Stage(start=5, end=20, inc=1, interval=2000)
    assert [s.at(k) for k in (0, 1999, 2000, 30000)] == [5, 5, 6, 20]


REPORT_RECIPES = sorted(p for p in (REPO / "analyses").glob("*.toml") if "[[sweeps]]" in p.read_text())
STUDY_RECIPES = sorted(p for p in (REPO / "analyses").glob("*.toml") if p not in REPORT_RECIPES)


@pytest.mark.parametrize("recipe", REPORT_RECIPES, ids=lambda p: p.name)
def test_report_recipes_validate(recipe):
    from probe.reporting.recipe import resolve_recipe

    r = resolve_recipe(str(recipe))
    assert r.sweeps and r.name == recipe.stem


@pytest.mark.parametrize("recipe", STUDY_RECIPES, ids=lambda p: p.name)
def test_study_recipes_validate_and_find_their_models(recipe, monkeypatch):
    from probe.study.recipe import resolve_models, resolve_study

    monkeypatch.chdir(REPO)
    study = resolve_study(str(recipe))
    assert study.report_recipe().sweeps and len(resolve_models(study)) >= 2


def test_the_names_config_checks_are_the_registries_own():
    """config.py lists families and constructions by name (it sits below the models in the import
    layers); those lists must be the registries' keys, so a new construction cannot be forgotten."""
    from probe.core.config import MODEL_FAMILIES, PLANTED_ALGORITHMS
    from probe.models import FAMILIES
    from probe.models.constructions import CONSTRUCTIONS

    assert set(MODEL_FAMILIES) == set(FAMILIES)
    assert set(PLANTED_ALGORITHMS) == set(CONSTRUCTIONS)
