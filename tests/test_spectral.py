"""The spectral instrument (probe/analysis/spectral.py) and the two learners it adds: identities to
round-off, plain matrix loops, bin-wise bounds from the closed-form response, and known answers
(reference weights, oracles, planted models) with tolerances from the estimator's measured bias."""

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from probe.analysis.pipeline import LayerSettings, analyse_spectrum
from probe.analysis.readout import ReadoutSettings
from probe.analysis.spectral import (
    SpectralSettings,
    reference_families,
    spectral_analysis,
)
from probe.analysis.spectral_bins import directions, make_bins
from probe.analysis.spectral_references import CLASSES
from probe.core.errors import ConfigError
from probe.core.settings import PromptSettings, SimilaritySettings
from probe.data.config import TaskConfig
from probe.learners import run_learner
from probe.models.oracle import LearnerOracle

D, N = 4, 16
# the local exponent's bias over r in [0.05, 0.95], measured on the exact references on these prompts:
# GD (fixed step, lambda / t) 0.96-1.11, the seeds' Newton (fixed alpha, lambda / t) 1.89-1.99
GD_P = (0.9, 1.2)
NEWTON_P = (1.8, 2.1)


def prompts(b=64, n=N, d=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs = torch.randn(b, n, d, generator=g, dtype=torch.float64)
    w = torch.randn(b, d, generator=g, dtype=torch.float64)
    return xs, torch.einsum("bnd,bd->bn", xs, w)


def test_newton_identity_is_gd_with_two_to_the_k_steps():
    xs, ys = prompts(8, 12)
    for alpha, gd_grid in ((0.05, {"eta": [0.05]}), ("spectral", {"eta": ["auto"], "convention": ["code"]})):
        a = run_learner("newton_identity", xs, ys, iterations=[0, 1, 3, 5], alpha=[alpha]).weights
        b = run_learner("gd", xs, ys, steps=[1, 2, 8, 32], **gd_grid).weights
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_seeds_newton_is_preconditioned_gd_with_two_to_the_k_steps():
    xs, ys = prompts(8, 12)
    for alpha, eta in ((0.01, 0.01), ("spectral", "auto")):
        a = run_learner("newton", xs, ys, iterations=[0, 1, 3, 5], alpha=[alpha]).weights
        b = run_learner("precond_gd", xs, ys, steps=[1, 2, 8, 32], eta=[eta]).weights
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_new_learners_match_plain_matrix_loops():
    xs, ys = prompts(3, 9)
    t = 7  # prefix: the first 7 examples
    x, y = xs[:, :t].numpy(), ys[:, :t].numpy()
    pg = run_learner("precond_gd", xs, ys, steps=[5], eta=[0.002]).weights[0, :, t].numpy()
    ni = run_learner("newton_identity", xs, ys, iterations=[3], alpha=[0.08]).weights[0, :, t].numpy()
    for i in range(3):
        s, b = x[i].T @ x[i], x[i].T @ y[i]
        w = np.zeros(D)
        for _ in range(5):  # eta 0.002 on S/t: 0.002 / t^2 on S
            w = w + 0.002 / t**2 * s @ (b - s @ w)
        np.testing.assert_allclose(pg[i], w, rtol=1e-10, atol=1e-12)
        m = 0.08 / t * np.eye(D)  # alpha 0.08 on S/t: 0.08 / t on S
        for _ in range(3):
            m = 2 * m - m @ s @ m
        np.testing.assert_allclose(ni[i], m @ b, rtol=1e-10, atol=1e-12)


def test_binned_response_lies_between_the_closed_form_at_the_bin_edges():
    """GD with a fixed step is a function of lambda / t alone: r = 1 - (1 - eta u)^k is increasing,
    so a bin's b^2-weighted mean response lies between its values at the bin's edges."""
    xs, ys = prompts()
    eta, k = 0.1, 6
    w = run_learner("gd", xs, ys, steps=[k], eta=[eta]).weights
    res = spectral_analysis(w, xs, ys, n_boot=20, families=reference_families(D)[-1:])
    bins = make_bins(directions(xs, ys), "lam_t", 12, 20)
    rows = res.curves[(res.curves.kind == "layer") & (res.curves.variable == "lam_t")]
    resp = lambda u: 1 - (1 - eta * u) ** k
    for r in rows.itertuples():
        lo, hi = resp(bins.edges[r.bin]), resp(bins.edges[r.bin + 1])
        assert lo - 1e-12 <= r.r <= hi + 1e-12
        assert bins.edges[r.bin] <= r.u <= bins.edges[r.bin + 1]


def test_response_is_invariant_to_rotations_and_label_scale():
    """A rotation of the inputs changes every eigenvector (and eigh's arbitrary signs) but not the
    response of a rotation-equivariant learner; scaling y scales both a and b."""
    xs, ys = prompts(32)
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    base = spectral_analysis(run_learner("gd", xs, ys, steps=[4], eta=[0.1]).weights, xs, ys, n_boot=20)
    rotated = spectral_analysis(run_learner("gd", xs @ q, ys, steps=[4], eta=[0.1]).weights, xs @ q, ys, n_boot=20)
    scaled = spectral_analysis(run_learner("gd", xs, 3 * ys, steps=[4], eta=[0.1]).weights, xs, 3 * ys, n_boot=20)
    for other in (rotated, scaled):
        np.testing.assert_allclose(other.curves.r, base.curves.r, rtol=1e-8, atol=1e-12)


def test_reference_weights_are_classified_with_their_exponent():
    xs, ys = prompts()
    gd = run_learner("gd", xs, ys, steps=[1, 2, 4, 8], eta=[1 / 9]).weights
    newton = run_learner("newton", xs, ys, iterations=[3, 4, 5], alpha=[1 / 324]).weights
    res = spectral_analysis(torch.cat([gd, newton]), xs, ys, n_boot=100)
    summary = res.summary.set_index("predictor")
    for i in range(4):
        row = summary.loc[str(i)]
        assert row.verdict == "gd" and row.variable == "lam_t"
        assert GD_P[0] < row.p < GD_P[1]
    for i in range(4, 7):
        row = summary.loc[str(i)]
        assert row.verdict == "precond_gd"
        assert NEWTON_P[0] < row.p < NEWTON_P[1]
    fits = res.layers[res.layers.variable == "lam_t"].set_index("predictor")
    assert fits.loc["0", "best_family"] == "gd_fixed" and fits.loc["0", "best_k"] == 1
    assert fits.loc["3", "best_k"] == 8 and fits.loc["3", "gain"] == pytest.approx(1.0)
    assert (fits.error < 1e-12).all()  # each is its own reference, exactly
    # the references' own exponents in their own variable: the bias the tolerances above come from
    own = res.references[res.references.own_variable].set_index("family")
    assert GD_P[0] < own.loc["gd_fixed", "p_median"] < GD_P[1]
    assert NEWTON_P[0] < own.loc["newton_fixed", "p_median"] < NEWTON_P[1]


def oracle_settings(n_boot=100):
    return LayerSettings(
        PromptSettings(train=64, val=32, test=64, induced=64, queries=16),
        ReadoutSettings(method="model"),
        SimilaritySettings(bootstrap=n_boot),
        (),
    )


TASK = TaskConfig(n_dims=D, n_points=N)


@pytest.mark.parametrize(
    ("learner", "schedule", "fixed", "klass"),
    [
        ("gd", lambda l: 2**l if l else 0, {"eta": [1 / 9]}, "gd"),  # GD with 2^l steps: reads as Newton's rate
        ("newton_identity", lambda l: l, {"alpha": [1 / 9]}, "gd"),  # Newton from alpha I
        ("newton", lambda l: l + 2, {"alpha": [1 / 324]}, "precond_gd"),  # the seeds' Newton
    ],
)
def test_oracles_land_in_their_filter_class(learner, schedule, fixed, klass):
    oracle = LearnerOracle(learner, "iterations" if learner != "gd" else "steps", schedule, 4, D, N, fixed=fixed)
    res = analyse_spectrum(oracle, TASK, oracle_settings())
    summary = res.summary.set_index("predictor")
    answered = summary[~summary.verdict.isin(["no response", "converged"])]
    assert len(answered) >= 2
    assert (answered.verdict == klass).all(), answered.verdict.tolist()
    assert "2^k" in CLASSES[klass]  # the output names the equivalence
    lo, hi = GD_P if klass == "gd" else NEWTON_P
    measured = answered.p.dropna()
    assert len(measured) and ((measured > lo) & (measured < hi)).all(), measured.tolist()


@pytest.mark.slow
def test_planted_gd_and_newton(planted_checkpoints):
    gd, newton = planted_checkpoints
    settings = oracle_settings()
    res = analyse_spectrum(gd.model, gd.config.task, settings)
    summary = res.summary.set_index("predictor")
    assert summary.loc["0", "verdict"] == "no response"
    for layer in range(1, gd.config.model.n_layer + 1):
        assert summary.loc[str(layer), "verdict"] == "gd"
        assert GD_P[0] < summary.loc[str(layer), "p"] < GD_P[1]
    res = analyse_spectrum(newton.model, newton.config.task, settings)
    summary = res.summary.set_index("predictor")
    later = summary.loc[[str(l) for l in range(9, newton.config.model.n_layer + 1)]]
    assert (later.verdict == "precond_gd").all()
    assert ((later.p > NEWTON_P[0]) & (later.p < NEWTON_P[1])).all()


@pytest.fixture(scope="module")
def planted_checkpoints():
    from probe.io.formats import load_checkpoint

    return load_checkpoint("checkpoints/planted/gd"), load_checkpoint("checkpoints/planted/newton")


def test_bad_inputs_are_refused():
    xs, ys = prompts(4)
    with pytest.raises(ConfigError, match="layer weights must have shape"):
        spectral_analysis(torch.zeros(2, 4, N, D + 1), xs, ys)
    with pytest.raises(ConfigError, match="more than d = 4 points"):
        spectral_analysis(torch.zeros(1, 4, 4, D), xs[:, :4], ys[:, :4])
    with pytest.raises(ConfigError, match="spectral.r_low .* must be below spectral.r_high"):
        SpectralSettings(r_low=0.9, r_high=0.5)
    with pytest.raises(ConfigError, match="spectral.bins"):
        SpectralSettings(bins=2)
    # a min_count no bin reaches: one message naming it and the fullest bin (was an AttributeError of
    # the empty tables)
    with pytest.raises(ConfigError, match=r"^spectral.min_count = 10000: no bin of lambda / t holds .* \(the fullest holds \d+ of 192\)"):
        make_bins(directions(xs, ys), "lam_t", 12, 10_000)


@pytest.mark.parametrize(
    "section, values, knob",
    [
        ("spectral", {"bins": 10**12}, "spectral.bins"),
        ("similarity", {"bootstrap": 10**12}, "similarity.bootstrap"),
        ("prompts", {"queries": 10**12}, "prompts.queries"),
    ],
)
def test_the_spectral_command_checks_its_knobs_before_any_work(section, values, knob):
    """analyse_spectrum (`icl-probe spectral`, `probe.spectral`) refuses what the machine cannot hold
    naming the knob, as the report's up-front check does; these reached torch's allocator."""
    oracle = LearnerOracle("gd", "steps", lambda l: l, 3, D, N, fixed={"eta": [1 / 9]})
    defaults = {"spectral": SpectralSettings(), "similarity": SimilaritySettings(), "prompts": PromptSettings()}
    settings = LayerSettings(**{**{k: v for k, v in defaults.items() if k != section}, section: type(defaults[section])(**values)})
    with pytest.raises(ConfigError, match=rf"^{knob} = 1000000000000 would need about"):
        analyse_spectrum(oracle, TASK, settings)


def test_zero_predictor_has_no_response():
    xs, ys = prompts(32)
    res = spectral_analysis(torch.zeros(1, *xs.shape, dtype=torch.float64), xs, ys, n_boot=20)
    assert res.summary.verdict.tolist() == ["no response"]
    assert math.isnan(res.summary.p[0])


def test_each_variable_names_a_class_only_where_it_is_separated():
    """A bin variable's own reading never names a bare class on a near tie: a layer near convergence
    (no exponent: under two bins in [r_low, r_high]) whose best class beats the runner-up by 1.4e-4
    with a paired interval reaching 0 reads "not separable", as its layer's verdict does."""
    from probe.analysis.spectral_verdicts import kind_of_words, summarise, variable_verdict, verdict_kinds

    tie = {"predictor": "7", "variable": "lam_max", "own_variable_of_best": True, "p": math.nan, "p_low": math.nan,
           "p_high": math.nan, "min_r": 0.785, "max_r": 0.993, "explained": 0.984, "non_filter": 0.01,
           "best_non_filter": 0.01, "gain": 0.972, "error": 3.5e-4, "best_class": "precond_gd", "runner_up": "gd",
           "separated": False, "mixed": False, "blend": "", "best_family": "newton_fixed", "best_k": 3}  # fmt: skip
    rows = pd.DataFrame([tie, {**tie, "predictor": "8", "separated": True}, {**tie, "predictor": "9", "max_r": 0.01},
                         {**tie, "predictor": "10", "min_r": 0.97}])  # fmt: skip
    read = [variable_verdict(r, 0.05, 0.95) for r in rows.itertuples()]
    assert read == ["precond_gd not separable from gd", "precond_gd", "no response", "converged"]
    summary = summarise(rows, 0.05, 0.95)
    assert summary.verdict.tolist() == read  # one variable: the layer's verdict is its own
    # the verdict as data (summary.json schema 9), and the words a summary before it is read from
    assert summary.kind.tolist() == ["not separable", "class", "no response", "converged"]
    assert summary.best_class.tolist() == ["precond_gd", "precond_gd", "", ""]
    assert summary.other_class.tolist() == ["gd", "", "", ""]
    assert [kind_of_words(v) for v in read] == summary.kind.tolist()
    old = SimpleNamespace(verdict=read + ["mixed: gd 0.40 [0.20, 0.60] + ridge", "ambiguous: lam_t gd / lam_max pcr"])
    assert verdict_kinds(old)[-2:] == ["mixed", "ambiguous"] and verdict_kinds(summary) == summary.kind.tolist()
    xs, ys = prompts(32)
    res = spectral_analysis(torch.zeros(1, *xs.shape, dtype=torch.float64), xs, ys, n_boot=20)
    assert res.layers.verdict.tolist() == ["no response", "no response"]  # the table carries it, per variable


@pytest.mark.slow
def test_python_api_and_command(tmp_path, capsys):
    import probe
    from probe.cli import main

    oracle = LearnerOracle("gd", "steps", lambda l: l, 3, D, N, fixed={"eta": [1 / 9]})
    with pytest.raises(ConfigError, match=r"needs its task: probe.spectral\(model=m"):
        probe.spectral(model=oracle)
    small = {"prompts": {"train": 64, "val": 32, "test": 64, "induced": 64, "queries": 16}, "readout": {"method": "model"}}
    res = probe.spectral(model=oracle, task=TASK, **small)
    assert res.layers.layer.tolist() == [0, 1, 2, 3]  # one row per layer, named `layer`
    assert res.layers.verdict.tolist()[1:] == ["gd"] * 3
    assert sorted(res.by_variable.layer) == [0, 0, 1, 1, 2, 2, 3, 3]  # each layer in both bin variables
    assert res.analysis.summary.verdict.tolist() == res.layers.verdict.tolist()
    out = tmp_path / "spectral"
    argv = ["-q", "spectral", "checkpoints/planted/gd", "--out", str(out), "--test-prompts", "64", "--induced-prompts", "64"]
    assert main(argv) == 0
    assert {p.name for p in out.iterdir()} >= {"spectral_summary.csv", "spectral_layers.csv", "spectral_lam_t.png", "spectral_summary.json"}
    summary = pd.read_csv(out / "spectral_summary.csv")
    assert summary.verdict.tolist() == ["no response"] + ["gd"] * 6
    assert "gd" in capsys.readouterr().out
    assert main(["-q", "spectral", "checkpoints/planted/gd", "--out", str(tmp_path / "x"), "--r-low", "0.9", "--r-high", "0.5"]) == 2


def test_study_figure_and_caption_of_the_exponents(tmp_path):
    from probe.study.present import _caption, spectral_figure

    table = pd.DataFrame(
        {
            "model": ["a", "a", "b", "b"],
            "train_step": [1000, 1000, 2000, 2000],
            "analysis": "spectral",
            "metric": "spectral_p",
            "learner": ["gd", "no response", "precond_gd", "gd"],
            "layer": [1, 0, 1, 0],
            "n_examples": -1,
            "shift": "",
            "value": [1.05, np.nan, 1.95, 1.1],
            "ci_low": np.nan,
            "ci_high": np.nan,
        }
    )
    assert spectral_figure(table, "train_step", tmp_path / "spectral_p").is_file()
    assert "exponent p" in _caption("spectral_p", table, "train_step")
