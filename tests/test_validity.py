"""Answers only where they hold: the precondition that a model learns in context, validity domains
of the evidence rows, and ties that name nothing (probe/reporting/validity.py, the evidence table,
off-distribution tracking)."""

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO

from probe.analysis.evaluate import error_curve, trivial_margin
from probe.core.validity import STATUSES, Domain, Validity
from probe.reporting.columns import columns
from probe.reporting.evidence import _consolidate
from probe.reporting.schema import EvidenceRow
from probe.reporting.validity import conditions, learns_in_context
from probe.stages.evaluate import IclError


def _summary(curve: IclError, d: int = 4, **task):
    task = {"n_dims": d, "covariance": "isotropic", "kappa": 100.0, "noise_std": 0.0, **task}
    return SimpleNamespace(icl_error=curve, checkpoint=SimpleNamespace(task=task), readout=None)


def _curve(model, zero, averaging, margin, lo, hi, n=(0, 9, 15)):
    k = len(n)
    return IclError(
        list(n), [model] * k, [model] * k, [model] * k, [0.0] * k, [0.5] * k, [averaging] * k,
        [zero] * k, [margin] * k, [lo] * k, [hi] * k,
    )


def _validated_row(favours="gd", domain=None):
    return EvidenceRow("spectral filter", favours, "effect", validated_on="planted GD", domain=domain)


def test_trivial_margin_is_the_paired_difference_to_the_better_trivial_predictor():
    """Per position the better on average of zero and averaging; the margin's interval is paired."""
    model = torch.tensor([[0.5, 0.2], [0.7, 0.4], [0.6, 0.3]])
    averaging = torch.tensor([[0.9, 0.3], [1.1, 0.5], [1.0, 0.4]])  # better at position 1 (0.4 < 1.0)
    zero = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])  # better at position 0 (1.0 = averaging)
    lo, hi, margin = trivial_margin(model, averaging, zero, n_boot=200, seed=0)
    assert margin.tolist() == pytest.approx([0.4, 0.1])
    assert (lo <= margin).all() and (margin <= hi).all()
    assert lo[1] == pytest.approx(0.1) and hi[1] == pytest.approx(0.1)  # the same margin on every prompt


def test_a_model_above_the_trivial_predictors_gets_no_answer():
    """Error / d 0.70 at 2d+1 where averaging gives 0.56: 'no answer', never a learner, whatever the
    validated rows favour; the knob is the model itself."""
    pre = learns_in_context(_summary(_curve(0.70, 1.0, 0.56, -0.14, -0.2, -0.08)))
    assert pre.status == "no answer" and pre.status in STATUSES
    assert "not below the better of the zero predictor and the averaging estimator" in pre.reason
    assert pre.knob == "the model (train it further)"
    q = _consolidate("newton", "gd", [_validated_row("gd")], pre)
    assert q.answer is None and q.status == "no answer"
    assert q.answer_words.startswith("no answer: the model's error / d at 9 examples (0.7)")
    # a margin whose interval reaches 0 is not enough either; more prompts is the knob
    pre = learns_in_context(_summary(_curve(0.50, 1.0, 0.56, 0.06, -0.01, 0.12)))
    assert pre.status == "no answer" and pre.knob.startswith("prompts.curve")
    # a model well below both answers
    assert learns_in_context(_summary(_curve(0.01, 1.0, 0.56, 0.55, 0.5, 0.6))).status == "answered"


@pytest.mark.slow
def test_a_200_step_gpt2_gets_no_answer_and_the_shipped_default_an_answer():
    """The case as named: the default recipe's GPT-2 trained 200 steps does not learn in context
    (its error at 2d+1 is not below averaging's), so the evidence table names no learner; the
    shipped 12,000-step default passes the same precondition."""
    from probe.core.config import load_recipe, merge, parse_override
    from probe.io.formats import load_checkpoint
    from probe.io.run_config import RunConfig
    from probe.training.train import train

    data = merge(load_recipe(REPO / "recipes" / "gpt2-default.toml"), parse_override("train.steps=200"))
    data = merge(data, parse_override("train.eval_every=200"))
    cfg = RunConfig.from_dict(data)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = train(cfg, tmp, progress=False)
        short = columns(error_curve(model, cfg.task, 512, seed=0, n_boot=200), IclError)
    pre = learns_in_context(_summary(short))
    assert pre.status == "no answer", pre.values
    assert _consolidate("newton", "gd", [_validated_row("gd")], pre).answer is None
    shipped = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    curve = columns(error_curve(shipped.model, shipped.config.task, 512, seed=0, n_boot=200), IclError)
    assert learns_in_context(_summary(curve)).status == "answered"


def test_a_row_outside_its_domain_is_unvalidated_here_and_not_counted():
    domain = Domain(d=(4, 8), kappa=(1, 1), readout=("model",))
    assert domain.outside({"d": 8, "kappa": 100.0, "noise_std": 0.0, "readout": "ridge"}) == [
        "kappa = 100",
        "read-out ridge",
    ]
    assert domain.outside({"d": 4, "kappa": 1.0}) == []
    # a union of boxes: covered by any; else the nearest box's misses, with the knob for prompts
    union = Validity((domain, Domain(d=(4, 4), kappa=(1, 100), prompts=(512, math.inf), readout=("ridge",))))
    assert union.outside({"d": 4, "kappa": 100.0, "readout": "ridge", "prompts": 512}) == []
    assert union.outside({"d": 4, "kappa": 100.0, "readout": "ridge", "prompts": 64}) == [
        "prompts = 64 (needs >= 512: raise prompts.induced) / kappa = 100, read-out ridge"
    ]
    # outside every box: each box's misses, the nearest first
    assert union.outside({"d": 8, "kappa": 100.0, "readout": "model", "prompts": 512}) == ["kappa = 100 / d = 8, read-out model"]
    inside = _validated_row("gd")
    outside = EvidenceRow(
        "spectral filter", "gd", "e", validated_on="planted GD", status="unvalidated here", outside="kappa = 100"
    )
    assert _consolidate("newton", "gd", [inside]).answer == "gd"
    q = _consolidate("newton", "gd", [outside])
    assert q.answer is None and q.status == "no answer"
    assert "unvalidated here: outside kappa = 100" in q.answer_words


def test_conditions_read_from_a_summary():
    s = _summary(None, d=8, covariance="ill_conditioned", kappa=100.0, noise_std=0.5)
    s.readout = SimpleNamespace(method="ridge")
    s.recipe = {"prompts": {"induced": 512, "test": 256}}
    assert conditions(s) == {"d": 8, "kappa": 100.0, "noise_std": 0.5, "readout": "ridge", "prompts": 256}
    assert conditions(_summary(None))["kappa"] == 1.0  # isotropic: kappa is not the task's setting


@pytest.mark.slow
def test_ood_on_the_default_checkpoint_under_orthogonal_train_test_tracks_no_family(tmp_path):
    """As named: `icl-probe ood checkpoints/gpt2-default --shifts orthogonal_train_test` printed
    'tracks least_squares' when every family predicts ~0 (relative distance 0.99999, winning
    difference 4e-11); now no family is named."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "probe", "ood", str(REPO / "checkpoints" / "gpt2-default"), "--shifts",
         "orthogonal_train_test", "--out", str(tmp_path / "ood")],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "tracks no family under orthogonal_train_test" in out.stdout
    assert "both predict ~0" in out.stdout
    assert "tracks least_squares" not in out.stdout
