"""Which learner a model tracks under a shift (issue 64 item 2): the planted GD model is GD with
its construction's fixed step in distribution, and under inputs scaled past that step's stability
it is told apart from every learner whose step adapts (probe/analysis/shift_tracking.py)."""

import pytest

from probe.analysis.shift_tracking import matched_members, track_under_shift, tracking_words
from probe.cli import main
from probe.io.planted_io import planted_config
from probe.models.planted import plant

STEP, STEPS = 1 / 9, 6


@pytest.fixture(scope="module")
def planted_gd():
    cfg = planted_config("gd", STEPS, 4, 16, step_size=STEP)
    return plant(cfg.model), cfg.task


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


def test_track_needs_a_shift(tmp_path, capsys):
    code = main(["-q", "evaluate", "--track", "--prompts", "8", "--out", str(tmp_path / "out")])
    assert code != 0 and "--track compares learners under a shift: give --shift" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
