"""Garg et al.'s evaluation prompt families (probe/data/shifts.py) against hand-checkable
properties, and known answers: the planted GD model under input and label scaling is GD with the
construction's fixed step (diverging at input scale 3, not at 2), least squares is exact on the
half-subspace shift once t >= d/2."""

import numpy as np
import pytest
import torch

from probe.analysis.evaluate import shifted_error_curve
from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.data.shifts import SHIFTS, parse_shift, shifted_prompts
from probe.io.planted_io import planted_config
from probe.learners import run_learner
from probe.models.planted import plant

TASK = TaskConfig(n_dims=4, n_points=12)


def test_quadrant_shifts_put_the_examples_in_one_orthant():
    p = shifted_prompts(TASK, "random_quadrants", 64, seed=1)
    signs = p.xs.sign()
    assert (signs == signs[:, :1]).all()  # one sign pattern per prompt
    assert not (p.queries.sign() == signs).all()  # the query is an ordinary draw
    torch.testing.assert_close(p.queries.abs(), p.xs.abs())  # of the same z
    o = shifted_prompts(TASK, "opposite_quadrants", 64, seed=1)
    torch.testing.assert_close(o.queries, -o.xs)
    torch.testing.assert_close(o.query_ys, torch.einsum("bnd,bd->bn", o.queries, o.w))


def test_orthogonal_queries_are_orthogonal_to_every_example_and_keep_their_norm():
    p = shifted_prompts(TASK, "orthogonal_train_test", 32, seed=2)
    d = TASK.n_dims
    for t in range(d):
        q = p.queries[:, t]
        assert t == 0 or torch.einsum("bkd,bd->bk", p.xs[:, :t], q).abs().max() < 1e-4
        torch.testing.assert_close(q.norm(dim=-1), p.xs[:, t].norm(dim=-1))
    assert p.queries[:, d:].isnan().all()


def test_overlapping_queries_repeat_an_earlier_example():
    p = shifted_prompts(TASK, "overlapping_train_test", 32, seed=3)
    for t in range(1, TASK.n_points):
        same = (p.xs[:, :t] == p.queries[:, t : t + 1]).all(-1)  # (B, t)
        assert same.any(-1).all()


def test_subspace_skew_and_scales():
    d = TASK.n_dims
    half = shifted_prompts(TASK, "half_subspace", 200, seed=4)
    flat = half.xs.reshape(-1, d)
    assert torch.linalg.matrix_rank(flat.double(), rtol=1e-5) == d // 2 and half.queries is half.xs
    assert (flat**2).sum(-1).mean() == pytest.approx(d, rel=0.1)  # normalised to d in total
    skew = shifted_prompts(TASK, "skewed", 2000, seed=4).xs.reshape(-1, d).double()
    e = 1 / torch.arange(1.0, d + 1, dtype=torch.float64)
    expected = (d * e**2 / (e**2).sum()).sort().values
    np.testing.assert_allclose(torch.linalg.eigvalsh(skew.T @ skew / len(skew)).numpy(), expected.numpy(), rtol=0.1)
    base = shifted_prompts(TASK, "scale_x", 16, seed=5, value=1.0)
    torch.testing.assert_close(shifted_prompts(TASK, "scale_x", 16, seed=5, value=3.0).xs, 3 * base.xs)
    torch.testing.assert_close(shifted_prompts(TASK, "scale_y", 16, seed=5, value=0.5).ys, 0.5 * base.ys)
    noisy = shifted_prompts(TASK, "noisy", 16, seed=5)
    assert float(noisy.ys.std()) == pytest.approx(d**0.5) and noisy.query_ys is noisy.ys


@pytest.mark.parametrize(
    ("text", "message"),
    [("quadrants", "unknown shift 'quadrants'"), ("scale_x=big", "must be a number"),
     ("scale_x=-1", "positive number"), ("half_subspace=2", "takes no value")],
)
def test_bad_shifts_are_named(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_shift(text)


def test_shifts_refuse_tasks_they_do_not_define():
    with pytest.raises(ConfigError, match="isotropic linear regression"):
        shifted_prompts(TaskConfig(n_dims=4, n_points=12, covariance="ill_conditioned"), "skewed", 4)


def test_planted_gd_under_scaling_is_gd_with_its_fixed_step_and_diverges_past_the_threshold():
    step, steps = 1 / 9, 6
    model = plant(planted_config("gd", steps, 4, 16, step_size=step).model).double()
    task = TaskConfig(n_dims=4, n_points=16)
    last = {}
    for shift, value in (("scale_x", 2.0), ("scale_x", 3.0), ("scale_y", 3.0)):
        curve = shifted_error_curve(model, task, shift, value, 128, seed=0, n_boot=50)
        p = shifted_prompts(task, shift, 128, 0, None, value)
        gd = run_learner("gd", p.xs.double(), p.ys.double(), eta=(step,), steps=(steps,)).preds[0]
        reference = ((gd - p.ys.double()) ** 2 / 4).mean(0).numpy()
        np.testing.assert_allclose(curve.model.to_numpy(), reference, rtol=1e-5, atol=1e-8)
        last[(shift, value)] = curve.model.iloc[-1]
    zero_predictor = 9.0  # error / d of predicting 0 at input scale 3
    assert last[("scale_x", 3.0)] > 3 * zero_predictor > 3 * last[("scale_x", 2.0)]


def test_least_squares_is_exact_on_the_half_subspace_from_d_over_2_examples():
    model = plant(planted_config("gd", 2, 4, 16, step_size=0.1).model)
    curve = shifted_error_curve(model, TaskConfig(n_dims=4, n_points=16), "half_subspace", None, 64, n_boot=20)
    assert (curve.least_squares[2:] < 1e-10).all() and curve.least_squares[1] > 0.01
    assert set(curve["shift"]) == {"half_subspace"} and set(SHIFTS) >= {"random_quadrants", "noisy"}


def test_evaluate_cli_runs_a_shift_and_refuses_a_bad_one(tmp_path, capsys):
    import json

    from probe.cli import main

    assert main(["-q", "evaluate", "checkpoints/planted/gd", "--shift", "scale_x=3", "--prompts", "64",
                 "--out", str(tmp_path / "e")]) == 0
    import pandas as pd

    frame = pd.read_csv(tmp_path / "e" / "icl_error.csv")
    assert set(frame["shift"]) == {"scale_x=3"} and frame.model.iloc[-1] > 9
    assert json.loads((tmp_path / "e" / "evaluate_summary.json").read_text())["options"]["shift"] == "scale_x=3"
    assert main(["-q", "evaluate", "checkpoints/planted/gd", "--shift", "quadrants", "--out", str(tmp_path / "f")]) != 0
    assert "unknown shift 'quadrants'" in capsys.readouterr().err and not (tmp_path / "f").exists()
    assert main(["-q", "evaluate", "checkpoints/gpt2-illcond", "--shift", "skewed", "--out", str(tmp_path / "g")]) != 0
    assert "isotropic linear regression" in capsys.readouterr().err


@pytest.mark.parametrize("shift", ["scale_x=1e300", "scale_y=1e300", "noisy=1e300"])
def test_a_shift_value_that_overflows_the_prompts_is_refused_naming_the_shift(shift):
    """The prompts are float32: a scale beyond its range made infinities that a learner then refused
    as the user's "prompts" (which the user never gave)."""
    with pytest.raises(ConfigError, match=rf"^shift {shift.split('=')[0]} \(value 1e\+300\) makes the prompts overflow"):
        shifted_prompts(TaskConfig(n_dims=3, n_points=6), shift, 8)
    # the value written in the shift is the one used (it was the default, 2, unless passed as `value`)
    task = TaskConfig(n_dims=3, n_points=6)
    written, passed = shifted_prompts(task, "scale_x=3", 8), shifted_prompts(task, "scale_x", 8, value=3.0)
    assert torch.equal(written.xs, passed.xs) and not torch.equal(written.xs, shifted_prompts(task, "scale_x", 8).xs)


def test_the_shifts_that_replace_the_query_are_the_ones_flagged():
    """`Shift.replaces_query` (what the ood stage's cost estimate reads) is what each shift does: its
    queries are not its examples exactly where flagged."""
    from probe.data.config import TaskConfig
    from probe.data.shifts import SHIFTS, shifted_prompts

    task = TaskConfig(n_dims=4, n_points=8)
    for name, spec in SHIFTS.items():
        p = shifted_prompts(task, name, 4, 0, None, spec.default)
        assert (p.queries is not p.xs) == spec.replaces_query, name
