"""`icl-probe study`: per-model numbers equal the single analyses, resume after a kill, the
submitit path, and clear errors before any work."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import build_cfg

from probe.cli import main
from probe.core.errors import ConfigError
from probe.io.checkpoint import save_model
from probe.models import build_model

TINY = '''
description = "tiny"
checkpoints = ["m/L*"]
analyses = ["evaluate", "heatmap", "spd_ilw"]
x = "n_layer"
prompts = 16
evaluate_prompts = 32
[set]
"prompts.train" = 32
"prompts.val" = 16
"prompts.test" = 32
"prompts.induced" = 8
"similarity.bootstrap" = 20
"similarity.simw" = false
sweeps = [{label = "newton", learner = "newton", axis = "iterations", grid = {iterations = [0, 1, 2, 3]}}]
[[compare]]
label = "gd_best"
learner = "gd"
grid = {steps = [0, 1, 2, 4, 8]}
pick = "best"
[[compare]]
label = "ridge_bayes"
learner = "ridge"
grid = {lam = ["bayes"]}
[[compare]]
label = "least_squares"
learner = "least_squares"
'''


@pytest.fixture()
def family(tmp_path, monkeypatch):
    for layers in (1, 2):
        torch.manual_seed(layers)
        cfg = build_cfg(layers=layers)
        cfg.task.noise_std = 0.5
        save_model(build_model(cfg.model).eval(), cfg, tmp_path / "m" / f"L{layers}", {"train_step": 10 * layers})
    (tmp_path / "s.toml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_study_matches_single_analyses_and_resumes(family, monkeypatch):

    # interrupt after the first finished model, as a kill would
    from probe.io.checkpoint import atomic_write

    finished = []

    def dying(path, write):
        atomic_write(path, write)
        if path.name == "done.json":
            finished.append(path)
            raise KeyboardInterrupt

    monkeypatch.setattr("probe.study.run.atomic_write", dying)  # where a finished model's done.json is written
    assert main(["-q", "study", "s.toml", "--out", "out"]) == 130
    monkeypatch.setattr("probe.study.run.atomic_write", atomic_write)
    assert len(finished) == 1
    first = finished[0].parent / "rows.csv"
    stamp = first.stat().st_mtime_ns
    assert main(["-q", "study", "s.toml", "--out", "out"]) == 0
    assert first.stat().st_mtime_ns == stamp  # the finished model was not recomputed
    table = pd.read_csv(family / "out" / "study.csv", keep_default_na=False)
    assert set(table.model) == {"m/L1", "m/L2"} and set(table.n_layer) == {1, 2}
    # a resumed study equals a fresh one, byte for byte (its table and its closest-learner verdicts)
    assert main(["-q", "study", "s.toml", "--out", "fresh"]) == 0
    assert (family / "fresh" / "study.csv").read_bytes() == (family / "out" / "study.csv").read_bytes()
    verdicts = [json.loads((family / d / "summary.json").read_text())["closest_learner"] for d in ("out", "fresh")]
    assert verdicts[0] == verdicts[1]
    assert {"noise_std", "train_step"} <= set(table.columns)

    # the same numbers as the standalone report on one of the models
    assert main(["-q", "report", "m/L2", "--recipe", "quick", "--out", "rep", "--set", "prompts.train=32",
                 "--set", "prompts.val=16", "--set", "prompts.test=32", "--set", "prompts.induced=8",
                 "--set", "similarity.bootstrap=20", "--set", "similarity.simw=false", "--set",
                 'sweeps=[{label = "newton", learner = "newton", axis = "iterations", grid = {iterations = [0, 1, 2, 3]}}]',
                 "--set", "probes.enabled=false", "--set", "forgetting.enabled=false",
                 "--set", "prompts.curve=32"]) == 0
    best = pd.read_csv(family / "rep" / "data" / "best_match.csv")
    mine = table[(table.model == "m/L2") & (table.metric == "sime_best_k")].sort_values("layer")
    assert mine.value.tolist() == best[best.metric == "sime"].sort_values("layer").k.tolist()
    err = pd.read_csv(family / "rep" / "data" / "icl_error.csv")
    at = table[(table.model == "m/L2") & (table.metric == "error") & (table.learner == "model")].sort_values("n_examples")
    np.testing.assert_allclose(at.value, err.model, rtol=1e-9)

    # SPD / ILW against an independent computation for least squares
    from probe.analysis.similarity import induced_weights
    from probe.analysis.states import query_predictions
    from probe.data.tasks import generator_for, sample_prompts
    from probe.io.formats import load_checkpoint
    from probe.learners import run_learner

    ckpt = load_checkpoint("m/L2")
    p = sample_prompts(ckpt.config.task, 16, generator=generator_for(0, 401))
    q = torch.randn(16, 12, 3, generator=generator_for(0, 402))
    qp = query_predictions(ckpt.model, p.xs, p.ys, q, "cpu")
    ls = run_learner("least_squares", p.xs, p.ys, q)
    spd = ((qp[:, 1:] - ls.query_preds[0, :, 1:]) ** 2).mean().item()
    w = induced_weights(qp[None], q)[0]
    ilw = ((w[:, 1:] - ls.weights[0, :, 1:]) ** 2).sum(-1).mean().item()
    rows = table[(table.model == "m/L2") & (table.learner == "least_squares")].set_index("metric").value
    assert rows["spd"] == pytest.approx(spd, rel=1e-6) and rows["ilw"] == pytest.approx(ilw, rel=1e-6)
    summary = json.loads((family / "out" / "summary.json").read_text())
    assert set(summary["closest_learner"]) == {"m/L1", "m/L2"}
    assert "/" not in "".join(summary["models"]).replace("m/", "")  # relative names, no machine paths
    html = (family / "out" / "index.html").read_text()
    assert "Findings" in html and "http" not in html


@pytest.mark.slow
def test_submitit_debug_executor_gives_the_same_table(family):
    assert main(["-q", "study", "s.toml", "--out", "a", "--set", 'analyses=["spd_ilw"]']) == 0
    assert main(["-q", "study", "s.toml", "--out", "b", "--set", 'analyses=["spd_ilw"]', "--executor", "slurm",
                 "--slurm-cluster", "debug"]) == 0
    a = pd.read_csv(family / "a" / "study.csv")
    b = pd.read_csv(family / "b" / "study.csv")
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.parametrize("override,culprit", [
    ('checkpoints=["nowhere/*"]', "matches no directory"),
    ('analyses=["evaluate", "probez"]', "Unknown analysis 'probez'"),
    ('checkpoints=[]', "either `checkpoints`"),
    ('run="m/L1"', "either `checkpoints`"),
    ('x=1', "x must be a string"),
])
def test_bad_studies_fail_before_work(family, capsys, override, culprit):
    assert main(["-q", "study", "s.toml", "--out", "out", "--set", override]) == 2
    err = capsys.readouterr().err
    assert culprit in err and len(err.strip().splitlines()) == 1
    assert not (family / "out").exists()


def test_mixed_tasks_and_empty_snapshot_runs_are_refused(family, capsys):
    cfg = build_cfg(d=2, layers=1)
    save_model(build_model(cfg.model).eval(), cfg, family / "m" / "L9")
    assert main(["-q", "study", "s.toml", "--out", "out"]) == 2
    assert "different tasks" in capsys.readouterr().err
    from probe.study.run import check_models

    models = sorted((family / "m").iterdir())
    assert {f["n_dims"] for f in check_models(models, "n_dims").values()} == {2, 3}  # d is what such a study varies
    assert main(["-q", "study", "s.toml", "--out", "out", "--set", 'checkpoints=[]', "--set", 'run="m/L1"']) == 2
    assert "no snapshots" in capsys.readouterr().err
    assert not (family / "out").exists()
    with pytest.raises(ConfigError, match="Unknown study recipe"):
        from probe.study.recipe import resolve_study

        resolve_study("depth-phasez")


@pytest.mark.slow
@pytest.mark.parametrize(("study", "model"), [("depth-noiseless", "checkpoints/depth/L1"),
                                              ("width", "checkpoints/width/W16"),
                                              ("seeds-default", "checkpoints/gpt2-default-seed1"),
                                              ("seeds-d8", "checkpoints/gpt2-d8-seed2"),
                                              ("seeds-d8-illcond", "checkpoints/gpt2-d8-illcond-seed2")])
def test_shipped_study_recipes_reproduce_the_committed_tables(study, model, tmp_path, monkeypatch):
    """A committed study's rows for one of its models (its cheapest), recomputed from the shipped
    checkpoint with the study recipe as it is, equal the committed study.csv (no retraining)."""
    from conftest import REPO

    committed = REPO / "reports" / f"study-{study}" / "study.csv"
    if not committed.is_file():
        pytest.skip(f"{committed} is not committed yet")
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    assert main(["-q", "study", study, "--out", str(out), "--set", f'checkpoints=["{model}"]']) == 0
    ours = pd.read_csv(out / "study.csv", keep_default_na=False, na_values=[""])
    theirs = pd.read_csv(committed, keep_default_na=False, na_values=[""])
    theirs = theirs[theirs.model == model].reset_index(drop=True)
    # metrics added since the table was committed (the best matches' grid-end flags) are not in it yet
    ours = ours[ours.metric.isin(set(theirs.metric))].reset_index(drop=True)
    assert len(ours) == len(theirs) > 10
    # across machines (another CPU's float32 kernels in the forward) the spectral fits move by up to
    # 1e-5 relative; a layer without an exponent (no response) has no class worth the name, and
    # which of PCR and least squares its flat filter sits closer to is a tie that rounding decides
    unread = (theirs.analysis == "spectral") & theirs.value.isna()
    ours.loc[unread, "learner"] = theirs.loc[unread, "learner"]
    pd.testing.assert_frame_equal(ours[theirs.columns], theirs, check_exact=False, atol=1e-6, rtol=1e-4)


def _spd_rows(model: str, n_layer: int, values: dict[str, float], half: float = 0.01) -> list[dict]:
    rows = []
    for learner, v in values.items():
        for metric in ("spd", "ilw"):
            rows.append({"model": model, "analysis": "spd_ilw", "metric": metric, "learner": learner, "layer": -1,
                         "n_examples": -1, "shift": "", "value": v, "ci_low": v - half, "ci_high": v + half,
                         "n_layer": n_layer})
    return rows


def _icl_rows(model: str, n_layer: int, error: float, band: float, zero: float = 1.0) -> list[dict]:
    base = {"model": model, "analysis": "evaluate", "layer": -1, "shift": "", "n_layer": n_layer}
    return [
        {**base, "metric": "error_at_2d1", "learner": "model", "n_examples": 9, "value": error,
         "ci_low": error - band, "ci_high": error + band},
        {**base, "metric": "error", "learner": "least_squares", "n_examples": 0, "value": zero,
         "ci_low": float("nan"), "ci_high": float("nan")},
    ]


def test_study_findings_read_the_phases_intervals_and_caveats_from_the_table():
    """A table built by hand: GD closest at depth 1, ridge at 2-3, least squares at 4 (separated), an
    overlap at depth 3, and a depth-1 model whose error band reaches the zero predictor's."""
    from probe.study.findings import closest_learners, study_findings

    rows = (_spd_rows("L1", 1, {"gd_1step": 0.1, "ridge_best": 0.5, "least_squares": 2.0})
            + _spd_rows("L2", 2, {"gd_1step": 0.5, "ridge_best": 0.1, "least_squares": 0.9})
            + _spd_rows("L3", 3, {"gd_1step": 0.9, "ridge_best": 0.100, "least_squares": 0.105})
            + _spd_rows("L4", 4, {"gd_1step": 0.9, "ridge_best": 0.5, "least_squares": 0.01})
            + _icl_rows("L1", 1, 0.95, 0.1) + _icl_rows("L4", 4, 0.01, 0.005))
    rows.append({"model": "L2", "analysis": "spd_ilw", "metric": "best_lam", "learner": "ridge_best", "layer": -1,
                 "n_examples": -1, "shift": "", "value": 0.1, "ci_low": float("nan"), "ci_high": float("nan"),
                 "n_layer": 2})
    table = pd.DataFrame(rows)
    closest = closest_learners(table)
    assert closest["L3"]["spd"]["closest"] == "ridge_best" and closest["L3"]["spd"]["separated"] is False
    assert closest["L4"]["spd"]["separated"] is True and closest["L4"]["spd"]["ci"] == pytest.approx([0.0, 0.02])
    titles = {"gd_1step": "GD (1 step)", "ridge_best": "ridge (best lambda)"}  # the recipe's [[compare]] titles
    headline, items, caveats = study_findings(table, "n_layer", closest, titles)
    assert headline == ("Closest learner by SPD, against layers: GD (1 step) at 1 → ridge (best lambda) at 2-3 "
                        "(2: lam 0.1) → least squares at 4.")
    assert items[0].startswith("Closest learner by ILW") and "1: 0.95 [0.85, 1.05]" in items[1]
    assert "bands are apart" in items[1]
    assert len(caveats) == 2 and "L3 (SPD, ILW)" in caveats[0] and "L1 (in distribution)" in caveats[1]
    assert "L4" not in caveats[1]


def test_a_study_page_is_redrawn_from_its_table_without_recomputing(tmp_path):
    """`rerender` on a committed study: the same numbers, the run's provenance kept, the page in the
    report's template (findings with a headline before the first figure, captions under figures)."""
    import shutil

    from conftest import REPO

    from probe.study.present import read_table, rerender
    from probe.study.recipe import resolve_study

    src = REPO / "reports" / "study-depth-noiseless"
    shutil.copytree(src, tmp_path / "s")
    before = json.loads((src / "summary.json").read_text())
    after = rerender(tmp_path / "s", resolve_study("depth-noiseless"))
    assert after["git_commit"] == before["git_commit"] and "rendered" in after
    assert after["icl_at_2d1"] == before["icl_at_2d1"]
    for model, entry in before["closest_learner"].items():
        for metric, e in entry.items():
            assert after["closest_learner"][model][metric]["value"] == e["value"]
    pd.testing.assert_frame_equal(read_table(tmp_path / "s" / "study.csv"), read_table(src / "study.csv"))
    page = (tmp_path / "s" / "index.html").read_text()
    assert page.index('class="headline"') < page.index("<figure") and "SIME" not in page
    assert page.count("<figcaption>") == page.count("<figure>") >= 3


def test_study_x_axis_is_a_model_field_and_a_typo_is_named(tmp_path):
    from probe import default_checkpoint
    from probe.core.errors import ConfigError
    from probe.study.analyses import model_fields
    from probe.study.recipe import X_AXES, StudyRecipe

    assert set(X_AXES) == set(model_fields(default_checkpoint())) | {"prompt_seed"}  # a run field (study_units)
    with pytest.raises(ConfigError, match="Unknown axis 'n_embdd'. Did you mean: n_embd"):
        StudyRecipe(checkpoints=["ck"], analyses=["evaluate"], x="n_embdd")
    with pytest.raises(ConfigError, match="study.seed must be an integer in 0..2\\^63-1"):
        StudyRecipe(checkpoints=["ck"], analyses=["evaluate"], seed=2**70)


@pytest.mark.slow
def test_a_study_carries_each_models_evidence_table(family):
    """analysis "evidence": per model the report's evidence table (probe/reporting/evidence.py) as
    rows, +1 / -1 / 0 for the question's first / second hypothesis / neither, the consolidated
    answers in summary.json and a table on the page."""
    recipe = TINY.replace('analyses = ["evaluate", "heatmap", "spd_ilw"]', 'analyses = ["evidence"]').replace(
        'sweeps = [{label = "newton", learner = "newton", axis = "iterations", grid = {iterations = [0, 1, 2, 3]}}]',
        'sweeps = [{label = "newton", learner = "newton", axis = "iterations", grid = {iterations = [0, 1, 2]}}, '
        '{label = "gd", learner = "gd", axis = "steps", grid = {steps = [0, 1, 2, 4], eta = ["auto"]}}]',
    )
    (family / "ev.toml").write_text(recipe.split("[[compare]]")[0])
    assert main(["-q", "study", "ev.toml", "--out", "ev"]) == 0
    table = pd.read_csv(family / "ev" / "study.csv", keep_default_na=False)
    rows = table[table.analysis == "evidence"]
    assert set(rows.metric) == {"newton_vs_gd"} and set(rows.value) <= {-1.0, 0.0, 1.0}
    assert {"Table 1 SimE", "consolidated answer"} <= set(rows.learner)
    answers = rows[rows.learner == "consolidated answer"]
    summary = json.loads((family / "ev" / "summary.json").read_text())
    side = {1.0: "newton", -1.0: "gd", 0.0: "undecided"}
    assert summary["evidence"] == {r.model: {"newton vs gd": side[r.value]} for r in answers.itertuples()}
    assert len(summary["evidence"]) == 2
    assert "Evidence tables: consolidated answers" in (family / "ev" / "index.html").read_text()


@pytest.mark.parametrize("study", ["seeds-default", "seeds-d8", "seeds-d8-illcond"])
def test_the_seeds_study_holds_one_row_per_seed(study):
    """The replication studies of the d = 4, d = 8 and d = 8 kappa = 100 recipes (analyses/seeds-*.toml): each training
    seed is one model, its seed in `train_seed`, with one consolidated answer per question and one
    spectral exponent row per layer."""
    from conftest import REPO

    table = pd.read_csv(REPO / "reports" / f"study-{study}" / "study.csv", keep_default_na=False, na_values=[""])
    seeds = table.groupby("model").train_seed.unique()
    assert sorted(int(v[0]) for v in seeds) == [0, 1, 2] and all(len(v) == 1 for v in seeds)
    answers = table[(table.analysis == "evidence") & (table.learner == "consolidated answer")]
    assert (answers.groupby(["model", "metric"]).size() == 1).all() and answers.model.nunique() == 3
    spectral = table[(table.analysis == "spectral") & (table.metric == "spectral_p")]
    assert (spectral.groupby(["model", "layer"]).size() == 1).all()
    assert spectral.groupby("model").layer.nunique().nunique() == 1  # the same layers on every seed


def test_a_study_page_shows_the_spectral_readings_per_layer(tmp_path):
    """The spectral rows of study.csv (each layer's reading and exponent) and their figure are on the
    study page, not only in the table and figures/ beside it."""
    import shutil

    from conftest import REPO

    from probe.study.present import read_table, rerender, spectral_table
    from probe.study.recipe import resolve_study

    src = REPO / "reports" / "study-depth-noiseless"
    shutil.copytree(src, tmp_path / "s")
    rerender(tmp_path / "s", resolve_study("depth-noiseless"))
    page = (tmp_path / "s" / "index.html").read_text()
    assert "Spectral filter per layer" in page and 'src="figures/spectral_p.png"' in page
    frame = read_table(src / "study.csv")
    readings = spectral_table(frame, "n_layer")
    rows = frame[(frame.analysis == "spectral") & (frame.metric == "spectral_p")]
    assert len(readings) == len(rows) > 0
    assert list(readings.columns) == ["model", "n_layer", "layer", "reading", "p", "p low", "p high"]
    first = readings.iloc[0]
    assert f"<td>{first.reading}</td>" in page.replace("&amp;", "&")


REPORT_RECIPE = '''
[prompts]
train = 32
val = 16
test = 32
induced = 8
[similarity]
bootstrap = 20
[[sweeps]]
label = "newton"
learner = "newton"
axis = "iterations"
grid = {iterations = [0, 1, 2]}
[[sweeps]]
label = "gd"
learner = "gd"
axis = "steps"
grid = {steps = [0, 1, 2, 4], eta = ["auto"]}
'''


@pytest.mark.slow
def test_a_study_of_checkpoints_named_on_the_command_line(family):
    """`icl-probe study CK1 CK2 --recipe R`: evaluate, heatmap, spectral and evidence on each, on
    the axis the models vary along, with each best match's grid-end flag in the table."""
    (family / "tiny-report.toml").write_text(REPORT_RECIPE)
    argv = ["-q", "study", "m/L1", "m/L2", "--recipe", "tiny-report.toml", "--out", "cli", "--set", "evaluate_prompts=32"]
    assert main(argv) == 0
    table = pd.read_csv(family / "cli" / "study.csv", keep_default_na=False)
    assert sorted(set(table.model)) == ["m/L1", "m/L2"]
    assert set(table.analysis) == {"evaluate", "heatmap", "spectral", "evidence"}
    assert set(table[table.metric == "sime_at_grid_end"].value.astype(float)) <= {0.0, 1.0}
    summary = json.loads((family / "cli" / "summary.json").read_text())
    assert summary["recipe"]["x"] == "n_layer" and summary["recipe"]["report"] == "tiny-report.toml"


def test_a_study_of_checkpoints_refuses_a_path_that_is_not_one(family, capsys):
    assert main(["-q", "study", "m/L1", "m/nothing", "--out", "bad"]) == 2
    assert "study: m/nothing is not a checkpoint directory" in capsys.readouterr().err
    assert not (family / "bad").exists()


def test_the_axis_of_a_study_of_checkpoints_is_the_field_they_vary_along():
    from probe.study.recipe import varying_axis

    base = {"family": "gpt2", "n_layer": 8, "n_dims": 4, "train_seed": 0}
    assert varying_axis([base, {**base, "family": "lstm"}]) == "family"
    assert varying_axis([base, {**base, "train_seed": 1}]) == "train_seed"
    assert varying_axis([base, {**base, "family": "lstm", "n_dims": 8}]) == "n_dims"  # several d: only n_dims
    assert varying_axis([base, base]) == "family"


def test_study_help_lists_the_recipe_keys(capsys):
    with pytest.raises(SystemExit):
        main(["study", "--help"])
    out = capsys.readouterr().out
    for key in ("checkpoints", "analyses", "evaluate_prompts", "x ", "[[compare]]", "--recipe"):
        assert key in out, key


def test_categories_on_the_x_axis_are_named_one_by_one_and_grid_ends_are_flagged(tmp_path):
    """A family axis reads "gpt2, lstm", never the range "gpt2-lstm", and is drawn without a line
    joining the categories; a last layer matched at its grid's end says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from probe.study.findings import _span, best_k_sentence
    from probe.study.present import _categories, _with_interval, _x_axis

    assert _span(["gpt2", "lstm"]) == "gpt2, lstm" and _span([2, 3, 4]) == "2-4"
    rows = pd.DataFrame({"model": ["a", "b"], "family": ["lstm", "gpt2"], "value": [1.0, 2.0],
                         "ci_low": [0.5, 1.5], "ci_high": [1.5, 2.5]})
    fig, ax = plt.subplots()
    _with_interval(ax, rows, "family", "x", "C0", _categories(rows.family))
    _x_axis(ax, rows.family, "family")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["gpt2", "lstm"]
    assert ax.lines[0].get_linestyle() == "None"  # points only
    plt.close(fig)
    table = pd.DataFrame(
        [
            {"model": m, "family": f, "analysis": "heatmap", "metric": metric, "learner": "gd", "layer": 2,
             "value": v, "ci_low": v, "ci_high": v}
            for m, f, metric, v in (("a", "gpt2", "sime_best_k", 64.0), ("a", "gpt2", "sime_at_grid_end", 1.0),
                                    ("b", "lstm", "sime_best_k", 8.0), ("b", "lstm", "sime_at_grid_end", 0.0))
        ]
    )
    (sentence,) = best_k_sentence(table, "family")
    assert "gpt2: 64 [64, 64] (at the grid's end); lstm: 8 [8, 8]." in sentence


def test_the_headline_holds_on_a_seed_as_defined_up_front():
    """Holds on a seed: the first seed's consolidated Newton-or-GD answer and at least 3 responding
    layers in the first-order class (GD or ridge, also not separated from each other; not where
    Newton's class is the runner-up) with p's 90% interval below 1.5."""
    from probe.study.findings import first_order_reading, replication, replication_sentence

    assert first_order_reading("gd") and first_order_reading("ridge not separable from gd")
    assert not first_order_reading("gd not separable from precond_gd") and not first_order_reading("precond_gd")
    assert not first_order_reading("no response") and not first_order_reading("ambiguous: lam_t gd / lam_max ridge")

    def seed(model, s, answer, verdicts, highs):
        rows = [{"model": model, "train_seed": s, "analysis": "evidence", "metric": "newton_vs_gd",
                 "learner": "consolidated answer", "layer": -1, "value": answer, "ci_low": "", "ci_high": ""}]
        rows += [{"model": model, "train_seed": s, "analysis": "spectral", "metric": "spectral_p", "learner": v,
                  "layer": i, "value": 1.0, "ci_low": 0.8, "ci_high": h} for i, (v, h) in enumerate(zip(verdicts, highs))]
        return rows

    table = pd.DataFrame(
        seed("a", 0, -1.0, ["no response", "gd", "ridge not separable from gd", "gd", "gd"], [None, 1.2, 1.1, 1.4, 1.6])
        + seed("b", 1, -1.0, ["gd", "gd", "gd not separable from precond_gd", "gd"], [1.2, 1.2, 1.2, 1.2])
        + seed("c", 2, 0.0, ["gd", "gd", "gd", "gd"], [1.0, 1.0, 1.0, 1.0])
    )
    rows = replication(table, "train_seed")
    assert [(r["layers"], r["holds"]) for r in rows] == [([1, 2, 3], True), ([0, 1, 3], True), ([0, 1, 2, 3], False)]
    sentence = replication_sentence(table, "train_seed")
    assert sentence.startswith("The headline holds on some training seed (2 of 3;")
    assert "does not hold (answer undecided, 4 first-order layers: 0, 1, 2, 3)" in sentence
    assert sentence.endswith("No layer of any training seed reads the Newton (S-preconditioned) class.")
    table.loc[(table.model == "c") & (table.layer == 2) & (table.analysis == "spectral"), "learner"] = "precond_gd"
    assert [r["newton_layers"] for r in replication(table, "train_seed")] == [[], [], [2]]  # not b's not-separable one
    assert replication_sentence(table, "train_seed").endswith(
        "Layers in the Newton (S-preconditioned) class: training seed 2: 2."
    )


def test_a_study_is_sized_by_the_stages_it_runs(family, capsys):
    """The study's up-front check counts only the report stages its analyses run: a huge value of a
    stage it does not run (ood.prompts; TINY runs evaluate, heatmap and spd_ilw) is no reason to
    refuse it, one of a stage it runs (prompts.test) is, by name, before any model runs."""
    from probe.study.recipe import resolve_study
    from probe.study.run import check_study_size

    models = sorted((family / "m").iterdir())
    check_study_size(resolve_study("s.toml", [{"set": {"ood.prompts": 10**9}}]), models)
    with pytest.raises(ConfigError, match="prompts.test"):
        check_study_size(resolve_study("s.toml", [{"set": {"prompts.test": 10**9}}]), models)


def test_prompt_seeds_analyse_one_model_on_independent_prompt_draws(family):
    """`prompt_seeds`: each model once per seed, named "<model> (prompt seed s)" with `prompt_seed`
    a column; seed 0's rows are the plain study's (its default draws), seed 1's are other prompts."""
    from probe.study.recipe import resolve_study
    from probe.study.run import run_study

    base = {"checkpoints": ["m/L1"], "analyses": ["evaluate", "heatmap"], "x": "prompt_seed"}
    seeded = run_study(resolve_study("s.toml", [{**base, "prompt_seeds": [0, 1]}]), family / "seeded", progress=False)
    plain = run_study(resolve_study("s.toml", [{**base, "x": "n_layer"}]), family / "plain", progress=False)
    assert sorted(seeded.model.unique()) == ["m/L1 (prompt seed 0)", "m/L1 (prompt seed 1)"]
    assert sorted(seeded.prompt_seed.unique()) == [0, 1]
    cols = ["analysis", "metric", "learner", "layer", "n_examples", "shift", "value", "ci_low", "ci_high"]
    zero = seeded[seeded.prompt_seed == 0][cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(zero, plain[cols].reset_index(drop=True))
    one = seeded[seeded.prompt_seed == 1][cols].reset_index(drop=True)
    assert len(one) == len(zero) and not np.allclose(one.value.to_numpy(), zero.value.to_numpy())
    with pytest.raises(ConfigError, match='x = "prompt_seed" needs prompt_seeds'):
        resolve_study("s.toml", [base])
    with pytest.raises(ConfigError, match="repeats a seed"):
        resolve_study("s.toml", [{**base, "prompt_seeds": [1, 1]}])


def test_a_best_match_that_settles_only_at_the_last_snapshot_is_said_to_be_still_moving():
    """Settling 'at step 30000' when 30000 is the last snapshot means the match never settled."""
    from probe.study.present import stabilisation_sentence

    text = stabilisation_sentence("Iterative Newton", {"2": 7200, "3": 9300, "4": 30000, "5": 30000}, 30000)
    assert text == (
        "Iterative Newton: the best match stabilises (within 1 of its final value) at step 7200 (layer 2), "
        "9300 (layer 3); still moving at the last snapshot (step 30000): layers 4, 5."
    )
    assert stabilisation_sentence("GD", {"0": 500}, 30000).endswith("at step 500 (layer 0).")
    assert stabilisation_sentence("GD", {"7": 30000}, 30000) == "GD: still moving at the last snapshot (step 30000): layer 7."


def test_the_mechanism_figure_reads_each_verdict_and_is_drawn_for_training_steps_only(tmp_path):
    """The training-dynamics figure colours each layer's spectral verdict by its reading (first-order,
    Newton class, undecided, not a filter, converged, no response) and is drawn only on a training-
    step axis with spectral and error rows."""
    from conftest import REPO

    from probe.study.present import mechanism_figure, read_table, spectral_reading

    assert spectral_reading("gd") == spectral_reading("ridge not separable from gd") == "first-order (GD or ridge)"
    assert spectral_reading("precond_gd") == "Newton class (S-preconditioned)"
    assert spectral_reading("gd not separable from precond_gd").startswith("undecided")
    assert spectral_reading("mixed: gd 0.59 [0.52, 0.63] + ridge").startswith("undecided")
    assert spectral_reading("not a spectral filter") == "not a filter of S"
    table = read_table(REPO / "reports" / "study-training-dynamics-d8" / "study.csv")
    path = mechanism_figure(table, "train_step", tmp_path / "mechanism")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert mechanism_figure(table.assign(train_seed=0), "train_seed", tmp_path / "none") is None


def test_study_workers_get_their_threads_from_the_environment_not_set_num_threads(monkeypatch):
    """probe/study/run.py `child_threads`: a process started inside (as the spawned study workers
    are) loads torch with OMP_NUM_THREADS threads; this process's environment is as it was after,
    set or unset. torch.set_num_threads(n > 1) in a worker would make MKL's batched LU of 257 x 257
    systems wrong (probe/core/threads.py), so the workers' initializer takes no thread count."""
    import inspect
    import os
    import subprocess
    import sys

    from probe.study import run

    show = [sys.executable, "-c", "import torch; print(torch.get_num_threads())"]
    for before in (None, "5"):
        if before is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", before)
        with run.child_threads(1):  # (torch caps the count at the cores; one differs from the default on >= 2)
            assert subprocess.run(show, check=True, capture_output=True, text=True).stdout.strip() == "1"
        assert os.environ.get("OMP_NUM_THREADS") == before
    assert not inspect.signature(run._init_worker).parameters
