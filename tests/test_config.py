import pytest
from conftest import REPO, build_cfg

from probe.core.config import Stage, TrainConfig, load_recipe, merge, parse_override
from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.io.run_config import RunConfig
from probe.models.config import ModelConfig


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
    with pytest.raises(ConfigError, match=r"task\.name: Unknown task 'linear_regresion'\. Did you mean: linear_regression"):
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
    runs = len(resolve_models(study)) * max(1, len(study.prompt_seeds))  # a model once per prompt seed
    assert study.report_recipe().sweeps and runs >= 2


def test_config_checks_read_the_registries():
    """ModelConfig and TaskConfig check names against the registries themselves, not copies: a name
    registered after the classes were defined is accepted, and a misspelling of it gets a close match."""
    from probe.data.config import TASKS
    from probe.models.config import FAMILIES, ModelConfig
    from probe.models.constructions import CONSTRUCTIONS

    cases = [
        (FAMILIES, "model.family", lambda name: ModelConfig(family=name)),
        (CONSTRUCTIONS, "model.planted", lambda name: ModelConfig(family="planted", planted=name)),
        (TASKS, "task.name", lambda name: TaskConfig(name=name)),
    ]
    from probe.models.base import FamilyTraits

    for registry, key, make in cases:
        registry.register("zz_new")(FamilyTraits if registry is FAMILIES else object())  # a family has its rules
        try:
            make("zz_new")
            with pytest.raises(ConfigError, match=rf"{key}: Unknown .* 'zz_nex'\. Did you mean: zz_new\?"):
                make("zz_nex")
        finally:
            registry.unregister("zz_new")
        with pytest.raises(ConfigError, match=rf"{key}: Unknown .* 'zz_new'"):
            make("zz_new")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TaskConfig(noise_std=-0.1), r"task\.noise_std must be >= 0, got -0\.1"),
        (lambda: TaskConfig(kappa=0.5), r"task\.kappa must be >= 1, got 0\.5"),
        (lambda: TaskConfig(relu_depth=1), r"task\.relu_depth must be an integer >= 2, got 1"),
        (lambda: TaskConfig(mixture_weights=(1.5, -0.5)), r"task\.mixture_weights must be >= 0, got -0\.5"),
        (lambda: TaskConfig(mixture_weights=(0.5, 0.2)), r"task\.mixture_weights must be two non-negative numbers summing to 1"),
        (lambda: TrainConfig(min_lr_ratio=1.5), r"train\.min_lr_ratio must be <= 1, got 1\.5"),
        (lambda: TrainConfig(lr=float("nan")), r"train\.lr must be a finite number"),
        (lambda: TrainConfig(lr=1e300), r"train\.lr must be <= 10, got 1e\+300"),  # overflowed inside torch
        (lambda: TaskConfig(kappa=1e300), r"task\.kappa must be <= 1e\+12, got 1e\+300"),  # float32 prompts
        (lambda: TrainConfig(schedule="cosin"), r"train\.schedule: Unknown value 'cosin'\. Did you mean: cosine\?"),
        (lambda: TrainConfig(seed=-1), r"train\.seed must be an integer in 0\.\.2\^63-1"),
        (lambda: ModelConfig(planted_batch=-1), r"model\.planted_batch must be an integer >= 0, got -1"),
        (lambda: ModelConfig(n_layer=True), r"model\.n_layer must be an integer >= 1, got True"),
        (lambda: Stage(3, 2), r"curriculum stage needs start <= end, got start=3 end=2"),
        (lambda: Stage(1, 2, inc=-1), r"curriculum\.inc must be an integer >= 0, got -1"),
    ],
)
def test_bounds_are_declared_with_the_field(make, message):
    """Each run-config field's bounds are its `setting(...)` rules, checked by Section when made."""
    with pytest.raises(ConfigError, match=message):
        make()


def test_sections_normalise_numbers():
    assert TrainConfig(lr=1).lr == 1.0 and isinstance(TrainConfig(lr=1).lr, float)
    assert TaskConfig(mixture_weights=[1, 0]).mixture_weights == (1.0, 0.0)


def test_one_integer_rule_for_keyword_and_dict_settings_and_one_seed_rule():
    """A section built from keywords and the same section read from a recipe dict agree:
    an integral float is the integer, 2.5 is refused both ways; a grid's seed follows check_seed."""
    from probe.analysis.probe_study import ProbeSettings
    from probe.core.config import from_dict
    from probe.core.settings import PromptSettings
    from probe.core.validate import check_grid

    assert ProbeSettings(max_iter=1000.0).max_iter == from_dict(ProbeSettings, {"max_iter": 1000.0}).max_iter == 1000
    assert PromptSettings(seed=3.0).seed == from_dict(PromptSettings, {"seed": 3.0}).seed == 3
    for make in (lambda: ProbeSettings(max_iter=2.5), lambda: from_dict(ProbeSettings, {"max_iter": 2.5})):
        with pytest.raises(ConfigError, match=r"max_iter must be an integer"):
            make()
    with pytest.raises(ConfigError, match=r"seed must be an integer in 0\.\.2\^63-1, got -5"):
        check_grid("sgd", {"seed": -5})
    assert check_grid("sgd", {"seed": 7.0}) == {"seed": 7}
