"""A new analysis is one module: a stage declared here, outside probe/, and
registered, is in the recipe, the budget, the report page, summary.json (valid against the schema
with its block) and the command line, with no file of probe/ changed."""

import json
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from probe.cli import main
from probe.core import budget
from probe.core.config import Section, setting
from probe.core.errors import ConfigError
from probe.core.stages import AnalysisStage, FieldsAsKeys, StageTables, register_stage, unregister_stage
from probe.models.sizes import shape_of
from probe.reporting.recipe import resolve_recipe

matplotlib.use("Agg")

OFF = ["probes", "forgetting", "order", "token_probes", "ood", "steering", "interventions", "spectral"]


@dataclass
class MeanSettings(Section):
    SECTION = "mean_prediction"
    enabled: bool = setting(True, "run the mean-prediction analysis")
    prompts: int = setting(32, "prompts")


@dataclass
class MeanBlock:
    """Mean |prediction| of the model by number of examples."""

    n_examples: list[int]
    mean_abs: list[float]


def _run(c):
    from probe.analysis.evaluate import predict
    from probe.data.tasks import sample_prompts

    s = c.recipe.mean_prediction
    p = sample_prompts(c.ckpt.config.task, s.prompts, generator=MEAN.generator(c.recipe.prompts.seed, "prompts"))
    pred = predict(c.ckpt.model, p).abs().mean(0)
    table = pd.DataFrame({"n_examples": range(len(pred)), "mean_abs": pred.double().numpy()})
    peak = {"n_examples": int(pred.argmax()), "mean_abs": float(pred.max())}
    return StageTables({"mean_prediction": table}, {"mean_peak": peak, "kept_unwritten": 1})


def _figures(tables, fig_dir, context):
    import matplotlib.pyplot as plt

    fig_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots()
    ax.plot(tables["mean_prediction"].n_examples, tables["mean_prediction"].mean_abs)
    fig.savefig(fig_dir / "mean_prediction.png")
    plt.close(fig)
    return {"curve": fig_dir / "mean_prediction.png"}


MEAN = AnalysisStage(
    name="mean_prediction",
    settings=MeanSettings,
    run=_run,
    block=MeanBlock,
    summarise=lambda t, recipe: MeanBlock(
        t["mean_prediction"].n_examples.tolist(), t["mean_prediction"].mean_abs.tolist()
    ),
    title="Mean prediction size",
    description="The mean absolute prediction <by> number of examples.",
    figures=_figures,
    estimates=lambda recipe, ckpt: [
        budget.prompt_estimate(
            "mean_prediction.prompts",
            recipe.mean_prediction.prompts,
            shape_of(ckpt.config.model),
            ckpt.config.task.n_points,
        )
    ],
    findings=lambda block, summary: (
        f"Mean |prediction| after {block.n_examples[-1]} examples: {block.mean_abs[-1]:.3f}."
    ),
    tables=lambda block, summary, t: {
        "by examples": pd.DataFrame({"examples": block.n_examples, "mean |y|": block.mean_abs})
    },
    files=("mean_peak",),
)


@pytest.fixture
def registered():
    register_stage(MEAN)
    yield MEAN
    unregister_stage(MEAN.name)


def _report_args(ckpt, out, *extra):
    sets = [arg for name in OFF for arg in ("--set", f"{name}.enabled=false")]
    return ["-q", "report", str(ckpt), "--recipe", "smoke", "--out", str(out), "--no-cache", *sets, *extra]


def test_a_registered_stage_is_in_the_recipe_with_its_defaults_and_overrides(registered):
    recipe = resolve_recipe("smoke", [{"mean_prediction": {"prompts": 16}}])
    assert recipe.mean_prediction == MeanSettings(prompts=16)
    assert recipe.to_dict()["mean_prediction"] == {"enabled": True, "prompts": 16}
    assert resolve_recipe("smoke").mean_prediction.prompts == 32
    with pytest.raises(ConfigError, match="mean_prediction.prompts must be"):
        resolve_recipe("smoke", [{"mean_prediction": {"prompts": 0}}])


@pytest.mark.slow
def test_a_registered_stage_runs_in_the_report_page_summary_and_budget(registered, ckpt, tmp_path, capsys):
    from probe.reporting.schema import Summary

    out = tmp_path / "r"
    assert main(_report_args(ckpt, out)) == 0
    data = json.loads((out / "summary.json").read_text())
    assert len(data["mean_prediction"]["mean_abs"]) == len(data["mean_prediction"]["n_examples"]) > 1
    assert Summary.from_json(data).stages["mean_prediction"].mean_abs == data["mean_prediction"]["mean_abs"]
    assert data["recipe"]["mean_prediction"] == {"enabled": True, "prompts": 32}
    page = (out / "index.html").read_text()
    assert "<h2>Mean prediction size</h2>" in page or "Mean prediction size</h2>" in page
    assert "&lt;by&gt;" in page and "mean_prediction.png" in page and "Mean |prediction| after" in page
    assert (out / "data" / "mean_prediction.csv").is_file()
    # the data entry it names in `files` is written beside its tables, the others are not
    peak = json.loads((out / "data" / "mean_peak.json").read_text())
    assert peak["mean_abs"] == pytest.approx(max(data["mean_prediction"]["mean_abs"]))
    assert not (out / "data" / "kept_unwritten.json").exists()
    assert json.loads((out / "data" / "trends.json").read_text())  # the layers stage's own file
    # its estimate is the report's up-front check, naming its knob
    code = main(_report_args(ckpt, tmp_path / "big", "--set", "mean_prediction.prompts=1000000000"))
    assert code == 2 and "mean_prediction.prompts" in capsys.readouterr().err
    assert not (tmp_path / "big").exists()


def test_a_registered_stage_is_a_command(registered, ckpt, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["-q", "mean-prediction", str(ckpt), "--prompts", "8", "--out", str(out)]) == 0
    written = json.loads((out / "mean_prediction_summary.json").read_text())
    assert set(json.loads((out / "mean_peak.json").read_text())) == {"n_examples", "mean_abs"}
    assert written["recipe"]["mean_prediction"] == {"enabled": True, "prompts": 8} and "git_commit" in written
    assert written["recipe"]["prompts"]["seed"] == 0 and written["command"] == "mean-prediction"
    assert {p.name for p in out.iterdir()} >= {"mean_prediction.csv", "mean_prediction.png"}
    assert "Mean |prediction| after" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # checked when the command line is read, naming the flag and key
        main(["-q", "mean-prediction", str(ckpt), "--prompts", "0", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "argument --prompts: must be an integer >= 1, got 0" in err
    assert "(recipe key mean_prediction.prompts)" in err and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_summary_with_a_block_nobody_registered_fails_its_schema(registered, ckpt, tmp_path):
    from probe.reporting.schema import check_summary

    out = tmp_path / "r"
    assert main(_report_args(ckpt, out)) == 0
    data = json.loads((out / "summary.json").read_text())
    data["mean_prediction"]["mean_abs"] = "many"
    with pytest.raises(ConfigError, match="mean_prediction/mean_abs"):
        check_summary(data)
    unregister_stage(MEAN.name)
    with pytest.raises(ConfigError, match="Additional properties"):
        check_summary(json.loads((out / "summary.json").read_text()))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"name": "spectral"}, "already registered by another declaration"),
        ({"name": "mean_two", "cli": "heatmap"}, "its command 'heatmap' is another stage's"),
        ({"name": "report"}, "built-in recipe section"),
        ({"name": "Mean"}, "lower-case letters"),
        ({"settings": dict}, "Section dataclass"),
        ({"block": dict}, "must be a dataclass"),
        ({"name": "other_name"}, "SECTION = 'other_name'"),
        ({"files": ("Peak",)}, "files names entries of its data"),
        ({"files": ("trends",)}, "data/trends.json is another stage's file"),
        ({"needs": ("mean_prediction",)}, "needs itself"),
    ],
)
def test_registering_refuses_what_the_report_cannot_hold(change, message):

    from probe.core.stages import registered

    registered()  # the toolkit's own stages (the layers stage writes data/trends.json)
    with pytest.raises(ConfigError, match=message):
        register_stage(MEAN.replace(**change))


def test_a_block_dataclass_named_like_a_built_in_one_is_refused():
    from dataclasses import make_dataclass

    from probe.core.stages import registered

    registered()  # the toolkit's own stages, whose blocks hold the built-in names

    readout = make_dataclass("Readout", [("layer", list)])  # the name of the report's read-out block
    with pytest.raises(ConfigError, match="dataclass Readout has the name of another summary.json block"):
        register_stage(MEAN.replace(block=readout))


def test_the_same_name_twice_is_refused(registered):

    register_stage(MEAN)  # the same declaration again: nothing happens
    with pytest.raises(ConfigError, match="already registered"):
        register_stage(MEAN.replace(title="another"))


def _fields_as_keys(stage: AnalysisStage, **changes) -> FieldsAsKeys:
    """`stage`'s declarations with `changes`, as a stage whose block's fields are summary.json keys."""
    declared = {k: v for k, v in vars(stage).items() if not k.startswith("_")}
    return FieldsAsKeys(**{**declared, **changes})


def test_a_block_whose_field_is_already_a_summary_key_is_refused():
    """A stage whose block's fields are top-level keys (the spine's, `FieldsAsKeys`) cannot take a
    key that is summary.json's own or another stage's."""
    from dataclasses import make_dataclass

    from probe.core.stages import registered

    registered()
    for field_name in ("readout", "verdicts"):
        block = make_dataclass("MeanMerged", [(field_name, list)])
        with pytest.raises(ConfigError, match=f"its summary.json key '{field_name}' is already taken"):
            register_stage(_fields_as_keys(MEAN, name="mean_merged", settings=None, block=block))


def test_the_spine_is_registered_stages_whose_fields_are_top_level_keys():
    """evaluate, readout and layers are registered stages with no section of their own, run first (with
    the induced weights, a provider with no block), and a written summary reads their blocks and fields
    as attributes (the committed quick report)."""
    from probe.analysis.spectral import SpectralSettings
    from probe.core.stages import registered
    from probe.reporting.layer_blocks import LayerAnalyses
    from probe.reporting.schema import Summary
    from probe.stages.spectral import Spectral

    stages = registered()
    assert list(stages)[:5] == ["evaluate", "readout", "induced", "layers", "spectral"]
    assert isinstance(stages["layers"], FieldsAsKeys) and stages["layers"].settings is None
    assert stages["layers"].keys == ("best_match", "trend", "table1", "nulls", "span")
    assert stages["evaluate"].keys == ("icl_error", "icl_r2") and stages["evaluate"].required_keys == ("icl_error",)
    assert not isinstance(stages["readout"], FieldsAsKeys) and stages["readout"].keys == ("readout",)
    assert stages["induced"].block is None and stages["induced"].keys == ()
    assert not {"layers", "evaluate"} & set(resolve_recipe("quick").stages)
    # the spectral filter is one stage with its own section, block and key
    assert stages["spectral"].settings is SpectralSettings and resolve_recipe("quick").spectral.bins == 12
    # their commands are derived from them (probe/cli/stage.py) or written by hand in probe/cli
    from probe.cli import COMMANDS

    assert [c.name for c in stages["layers"].derived_commands] == ["heatmap", "span"]
    assert stages["spectral"].command_names == ("spectral",) and stages["readout"].command_names == ("readout",)
    assert stages["induced"].command_names == () and stages["evaluate"].command_names == ("evaluate",)
    derived = {name for stage in stages.values() for name in stage.command_names}
    assert "evaluate" in derived and not derived & set(COMMANDS)  # none written by hand
    assert stages["interventions"].command_names == ("ablate", "patch")
    data = json.loads((Path(__file__).parents[1] / "reports" / "gpt2-default-quick" / "summary.json").read_text())
    summary = Summary.from_json(data)
    assert isinstance(summary.stages["layers"], LayerAnalyses) and "induced" not in summary.stages
    assert summary.readout.error == data["readout"]["error"] and summary.icl_error.model == data["icl_error"]["model"]
    assert summary.best_match["newton"]["sime"].k == data["best_match"]["newton"]["sime"]["k"]
    assert isinstance(summary.spectral, Spectral) and summary.to_json()["spectral"] == data["spectral"]


@dataclass
class MeanCurves:
    """Two top-level keys of summary.json, as the spine's blocks are."""

    mean_curve_examples: list[int]
    mean_curve_abs: list[float]


@pytest.mark.slow
def test_a_fields_as_keys_stage_writes_its_fields_at_the_top_level_and_reads_back(ckpt, tmp_path):
    """FieldsAsKeys: the block's fields are summary.json keys of their own, valid against the
    schema with the stage registered, and read back as the Summary's attributes."""

    from probe.reporting.schema import Summary, check_summary

    merged = _fields_as_keys(
        MEAN,
        block=MeanCurves,
        summarise=lambda t, recipe: MeanCurves(
            t["mean_prediction"].n_examples.tolist(), t["mean_prediction"].mean_abs.tolist()
        ),
        findings=lambda block, summary: f"Mean |prediction| at the end: {block.mean_curve_abs[-1]:.3f}.",
        tables=None,
    )
    register_stage(merged)
    try:
        out = tmp_path / "r"
        assert main(_report_args(ckpt, out)) == 0
        data = json.loads((out / "summary.json").read_text())
        assert "mean_prediction" not in data and len(data["mean_curve_abs"]) == len(data["mean_curve_examples"]) > 1
        check_summary(data)
        summary = Summary.from_json(data)
        assert summary.mean_curve_abs == data["mean_curve_abs"] and summary.readout.layer
        assert "Mean |prediction| at the end" in (out / "index.html").read_text()
        data["mean_curve_abs"] = "many"
        with pytest.raises(ConfigError, match="mean_curve_abs"):
            check_summary(data)
    finally:
        unregister_stage(merged.name)


@pytest.mark.slow  # a study and a report, end to end
def test_a_registered_stage_with_study_rows_is_a_study_analysis_on_its_page(ckpt, tmp_path, monkeypatch):
    """A stage declared here with a `study_rows` hook is an analysis a study recipe may name: the
    study runs it through the report's stage, its rows are in study.csv (one per model and number
    of examples, equal to the stage's own table) and its section is on the study page, with no
    file of probe/ changed; `study --help` lists it, and an unknown analysis is refused."""

    from probe.study.recipe import resolve_study

    rows = lambda t: [
        {"metric": "mean_abs", "value": r.mean_abs, "n_examples": int(r.n_examples)}
        for r in t["mean_prediction"].itertuples()
    ]
    stage = MEAN.replace(study_rows=rows)
    register_stage(stage)
    try:
        (tmp_path / "s.toml").write_text(
            f'description = "mean"\ncheckpoints = ["{ckpt}"]\nanalyses = ["evaluate", "mean_prediction"]\n'
            'x = "family"\nevaluate_prompts = 32\n[set]\n"mean_prediction.prompts" = 16\n'
        )
        monkeypatch.chdir(tmp_path)
        assert main(["-q", "study", "s.toml", "--out", "out"]) == 0
        table = pd.read_csv(tmp_path / "out" / "study.csv")
        mine = table[table.analysis == "mean_prediction"].sort_values("n_examples")
        report_out = tmp_path / "r"
        assert main(_report_args(ckpt, report_out, "--set", "mean_prediction.prompts=16")) == 0
        own = pd.read_csv(report_out / "data" / "mean_prediction.csv")
        assert list(mine.n_examples) == list(own.n_examples) and (mine.metric == "mean_abs").all()
        assert mine.value.to_numpy() == pytest.approx(own.mean_abs.to_numpy(), rel=1e-6)
        assert "Mean prediction size" in (tmp_path / "out" / "index.html").read_text()
        assert "mean_prediction" in resolve_study("s.toml").analyses
    finally:
        unregister_stage(stage.name)
    with pytest.raises(ConfigError, match="Unknown analysis 'mean_prediction'"):
        resolve_study(str(tmp_path / "s.toml"))


def test_a_stage_that_needs_one_that_does_not_run_before_it_is_refused():
    """`needs` names stages that run earlier (the toolkit's, then plugins' in registration order):
    a name nobody registered is refused when the stages are listed, naming it."""

    from probe.core.stages import registered

    stage = MEAN.replace(needs=("layerz",))
    register_stage(stage)
    try:
        with pytest.raises(ConfigError, match="needs 'layerz', which does not run before it"):
            registered()
    finally:
        unregister_stage(stage.name)
    assert "spectral" in registered()  # the toolkit's own: spectral needs layers, which runs first


class MeanStage(AnalysisStage):
    """The same analysis as MEAN written as a subclass: class attributes and overridden methods."""

    name = "mean_prediction"
    settings = MeanSettings
    block = MeanBlock
    title = "Mean prediction size"
    description = MEAN.description
    files = ("mean_peak",)

    def run(self, c):
        return _run(c)

    def summarise(self, t, recipe):
        return MEAN.summarise(t, recipe)

    def findings(self, block, summary):
        return MEAN.findings(block, summary)


def test_a_stage_written_as_a_subclass_runs_as_its_declaration_does(ckpt):
    """A subclass of AnalysisStage with its own run, summarise and findings registers and runs in a
    report; the hooks it does not override add nothing; the defaults are told from overrides."""
    import probe
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache

    stage = MeanStage()
    assert stage.overrides("run") and stage.overrides("findings") and not stage.overrides("figures")
    assert MEAN.overrides("figures") and not MEAN.overrides("study_rows")
    assert stage.figures({}, Path("unused"), None) == {} and stage.evidence(None, None, "gd", "newton") == []
    register_stage(stage)
    try:
        model = load_checkpoint(ckpt)
        built = run_stages(model, probe.recipe("smoke"), "cpu", StageCache(None), False, only={"mean_prediction"})
        block = stage.summarise(built.tables, None)
        assert block.n_examples == list(range(model.config.task.n_points))
        assert built.data["mean_peak"]["mean_abs"] == pytest.approx(max(block.mean_abs))
        assert stage.findings(block, None).startswith("Mean |prediction| after")
    finally:
        unregister_stage(stage.name)


def test_a_stage_without_run_or_an_unknown_declaration_is_refused():
    class NoRun(AnalysisStage):
        name = "no_run"
        block = MeanBlock

        def summarise(self, t, recipe):
            return None

    with pytest.raises(ConfigError, match="analysis stage 'no_run': it needs its own run"):
        register_stage(NoRun())
    with pytest.raises(ConfigError, match="unknown declaration 'runs'"):
        AnalysisStage(name="typo", runs=_run)
    with pytest.raises(ConfigError, match="register_stage takes an AnalysisStage"):
        register_stage(MeanStage)


def test_a_provider_has_no_block_key_or_summarise_and_may_not_have_a_section_or_page():
    """A stage with no block (a provider, as the induced weights) needs only `run`, takes no
    summary.json key and writes no block; one with a recipe section, a page or files is refused."""
    from probe.core.stages import StageTables

    provider = AnalysisStage(name="mean_provider", run=lambda c: StageTables({}, {"x": 1}))
    register_stage(provider)
    try:
        assert provider.keys == () and provider.summarise(StageTables(), None) is None
    finally:
        unregister_stage(provider.name)
    with pytest.raises(ConfigError, match="a stage without a block is a provider: no settings, page or files"):
        register_stage(MEAN.replace(block=None))  # MEAN has a recipe section
    with pytest.raises(ConfigError, match="a stage without a block is a provider"):
        register_stage(provider.replace(page=lambda *a: []))


@pytest.mark.slow
def test_a_stage_that_writes_its_own_page_section_replaces_the_standard_one(ckpt, tmp_path):
    """`page` returns the stage's sections as (title, HTML): the report shows them in its place of the
    standard section (description, tables, figures) and gives them the page's context; its figures
    keep their own names (the spine's way, probe/stages/sections.py)."""
    seen = {}

    def page(block, summary, figs, tables, context):
        seen.update(figs=set(figs), card="card" in context["tables"])
        return [("Mean, by hand", f"<p>written by the stage: {len(block.n_examples)} counts</p>")]

    stage = MEAN.replace(page=page)
    assert stage.overrides("page") and not MEAN.overrides("page")
    register_stage(stage)
    try:
        out = tmp_path / "r"
        assert main(_report_args(ckpt, out)) == 0
        html = (out / "index.html").read_text()
        n = json.loads((out / "summary.json").read_text())["mean_prediction"]["n_examples"]
        assert "Mean, by hand</h2>" in html
        assert f"<p>written by the stage: {len(n)} counts</p>" in html
        assert MEAN.description.replace("<", "&lt;").replace(">", "&gt;") not in html  # no standard section
        assert "curve" in seen["figs"] and "mean_prediction/curve" not in seen["figs"] and seen["card"]
    finally:
        unregister_stage(stage.name)


def test_a_stage_draws_from_streams_keyed_by_its_name():
    """`stage.generator(seed, part)`: the same name, part and seed give the same draws, any other
    differs; the stream numbers lie above every entry of the central table (probe/core/seeds.py)."""
    import torch

    from probe.core.seeds import NAMED_BASE, Stream, generator_for, named_stream

    draw = lambda g: torch.randn(4, generator=g)
    assert torch.equal(draw(MEAN.generator(3, "prompts")), draw(MEAN.generator(3, "prompts")))
    others = [
        MEAN.generator(4, "prompts"),
        MEAN.generator(3, "noise"),
        MeanStage().replace(name="mean_other").generator(3, "prompts"),
    ]
    assert all(not torch.equal(draw(MEAN.generator(3, "prompts")), draw(g)) for g in others)
    assert torch.equal(
        draw(MEAN.generator(3, "prompts")), draw(generator_for(3, named_stream("mean_prediction", "prompts")))
    )
    assert (
        min(named_stream(n, p) for n in ("a", "mean_prediction", "ols_gap") for p in ("", "x"))
        >= NAMED_BASE
        > max(Stream)
    )
