"""Which learner a model tracks under a shift: the planted GD model is GD with
its construction's fixed step in distribution, and under inputs scaled past that step's stability
it is told apart from every learner whose step adapts; the planted Newton model is Newton with its
fixed alpha, and diverges where that learner does and GD with the matched fixed step does not
(probe/analysis/shift_tracking.py)."""

import pandas as pd
import pytest
import torch

from probe.analysis.shift_tracking import (
    PerPrompt,
    Tracking,
    _diverged,
    _masked_mean,
    matched_members,
    side_comparisons,
    track_under_shift,
    tracking_words,
)
from probe.cli import main
from probe.io.planted_io import planted_config
from probe.models.planted import plant

STEP, STEPS = 1 / 9, 6


@pytest.fixture(scope="module")
def planted_gd():
    cfg = planted_config("gd", STEPS, 4, 16, step_size=STEP)
    return plant(cfg.model), cfg.task


@pytest.mark.slow
def test_the_planted_gd_model_is_matched_to_its_step_and_tracked_where_it_diverges(planted_gd):
    model, task = planted_gd
    matched = matched_members(model, task, n_prompts=128)
    learner, params, distance = matched["gd_fixed_step"]
    assert learner == "gd"
    assert params["steps"] == (STEPS,) and params["eta"][0] == pytest.approx(STEP, rel=0.01) and distance < 1e-6
    diverging = track_under_shift(model, task, "scale_x=3", n_prompts=128, n_boot=200, matched=matched)
    assert diverging.tracks == "gd_fixed_step" and diverging.separable
    rows = diverging.table.set_index("family")
    assert rows.loc["gd_adaptive_step", "relative_distance"] > 0.9  # a step that adapts does not follow it
    assert "tracks gd_fixed_step" in tracking_words(diverging)


@pytest.mark.slow
def test_the_planted_newton_model_is_matched_to_its_alpha_and_tracked_where_it_diverges():
    cfg = planted_config("newton", 21, 4, 16)  # 9 iterations at the construction's default alpha
    model, task, alpha = plant(cfg.model), cfg.task, cfg.model.planted_scale
    matched = matched_members(model, task, n_prompts=128)
    learner, params, distance = matched["newton_fixed_alpha"]
    assert learner == "newton" and params["iterations"] == (9,) and distance < 1e-10
    assert params["alpha"][0] == pytest.approx(alpha, rel=1e-4)
    # alpha x 2^k fixes the in-distribution match of GD too (a close but not equal filter)
    assert matched["gd_fixed_step"][2] > 1e3 * distance
    tracking = track_under_shift(model, task, "scale_x=3", n_prompts=128, n_boot=200, matched=matched)
    rows = tracking.table.set_index("family")
    assert rows.loc["newton_fixed_alpha", "model_diverged"] > 0.5 and rows.loc["newton_fixed_alpha", "mismatch"] == 0
    assert tracking.tracks == "newton_fixed_alpha" and tracking.separable and tracking.best.criterion == "mismatch"
    assert "diverges on" in tracking_words(tracking)
    sides = tracking.compare("gd_fixed_step", "newton_fixed_alpha")  # either order gives the same answer
    assert sides == tracking.compare("newton_fixed_alpha", "gd_fixed_step") and sides.closer == "newton_fixed_alpha"
    assert sides.separable and sides.difference == pytest.approx(rows.loc["gd_fixed_step", "mismatch"])


def test_divergence_is_told_from_distance():
    pred = torch.tensor([[1.0, float("nan")], [2e3, 1.0], [1.0, 1.0]])
    assert _diverged(pred, 1e3).tolist() == [[False, True], [True, False], [False, False]]
    values, mask = torch.tensor([[1.0, 2.0], [float("inf"), 4.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    out = _masked_mean(values, mask)
    assert out[0] == 1.0 and torch.isnan(out[1])  # the second column keeps no prompt


@pytest.mark.slow
def test_a_tie_at_the_zero_predictor_is_written_as_no_family(tmp_path):
    """Under orthogonal train and test inputs every learner predicts ~0 at the query: the written
    answer says the model tracks no family, and `tie` says why, so `tracks` (the nearest family
    only) is not read as an answer."""
    import json

    out = tmp_path / "out"
    code = main(["-q", "evaluate", "--shift", "orthogonal_train_test", "--track", "--prompts", "64", "--out", str(out)])
    answer = json.loads((out / "shift_tracking.json").read_text())
    assert code == 0 and "predict ~0" in answer["tie"] and not answer["separable"]
    assert "tracks no family" in answer["words"]


def test_track_needs_a_shift(tmp_path, capsys):
    code = main(["-q", "evaluate", "--track", "--prompts", "8", "--out", str(tmp_path / "out")])
    assert code != 0 and "--track compares learners under a shift: give --shift" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_side_comparisons_name_the_planted_algorithm_under_scaled_inputs(planted_gd):
    model, task = planted_gd
    tracking = track_under_shift(model, task, "scale_x=3", n_prompts=128, n_boot=200)
    sides = side_comparisons(tracking).set_index("a")
    newton_gd = sides.loc["newton"]
    assert newton_gd.favours == "gd" and newton_gd.family_b == "gd_fixed_step" and newton_gd.difference < 0
    assert newton_gd.ci_high < 0 and newton_gd.criterion == "mismatch" and newton_gd.resolved


def test_a_side_is_not_favoured_when_the_model_is_further_from_both_than_their_gap():
    """A model that is neither learner (here: their average plus a large offset) is separable from
    both by its distance, but the hypotheses' gap is below its distance: no side is favoured."""
    g = torch.Generator().manual_seed(0)
    n, t = 400, 6
    a, b = torch.randn(n, t, generator=g), torch.randn(n, t, generator=g)
    b = a + 0.05 * (b - b.mean(1, keepdim=True))  # mean zero per prompt: the offset adds the same to both
    model = 0.3 * a + 0.7 * b + 1.0  # nearer b, far from both
    families = ["gd_fixed_step", "newton_fixed_alpha", "ridge", "least_squares"]
    preds = {"gd_fixed_step": a, "newton_fixed_alpha": b, "ridge": a, "least_squares": b}
    dist = torch.stack([((preds[f] - model) ** 2).mean(1) for f in families], 1)
    pp = PerPrompt(families, torch.zeros(n, 4, dtype=torch.float64), dist.double(), torch.ones(n, 4).double(), 200, 0, preds, 1)
    c = pp.compare("gd_fixed_step", "newton_fixed_alpha")
    assert c.closer == "newton_fixed_alpha" and c.separable and c.criterion == "distance"
    assert pp.gap("gd_fixed_step", "newton_fixed_alpha") == pytest.approx(float(((a - b) ** 2).mean()), rel=1e-6)
    table = pd.DataFrame({"shift": "x", "family": families, "distance": dist.mean(0).numpy(), "relative_distance": 1.0})
    tracking = Tracking(table, c, pd.DataFrame(), pp)
    sides = side_comparisons(tracking).set_index("a")
    assert sides.loc["newton"].favours is None and not sides.loc["newton"].resolved
