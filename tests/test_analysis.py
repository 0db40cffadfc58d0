"""Layer analyses on models whose answer is known by construction."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from sklearn.linear_model import Ridge

from probe.analysis.matching import K_DRAWS, _exponential_fit, _fits, trend
from probe.analysis.pipeline import LayerSettings, analyse_layers
from probe.analysis.readout import ReadoutSettings, RidgeReadout, fit_layer_readouts
from probe.analysis.span import span_residuals
from probe.core.settings import PromptSettings, SimilaritySettings, SweepSettings
from probe.data.config import TaskConfig
from probe.models.oracle import LearnerOracle

TASK = TaskConfig(n_dims=4, n_points=14)
SMALL_PROMPTS = PromptSettings(train=64, val=32, test=96, induced=24, queries=12)


def small(sweeps, method="ridge"):
    return LayerSettings(SMALL_PROMPTS, ReadoutSettings(method=method), SimilaritySettings(bootstrap=100), sweeps)


@pytest.mark.slow
def test_newton_oracle_is_matched_at_3l_with_a_linear_verdict():
    oracle = LearnerOracle("newton", "iterations", lambda l: 3 * l, n_layers=5, n_dims=4, n_points=14)
    sweeps = (SweepSettings("newton", "newton", "iterations", {"iterations": tuple(range(19))}),
              SweepSettings("gd_log", "gd", "steps", {"steps": (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)}))
    # SimW is invariant to the rescaling a retrained read-out applies, so it recovers 3l exactly
    res = analyse_layers(oracle, TASK, small(sweeps))
    rows = res.best[(res.best.sweep == "newton") & (res.best.metric == "simw")].sort_values("layer")
    assert rows.k.tolist() == [0, 3, 6, 9, 12, 15]
    assert (rows.similarity[rows.layer >= 1] > 0.99).all()  # the read-out's intercept costs a little
    # SimE compares errors; with the model's own read-out the layer predictor is Newton itself
    res = analyse_layers(oracle, TASK, small(sweeps, "model"))
    for metric in ("sime", "simw"):
        rows = res.best[(res.best.sweep == "newton") & (res.best.metric == metric)].sort_values("layer")
        assert rows.k.tolist() == [0, 3, 6, 9, 12, 15], metric
        assert (rows.similarity[rows.layer >= 1] > 0.999).all()
    verdict = next(t for t in res.trends if t["learner"] == "newton" and t["metric"] == "sime")
    assert verdict["verdict"].startswith("newton: linear, about 3.0 [3.0, 3.0] iterations per layer")
    assert verdict["linear_r2"] == pytest.approx(1.0)
    # the readout recovers the planted predictions: layer error equals Newton's own error
    assert res.readout.error.notna().all()


def test_gd_oracle_is_matched_at_l_steps():
    oracle = LearnerOracle("gd", "steps", lambda l: l, n_layers=6, n_dims=4, n_points=14, noise=0.1)
    sweeps = (SweepSettings("gd_linear", "gd", "steps", {"steps": tuple(range(12))}),
              SweepSettings("newton", "newton", "iterations", {"iterations": tuple(range(10))}))
    res = analyse_layers(oracle, TASK, small(sweeps, "model"))
    rows = res.best[(res.best.sweep == "gd_linear") & (res.best.metric == "sime")].sort_values("layer")
    assert rows.k.tolist() == list(range(7))
    assert (rows.similarity[rows.layer >= 1] > 0.999).all()
    newton_sim = res.best[(res.best.sweep == "newton") & (res.best.metric == "sime") & (res.best.layer >= 1)]
    assert (newton_sim.similarity.to_numpy() < rows.similarity[rows.layer >= 1].to_numpy()).all()
    assert "linear, about 1.0 [1.0, 1.0] steps per layer" in next(t for t in res.trends if t["learner"] == "gd_linear"
                                                        and t["metric"] == "sime")["verdict"]


def test_trend_prefers_exponential_for_doubling():
    best = pd.DataFrame({"sweep": "gd", "metric": "sime", "layer": range(7), "k": [0, 2, 4, 8, 16, 32, 64],
                         "at_grid_end": False})
    out = trend(best, "gd")
    assert out["verdict"].startswith("gd: exponential, about x2.00 per layer")
    assert out["exponential_r2"] == pytest.approx(1.0) and out["linear_r2"] < 0.95


def test_trend_intervals_refit_every_prompt_resample():
    """Closed-form fits per resample agree with numpy's polyfit; identical draws give a point
    interval and shape share 1; draws split between a line and a doubling name both shapes."""
    g = np.random.default_rng(1)
    layers, ks = np.arange(1.0, 6.0), g.uniform(1, 40, (7, 5))
    slope, _, r2_lin, _ = _fits(layers, ks)
    for row, s_, r2 in zip(ks, slope, r2_lin):
        a, b = np.polyfit(layers, row, 1)
        assert s_ == pytest.approx(a)
        assert r2 == pytest.approx(1 - ((row - a * layers - b) ** 2).sum() / ((row - row.mean()) ** 2).sum())
    from scipy.optimize import curve_fit

    ours = np.stack(_exponential_fit(layers, ks), axis=-1)
    for row, c in zip(ks, ours):  # the exponential fit is least squares on k itself, as scipy's
        ref, _ = curve_fit(lambda l, a, b: np.exp(a + b * l), layers, row, p0=(np.log(row.mean()), 0.0), maxfev=20000)
        sse = [((row - np.exp(p[0] + p[1] * layers)) ** 2).sum() for p in (c, ref)]
        assert sse[0] <= sse[1] * (1 + 1e-6)
    doubling = [0, 2, 4, 8, 16, 32, 64]
    best = pd.DataFrame({"sweep": "gd", "metric": "sime", "layer": range(7), "k": doubling, "at_grid_end": False,
                         K_DRAWS: [np.full(50, k) for k in doubling]})
    out = trend(best, "gd")
    assert out["growth_low"] == pytest.approx(2.0) and out["growth_high"] == pytest.approx(2.0)
    assert out["shape_share"] == 1.0 and "this shape on 100% of prompt resamples" in out["verdict"]
    line = [0, 10, 20, 30, 40, 50, 60]
    best[K_DRAWS] = [np.array([d] * 25 + [l] * 25) for d, l in zip(doubling, line)]
    out = trend(best, "gd")
    assert out["shape_share"] == 0.5 and out["verdict"].startswith("gd: shape undecided")
    assert out["slope_low"] == pytest.approx(10.0) and out["slope_high"] == pytest.approx(11.4857, abs=1e-3)


def test_readout_recovers_linear_target_and_matches_sklearn():
    g = np.random.default_rng(0)
    feats = g.standard_normal((3, 50, 6, 5))
    ys = 2.0 * feats[2, ..., 1] - feats[2, ..., 3] + 0.5  # linear in layer 2's features
    fit = fit_layer_readouts(feats, ys, feats[:, :10], ys[:10], alphas=(1e-8, 1.0))
    np.testing.assert_allclose(fit.coef[2], [0, 2, 0, -1, 0], atol=1e-6)
    assert fit.intercept[2] == pytest.approx(0.5)
    est = RidgeReadout(alpha=0.3).fit(feats[0].reshape(-1, 5), ys.reshape(-1))
    ref = Ridge(alpha=0.3 * 300).fit(feats[0].reshape(-1, 5), ys.reshape(-1))
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-6)
    assert est.intercept_ == pytest.approx(ref.intercept_)
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match="not fitted"):
        RidgeReadout().predict(feats[0, 0])


@pytest.mark.slow
def test_width_256_readouts_are_right_after_torch_set_num_threads():
    """Garg et al.'s width 256 makes the read-outs' systems 257 x 257. In torch 2.13's CPU build,
    once torch.set_num_threads(2) has been called, MKL's batched LU of such systems fails: the
    read-outs, solved by Cholesky, must still equal numpy's solution of the same normal equations
    and scikit-learn's Ridge. In a fresh process (the test workers here run one thread each)."""
    import subprocess
    import sys

    code = """
import numpy as np, torch
from sklearn.linear_model import Ridge
from probe.analysis.readout import RidgeReadout, fit_layer_readouts
torch.set_num_threads(2)
g = np.random.default_rng(0)
feats, ys = g.standard_normal((2, 100, 6, 256)), g.standard_normal((100, 6))
fit = fit_layer_readouts(feats, ys, feats[:, :20], ys[:20], alphas=(1e-4, 1e-2))
for layer in range(2):
    a = np.concatenate([feats[layer].reshape(-1, 256), np.ones((600, 1))], axis=1)
    pen = np.diag([fit.alpha[layer] * 600] * 256 + [0.0])
    ref = np.linalg.solve(a.T @ a + pen, a.T @ ys.reshape(-1))
    np.testing.assert_allclose(fit.coef[layer], ref[:-1], rtol=1e-7, atol=1e-10)
    assert abs(fit.intercept[layer] - ref[-1]) < 1e-9
x, y = feats[0].reshape(-1, 256), ys.reshape(-1)
ours, theirs = RidgeReadout(0.01).fit(x, y), Ridge(alpha=0.01 * 600).fit(x, y)
np.testing.assert_allclose(ours.coef_, theirs.coef_, rtol=1e-7, atol=1e-10)
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.stdout + run.stderr)[-2000:]


def test_span_residual_zero_in_span_and_null_for_random():
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(400, 6, 8, generator=g, dtype=torch.float64)
    coeffs = torch.randn(400, 6, 6, generator=g, dtype=torch.float64)
    mask = torch.tril(torch.ones(6, 6, dtype=torch.float64), -1)  # weight t mixes x_1..x_t
    in_span = torch.einsum("bti,bid->btd", coeffs * mask, xs)
    r = span_residuals(in_span[None], xs)[0]
    assert r[:, 1:].max() < 1e-10
    rand = torch.randn(1, 400, 6, 8, generator=g, dtype=torch.float64)
    null = span_residuals(rand, xs)[0].pow(2).mean(0).sqrt()  # RMS, as span_table reports
    for t in range(1, 6):
        assert null[t].item() == pytest.approx(np.sqrt((8 - t) / 8), abs=0.03)


@pytest.mark.slow
def test_probe_known_answers_exact_position_and_independent_target():
    """A target that is an exact linear function of one position: the linear probe puts >= 0.99 of
    its attention there and predicts held-out prompts to R^2 >= 0.99999, the MLP probe to >= 0.995,
    both converged; a target independent of H scores R^2 within 0.03 of 0."""
    from probe.analysis.probes import AttentionPoolProbe

    g = torch.Generator().manual_seed(0)
    h = torch.randn(1000, 10, 16, generator=g, dtype=torch.float64)
    target = h[:, 5] @ torch.randn(16, 3, generator=g, dtype=torch.float64)
    fit, held = slice(0, 500), slice(500, 1000)
    linear = AttentionPoolProbe("linear").fit(h[fit], target[fit])
    assert linear.converged_ and linear.attention_[5] >= 0.99
    assert linear.score(h[held], target[held]) >= 0.99999
    mlp = AttentionPoolProbe("mlp").fit(h[fit], target[fit])
    assert mlp.converged_ and mlp.score(h[held], target[held]) >= 0.995
    unrelated = torch.randn(1000, 3, generator=g, dtype=torch.float64)
    for kind in ("linear", "mlp"):
        control = AttentionPoolProbe(kind).fit(h[fit], unrelated[fit])
        assert abs(control.score(h[held], unrelated[held])) < 0.03, kind


def test_probe_head_is_ridge_and_its_penalty_is_ridgecv_choice():
    """Uniform pooling: the probe is scikit-learn's Ridge(alpha_) on the mean-pooled features (1e-8),
    and alpha_ is the penalty RidgeCV picks by leave-one-out from the same grid."""
    from sklearn.linear_model import RidgeCV

    from probe.analysis.probes import ALPHAS, AttentionPoolProbe, ridge_penalties

    rng = np.random.default_rng(4)
    h = rng.normal(size=(300, 6, 8))
    y = h[:, 2] @ rng.normal(size=8) + h[:, 4, 0] + 0.5 * rng.normal(size=300)
    probe = AttentionPoolProbe("linear", pooling="uniform").fit(h, y)
    np.testing.assert_allclose(probe.attention_, np.full(6, 1 / 6))
    pooled = h.mean(1)
    ridge = Ridge(alpha=probe.alpha_).fit(pooled, y)
    np.testing.assert_allclose(probe.predict(h[:50]), ridge.predict(pooled[:50]), atol=1e-8)
    np.testing.assert_allclose(probe.coef_[:, 0] * probe.std_.item(), ridge.coef_, atol=1e-8)
    centred = torch.from_numpy(pooled - pooled.mean(0))[None]
    grid = ridge_penalties(centred, ALPHAS)[0].numpy()
    assert probe.alpha_ == pytest.approx(RidgeCV(alphas=grid).fit(pooled, y).alpha_, rel=1e-12)
    assert probe.pooling_n_iter_ == 0 and probe.n_iter_ == 1 and probe.converged_


def test_two_block_leave_one_out_equals_refitting_without_each_prompt():
    """loo_two_blocks (block Cholesky, one factor per hidden penalty) against a brute-force refit of
    ridge with an unpenalised intercept and per-block penalties on every training set but one."""
    from probe.analysis.ridge import loo_two_blocks

    rng = np.random.default_rng(7)
    z, h = rng.normal(size=(40, 3)), rng.normal(size=(40, 5))
    y = z @ rng.normal(size=(3, 2)) + np.tanh(h[:, :2]) + 0.3 * rng.normal(size=(40, 2))
    penalty, hidden = 2.0, np.array([0.5, 7.0, 300.0])
    got = loo_two_blocks(*(torch.from_numpy(a - a.mean(0))[None] for a in (z, h, y)), torch.tensor([penalty]),
                         torch.from_numpy(hidden)[None])[0].numpy()
    features = np.hstack([z, h])
    for lam_h, value in zip(hidden, got):
        errors = []
        for i in range(40):
            keep = np.arange(40) != i
            f, t = features[keep], y[keep]
            fc, tc = f - f.mean(0), t - t.mean(0)
            w = np.linalg.solve(fc.T @ fc + np.diag([penalty] * 3 + [lam_h] * 5), fc.T @ tc)
            errors.append(y[i] - t.mean(0) - (features[i] - f.mean(0)) @ w)
        assert value == pytest.approx(np.mean(np.square(errors)), rel=1e-10)


def test_probe_fit_is_deterministic_and_converges_on_its_gradient():
    """Two fits give identical numbers; the learned pooling ends where the objective's gradient
    is below gtol (checked by finite differences of the variable-projection objective)."""
    from probe.analysis.probes import AttentionPoolProbe, ProbeSet

    states, targets = _calibration_states(300)
    h, y = states[1, :, :8].double(), targets["xty"][:, 4]
    first, second = (AttentionPoolProbe("linear").fit(h, y) for _ in range(2))
    assert np.array_equal(first.predict(h), second.predict(h)) and first.n_iter_ == second.n_iter_
    assert first.converged_ and first.grad_norm_ <= 1e-5
    y_std = (y - y.mean(0)) / y.std(0)
    probes = ProbeSet(h.transpose(0, 1)[None], torch.zeros(1, dtype=torch.long), torch.tensor([8]), (y_std - y_std.mean(0))[None])
    fun = probes.objective(torch.tensor([first.alpha_]))
    s = torch.from_numpy(first.attention_).log()[None]  # scores up to a constant
    _, grad = fun(s, torch.zeros(1, dtype=torch.long))
    for p in range(8):
        e = torch.zeros_like(s)
        e[0, p] = 1e-5
        numeric = (fun(s + e, torch.zeros(1, dtype=torch.long))[0] - fun(s - e, torch.zeros(1, dtype=torch.long))[0]) / 2e-5
        assert numeric.item() == pytest.approx(grad[0, p].item(), abs=1e-8)


def test_probe_hessian_equals_finite_differences_of_its_gradient():
    """ProbeSet.hessian (the variable-projection Hessian through the softmax) against central
    differences of the gradient, on probes of two layers and two widths, in one chunk and in many."""
    from probe.analysis.probes import ProbeSet

    g = torch.Generator().manual_seed(3)
    states = torch.randn(2, 6, 80, 5, generator=g, dtype=torch.float64)
    yc = torch.randn(3, 80, 2, generator=g, dtype=torch.float64)
    yc -= yc.mean(1, keepdim=True)
    probes = ProbeSet(states, torch.tensor([0, 1, 1]), torch.tensor([6, 4, 6]), yc)
    penalty = torch.tensor([0.5, 2.0, 0.1], dtype=torch.float64)
    every = torch.arange(3)
    scores = torch.randn(3, 6, generator=g, dtype=torch.float64)
    f, grad, hess = probes.hessian(penalty)(scores, every)
    f_one, grad_one = probes.objective(penalty)(scores, every)
    assert torch.allclose(f, f_one, atol=1e-14) and torch.allclose(grad, grad_one, atol=1e-14)
    fun, eps = probes.objective(penalty), 1e-5
    for p in range(6):
        e = torch.zeros_like(scores)
        e[:, p] = eps
        numeric = (fun(scores + e, every)[1] - fun(scores - e, every)[1]) / (2 * eps)
        assert torch.allclose(hess[:, :, p], numeric, atol=1e-8), p
    assert torch.allclose(hess, hess.transpose(1, 2), atol=1e-14)
    assert (hess[1, 4:] == 0).all() and (hess[1, :, 4:] == 0).all()  # positions the probe does not read
    assert torch.allclose(probes.hessian(penalty, max_bytes=1)(scores, every)[2], hess, atol=1e-14)


def test_probe_objective_in_blocks_of_layers_equals_one_block():
    """The objective in blocks of whole layers' probes (`max_bytes`) gives the numbers of one
    block bit for bit: each layer's pooling is one matmul either way, the rest is per probe."""
    from probe.analysis.pooling import layer_blocks
    from probe.analysis.probes import ProbeSet

    g = torch.Generator().manual_seed(5)
    states = torch.randn(4, 7, 60, 6, generator=g, dtype=torch.float64)
    layer = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    yc = torch.randn(7, 60, 2, generator=g, dtype=torch.float64)
    probes = ProbeSet(states, layer, torch.tensor([7, 3, 5, 7, 2, 6, 4]), yc - yc.mean(1, keepdim=True))
    penalty = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    scores = torch.randn(7, 7, generator=g, dtype=torch.float64)
    for index in (torch.arange(7), torch.tensor([1, 2, 4, 5, 6])):  # every probe, and a working set
        whole = probes.objective(penalty)(scores[index], index)
        blocked = probes.objective(penalty, max_bytes=1)(scores[index], index)
        assert all(torch.equal(a, b) for a, b in zip(whole, blocked))
    blocks = layer_blocks(probes.groups(torch.arange(7)), per_block=3)
    assert [rows for rows, _ in blocks] == [slice(0, 3), slice(3, 6), slice(6, 7)]  # whole layers, >= 1 each
    assert [[layer for _, layer, _ in groups] for _, groups in blocks] == [[0, 1], [2], [3]]


def test_probe_set_pools_centred_states_and_keeps_the_raw_ones_apart():
    """A ProbeSet holds its states centred over prompts: its objective equals the variable-projection
    objective computed from the raw states in numpy (pool, centre, ridge head), its heads see the raw
    pooled states (`pooled_blocks`), the caller's tensor is left as it was, and `centred_in_place`
    centres the caller's tensor instead, with the same numbers."""
    from probe.analysis.probes import ProbeSet

    g = torch.Generator().manual_seed(11)
    raw = torch.randn(2, 5, 40, 3, generator=g, dtype=torch.float64) + 3.0  # far from centred
    kept = raw.clone()
    yc = torch.randn(3, 40, 2, generator=g, dtype=torch.float64)
    yc -= yc.mean(1, keepdim=True)
    layer, n_pos = torch.tensor([0, 1, 1]), torch.tensor([5, 3, 5])
    penalty = torch.tensor([0.3, 1.0, 2.0], dtype=torch.float64)
    scores = torch.randn(3, 5, generator=g, dtype=torch.float64)
    probes = ProbeSet(raw, layer, n_pos, yc)
    assert torch.equal(raw, kept)
    f, _ = probes.objective(penalty)(scores, torch.arange(3))
    h, y = kept.numpy(), yc.numpy()
    for k in range(3):
        s = np.where(np.arange(5) < int(n_pos[k]), scores[k].numpy(), -np.inf)
        alpha = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        z = np.einsum("p,pnd->nd", alpha, h[int(layer[k])])
        zc = z - z.mean(0)
        w = np.linalg.solve(zc.T @ zc + float(penalty[k]) * np.eye(3), zc.T @ y[k])
        expected = (((y[k] - zc @ w) ** 2).sum() + float(penalty[k]) * (w**2).sum()) / y[k].size
        assert float(f[k]) == pytest.approx(expected, rel=1e-12)
        pooled = torch.cat([z for _, z in probes.pooled_blocks(lambda rows: probes.attention(scores[rows], torch.arange(3)[rows]))])
        assert np.allclose(pooled[k].numpy(), z, rtol=1e-12, atol=1e-12)
    in_place = ProbeSet.centred_in_place(raw, layer, n_pos, yc)
    assert torch.allclose(raw.mean(2), torch.zeros(2, 5, 3, dtype=torch.float64), atol=1e-14)
    assert torch.allclose(in_place.objective(penalty)(scores, torch.arange(3))[0], f, rtol=1e-13, atol=0)


def test_probe_grids_on_shared_states_equal_each_grid_alone():
    """The model's targets and shuffled ones fitted as one grid (`fit_probe_grids`) give each set's
    table as `fit_probe_grid` fits it alone (every column to 1e-9: the batched products' round-off)."""
    from probe.analysis.probes import fit_probe_grid, fit_probe_grids
    from probe.analysis.probes import without_r2_draws as without_draws

    states, targets = _calibration_states(300)
    train, test = states[:, :200], states[:, 200:]
    own = {k: v[:200] for k, v in targets.items()}
    shuffled = {k: v[torch.randperm(200, generator=torch.Generator().manual_seed(0))] for k, v in own.items()}
    test_targets = {k: v[200:] for k, v in targets.items()}
    combos, options = [(2, "xty"), (5, "xty"), (5, "w_ols")], {"hidden": 16, "mlp_head": "random"}
    by_position = train.double().transpose(1, 2).contiguous()  # (L, 2n, N, D): used in place, no copy
    kept = by_position.clone()
    sets = {"own": own, "shuffled": shuffled}
    together = fit_probe_grids(by_position, sets, combos, ("linear", "mlp"), layout="lpnd", **options)
    assert list(together) == ["own", "shuffled"] and torch.equal(by_position, kept)  # the caller's states as they were
    for name, by_target in (("own", own), ("shuffled", shuffled)):
        alone = fit_probe_grid(train, by_target, combos, ("linear", "mlp"), **options).score(test, test_targets, 50)
        table = together[name].score(test.double().transpose(1, 2).contiguous(), test_targets, 50)
        assert len(table) == 2 * 4 * len(combos)
        pd.testing.assert_frame_equal(
            without_draws(table), without_draws(alone), check_exact=False, rtol=1e-9, atol=1e-9
        )


@pytest.mark.slow
def test_probe_grid_in_blocks_of_layers_equals_one_block(monkeypatch):
    """The whole pooling fit (penalty grids, leave-one-out choices, every round) with one layer's
    probes per block gives the grid of one block, bit for bit."""
    from probe.analysis import pooling
    from probe.analysis.probes import fit_probes

    states, targets = _calibration_states(120)
    args = (states[:, :80], {"xty": targets["xty"][:80]}, states[:, 80:], {"xty": targets["xty"][80:]})
    combos = [(2, "xty"), (5, "xty")]
    whole = fit_probes(*args, combos, ("linear", "mlp"), hidden=16)
    monkeypatch.setattr(pooling, "OBJECTIVE_BLOCK_BYTES", 1)
    blocked = fit_probes(*args, combos, ("linear", "mlp"), hidden=16)
    pd.testing.assert_frame_equal(whole, blocked, check_exact=True)


def test_newton_minimize_reaches_scipy_minimum():
    """Batched modified Newton on Rosenbrock's function (negative curvature on the way) and on
    a convex quadratic: the minima scipy's trust-region Newton finds, each converged."""
    from scipy.optimize import minimize as scipy_minimize
    from scipy.optimize import rosen, rosen_der, rosen_hess

    from probe.analysis.lbfgs import newton_minimize

    a = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)

    def values(x: torch.Tensor, index: torch.Tensor):
        rosen_part = 100 * (x[:, 1] - x[:, 0] ** 2) ** 2 + (1 - x[:, 0]) ** 2
        quad_part = 0.5 * (x @ a * x).sum(-1) - x[:, 0]
        is_rosen = index == 0
        f = torch.where(is_rosen, rosen_part, quad_part)
        g_rosen = torch.stack([-400 * x[:, 0] * (x[:, 1] - x[:, 0] ** 2) - 2 * (1 - x[:, 0]), 200 * (x[:, 1] - x[:, 0] ** 2)], -1)
        g_quad = x @ a - torch.tensor([1.0, 0.0], dtype=torch.float64)
        return f, torch.where(is_rosen.unsqueeze(-1), g_rosen, g_quad)

    def hessians(x: torch.Tensor, index: torch.Tensor):
        f, g = values(x, index)
        h_rosen = torch.stack([torch.from_numpy(rosen_hess(v.numpy())) for v in x])
        return f, g, torch.where((index == 0).view(-1, 1, 1), h_rosen, a.expand(len(x), 2, 2))

    x0 = torch.tensor([[-1.2, 1.0], [2.0, -3.0]], dtype=torch.float64)
    res = newton_minimize(values, hessians, x0, gtol=1e-9, ftol=0.0, max_iter=200)
    assert res.converged.all()
    reference = scipy_minimize(rosen, x0[0].numpy(), jac=rosen_der, hess=rosen_hess, method="trust-exact", tol=1e-12)
    assert np.allclose(res.x[0].numpy(), reference.x, atol=1e-7)
    assert np.allclose(res.x[1].numpy(), np.linalg.solve(a.numpy(), [1.0, 0.0]), atol=1e-10)


@pytest.mark.slow
def test_probes_switch_to_newton_only_where_the_hessian_is_cheap(monkeypatch):
    """hessian_flops counts 2 (3 P N D d + P^2 N d), gradient_flops 2 N D (2P + D); probes where
    Newton does not pay are fitted by L-BFGS alone (Newton never called) and still converge; a mixed
    grid keeps each probe's own route."""
    import probe.analysis.probes as probes_module
    from probe.analysis import pooling

    assert pooling.hessian_flops(torch.tensor([30]), 512, 64, 4).item() == 2 * (3 * 30 * 512 * 64 * 4 + 900 * 512 * 4)
    assert pooling.gradient_flops(torch.tensor([30]), 512, 64).item() == 2 * 512 * 64 * (60 + 64)
    shapes = (torch.tensor([30]), 2048, 64, 4), (torch.tensor([80]), 512, 256, 20)  # the full recipe; Garg's shape
    assert pooling.newton_pays(*shapes[0]).item() and not pooling.newton_pays(*shapes[1]).item()
    states, targets = _calibration_states(300)
    h, y = states[:, :, :8], {"xty": targets["xty"]}
    grid = lambda: probes_module.fit_probes(h, y, h, y, [(2, "xty"), (4, "xty")], "linear")
    both = grid()
    called = []
    original = pooling.newton_minimize
    monkeypatch.setattr(pooling, "newton_minimize", lambda *a, **k: called.append(1) or original(*a, **k))
    monkeypatch.setattr(pooling, "NEWTON_FLOPS", 0.0)
    monkeypatch.setattr(pooling, "NEWTON_RATIO", 0.0)
    alone = grid()
    assert not called and alone.converged.all() and both.converged.all()
    assert np.allclose(alone.r2, both.r2, atol=0.02)
    cut = float(pooling.hessian_flops(torch.tensor([4]), 300, h.shape[-1], 3))  # P = 4 probes only
    monkeypatch.setattr(pooling, "NEWTON_FLOPS", cut)
    mixed = grid()
    assert mixed.converged.all() and np.allclose(mixed.r2, both.r2, atol=0.02)


def test_batched_probes_and_r2_match_sklearn():
    from sklearn.metrics import r2_score

    from probe.analysis.probes import fit_probes, probe_targets
    from probe.analysis.stats import r2_score as r2_ours

    g = torch.Generator().manual_seed(1)
    truth, pred = torch.randn(2, 50, 3, generator=g).double(), torch.randn(2, 50, 3, generator=g).double()
    for i in range(2):
        assert r2_ours(truth[i], pred[i]).mean(-1).item() == pytest.approx(r2_score(truth[i].numpy(), pred[i].numpy()))
    # a grid whose layer 1 holds X^T y of the prefix at the last y token: only that layer decodes it
    xs, ys = torch.randn(500, 6, 3, generator=g), torch.randn(500, 6, generator=g)
    xty = probe_targets(xs, ys, "xty")  # (N, n, d)
    states = torch.randn(2, 500, 12, 5, generator=g)
    states[1, :, 5, :3] = xty[:, 3]  # token 5 is y_3: it has seen 3 examples
    table = fit_probes(states[:, :400], {"xty": xty[:400]}, states[:, 400:], {"xty": xty[400:]}, [(3, "xty")], "linear")
    r2 = table.set_index("layer").r2
    assert r2[1] > 0.95 and r2[0] < 0.3
    assert table.set_index("layer").peak_position[1] == 5


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default", "garg", "relu-attention"])
def test_cached_query_states_equal_one_sequence_per_query(which, tmp_path):
    """The key/value-cache path (each prompt once) against one TransformerLens-captured
    sequence per prefix and query, on the trained default checkpoint and a Garg-layout run."""
    from conftest import GargTransformerModel, write_garg_run

    from probe.analysis.states import cached_query_states, sequence_query_states
    from probe.io.formats import load_checkpoint

    torch.manual_seed(5)
    if which == "default":
        model, d, n = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model, 4, 16
    elif which == "relu-attention":
        from conftest import relu_attention_model

        model, d, n = relu_attention_model()[0], 3, 8
    else:
        write_garg_run(tmp_path / "g", GargTransformerModel(3, 8, 16, 2, 2).eval(), 3, 8, 16, 2, 2)
        model, d, n = load_checkpoint(tmp_path / "g").model, 3, 8
    xs, ys, queries = torch.randn(2, n, d), torch.randn(2, n), torch.randn(2, 3, d)
    slow = sequence_query_states(model, xs, ys, queries)
    fast = cached_query_states(model, xs, ys, queries, max_bytes=1 << 16)  # forces one prompt per chunk
    assert fast.shape == slow.shape
    np.testing.assert_allclose(fast, slow, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(cached_query_states(model, xs, ys, queries, start=2), slow[:, :, 2:], atol=1e-5, rtol=1e-5)
    # with a read-out, both paths return its predictions layer by layer instead of the states
    coef = np.random.default_rng(0).normal(size=(slow.shape[0], slow.shape[-1]))
    readout = lambda layer, states: states.astype(np.float64) @ coef[layer] + layer
    expected = np.einsum("lbsqd,ld->lbsq", slow.astype(np.float64), coef) + np.arange(slow.shape[0]).reshape(-1, 1, 1, 1)
    for path in (sequence_query_states, cached_query_states):
        np.testing.assert_allclose(path(model, xs, ys, queries, readout=readout), expected, atol=1e-4)


@pytest.mark.parametrize("name", ["gpt2-default", "lstm-default"])
def test_query_predictions_are_the_models_forward_on_each_prefix_and_query(name):
    """query_predictions (the study's SPD / ILW, the forgetting analysis) against the model's own
    forward on x_1, y_1, ..., x_t, y_t, x~_q, one sequence per prefix and query: the key/value
    cache path (GPT-2) and the sequence path (LSTM)."""
    from probe.analysis.states import query_predictions
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(REPO / "checkpoints" / name).model
    g = torch.Generator().manual_seed(6)
    xs, ys, queries = torch.randn(3, 16, 4, generator=g), torch.randn(3, 16, generator=g), torch.randn(3, 2, 4, generator=g)
    got = query_predictions(model, xs, ys, queries, start=1)
    assert got.shape == (3, 15, 2) and got.dtype == torch.float64
    with torch.no_grad():
        for t in (1, 7, 15):
            for q in range(2):
                seq_x = torch.cat([xs[:, :t], queries[:, q : q + 1]], 1)
                seq_y = torch.cat([ys[:, :t], torch.zeros(3, 1)], 1)
                np.testing.assert_allclose(got[:, t - 1, q], model(seq_x, seq_y)[:, t].double(), atol=1e-5, rtol=1e-5)


def test_the_error_metric_is_squared_error_over_d():
    """Hand-worked: errors (1, 2) on d = 4 are 0.25, 1; predicting 0 for y = w . x, w, x ~ N(0, I)
    scores 1 in expectation."""
    from probe.data.metrics import error_per_dim

    assert error_per_dim(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0]), 4).tolist() == [0.25, 1.0]
    g = torch.Generator().manual_seed(7)
    w, x = torch.randn(20000, 8, generator=g), torch.randn(20000, 8, generator=g)
    assert float(error_per_dim(torch.zeros(20000), (w * x).sum(1), 8).mean()) == pytest.approx(1.0, abs=0.05)


def test_readout_and_probe_are_scikit_learn_estimators():
    import warnings

    from sklearn.exceptions import NotFittedError
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.utils.estimator_checks import check_estimator

    from probe.analysis.probes import AttentionPoolProbe
    from probe.analysis.readout import RidgeReadout

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the array-API check is skipped without SCIPY_ARRAY_API
        check_estimator(RidgeReadout())
        # in full, no check skipped (2-D data: one position, the pooling needs no iteration, the head one)
        check_estimator(AttentionPoolProbe(max_iter=20))
        probe = AttentionPoolProbe().fit(np.random.default_rng(1).standard_normal((20, 4)), np.arange(20.0))
        assert probe.pooling_n_iter_ == 0 and probe.n_iter_ == 1
    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 5))
    y = X @ rng.standard_normal(5) + 0.1 * rng.standard_normal(120)
    ours, theirs = RidgeReadout(0.01).fit(X, y), Ridge(alpha=0.01 * 120).fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_, atol=1e-10)
    assert ours.score(X, y) == pytest.approx(theirs.score(X, y))
    pipe = make_pipeline(StandardScaler(), RidgeReadout()).fit(X, y)
    assert pipe.score(X, y) > 0.95
    search = GridSearchCV(RidgeReadout(), {"alpha": [1e-6, 1e-2, 10.0]}, cv=3).fit(X, y)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all() and search.best_params_["alpha"] != 10.0
    with pytest.raises(NotFittedError):
        RidgeReadout().predict(X)
    # the probe on 3-D input (samples x positions x width): parameters, cloning, scoring and search
    H = rng.standard_normal((96, 4, 6)).astype(np.float32)
    Y = H[:, 2, :2] * 2.0
    probe = AttentionPoolProbe(max_iter=5).set_params(max_iter=150, hidden=32)
    assert probe.get_params()["max_iter"] == 150
    with pytest.raises(NotFittedError):
        probe.predict(H)
    assert probe.fit(H, Y).score(H, Y) > 0.9 and probe.n_features_in_ == 6
    search = GridSearchCV(AttentionPoolProbe(), {"pooling": ["uniform", "learned"]}, cv=2).fit(H, Y[:, 0])
    assert np.isfinite(search.cv_results_["mean_test_score"]).all() and search.best_params_["pooling"] == "learned"
    with pytest.raises(ValueError, match=r"H has \(1, 6\) \(positions, width\) but the probe was fitted on \(4, 6\)"):
        probe.predict(H[:, 0])


@pytest.mark.slow
def test_the_documented_estimators_reproduce_the_batched_fits():
    """AttentionPoolProbe with fit_probes' settings equals fit_probes' probe for one (layer,
    prefix, target), and RidgeReadout(alpha chosen) equals fit_layer_readouts' layer read-out."""
    from probe.analysis.probes import AttentionPoolProbe, fit_probes

    states, all_targets = _calibration_states(300)
    train, test = slice(0, 200), slice(200, 300)
    targets, test_targets = {"xty": all_targets["xty"][train]}, {"xty": all_targets["xty"][test]}
    combos = [(2, "xty"), (5, "xty")]
    table = fit_probes(states[:, train], targets, states[:, test], test_targets, combos, ("linear", "mlp"), hidden=32)
    for kind in ("linear", "mlp"):
        for layer in (1, 3):
            for t, _ in combos:
                row = table[(table.layer == layer) & (table.prefix == t) & (table.kind == kind)].iloc[0]
                probe = AttentionPoolProbe(kind, hidden=32)
                probe.fit(states[layer, train, : 2 * t].numpy(), targets["xty"][:, t].numpy())
                assert (probe.pooling_n_iter_, probe.converged_) == (row.iterations, row.converged)
                got = probe.score(states[layer, test, : 2 * t].numpy(), test_targets["xty"][:, t].numpy())
                assert got == pytest.approx(row.r2, abs=1e-6)
    feats = np.random.default_rng(1).standard_normal((3, 40, 6, 5))
    ys_r = feats[1, ..., 0] - 2 * feats[2, ..., 1] + 0.1 * np.random.default_rng(2).standard_normal((40, 6))
    fitted = fit_layer_readouts(feats[:, :30], ys_r[:30], feats[:, 30:], ys_r[30:], alphas=(1e-4, 1.0, 100.0))
    for layer in range(3):
        est = RidgeReadout(fitted.alpha[layer]).fit(feats[layer, :30].reshape(-1, 5), ys_r[:30].reshape(-1))
        np.testing.assert_allclose(est.coef_, fitted.coef[layer], atol=1e-12)
        assert est.intercept_ == pytest.approx(fitted.intercept[layer], abs=1e-12)


def _calibration_states(n: int, seed: int = 3):
    """Hidden states by construction: layer 1 holds X^T y of the examples seen so far at every token,
    layer 2 holds w_OLS of those examples, layers 0 and 3 are noise. A probe must decode exactly those."""
    from probe.analysis.probes import probe_targets

    g = torch.Generator().manual_seed(seed)
    xs, ys = torch.randn(n, 8, 3, generator=g), torch.randn(n, 8, generator=g)
    targets = {name: probe_targets(xs, ys, name) for name in ("xty", "w_ols")}  # (N, n, d): after t examples
    states = torch.randn(4, n, 16, 6, generator=g)
    for token in range(16):
        seen = (token + 1) // 2  # examples complete at this token (the y token closes one)
        states[1, :, token, :3] = targets["xty"][:, seen] if seen < 8 else 0
        states[2, :, token, :3] = targets["w_ols"][:, seen] if seen < 8 else 0
    return states, targets


def test_probe_calibration_on_states_with_known_content():
    """Seed 002 §5 calibration: R^2 > 0.95 where the target is linearly present, ~0 elsewhere;
    every pooling fit reaches its gradient tolerance."""
    from probe.analysis.probes import fit_probes

    states, targets = _calibration_states(1200)
    train, test = (states[:, :1000], {k: v[:1000] for k, v in targets.items()}), (states[:, 1000:], {k: v[1000:] for k, v in targets.items()})
    table = fit_probes(*train, *test, [(6, "xty"), (7, "xty"), (6, "w_ols"), (7, "w_ols")], "linear")
    r2 = table.groupby(["target", "layer"]).r2.min().unstack()
    assert r2.loc["xty", 1] > 0.95 and r2.loc["w_ols", 2] > 0.95
    assert r2.loc["xty", 2] < 0.95 and r2.loc["w_ols", 1] < 0.95  # a different (non-linear) function of the data
    assert table[table.layer.isin([0, 3])].r2.abs().max() < 0.1
    assert table.converged.all() and (table.grad_norm <= 1e-5).all()


@pytest.mark.slow
def test_probes_that_hit_the_iteration_limit_say_so(report):
    import dataclasses

    from probe.analysis.probes import fit_probes
    from probe.reporting.findings import caveats
    from probe.reporting.schema import Summary
    from probe.stages.probes import Probes, probe_summary

    states, targets = _calibration_states(300)
    table = fit_probes(states[:, :200], {"xty": targets["xty"][:200]}, states[:, 200:], {"xty": targets["xty"][200:]},
                       [(4, "xty")], "mlp", max_iter=1, hidden=16)
    assert not table.converged.any() and (table.iterations <= 3).all() and set(table.hidden) == {16}
    written = Summary.from_json(json.loads((report / "summary.json").read_text()))
    summary = dataclasses.replace(written, stages={"probes": Probes(probe_summary(table.assign(control="none")))})
    assert summary.stages["probes"].fits["xty"]["mlp"].converged_share == 0.0
    assert any("Only 0% of the mlp probes" in c and "raise probes.max_iter" in c for c in caveats(summary))


def test_probe_streams_go_to_disk_when_the_memory_budget_is_spent(tmp_path, monkeypatch):
    """`--max-memory` counts what the process already holds: with none left, the probes' streams
    are a memmap on disk, equal to the in-memory ones."""
    import importlib

    from probe.capture.streams import by_position_streams
    from probe.core.memory import MemoryBudget, resident_memory
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(512, 16, 4, generator=g), torch.randn(512, 16, generator=g)
    in_memory = by_position_streams(model, xs, ys, chunk=128)
    assert in_memory.shape == (9, 32, 512, 64)
    monkeypatch.setattr(importlib.import_module("probe.capture.streams"), "spill_dir", lambda: str(tmp_path))
    spent = MemoryBudget(resident_memory())  # as `--max-memory` equal to what the process holds
    assert spent.headroom() < 128 << 20  # the floor, or what was allocated since
    on_disk = by_position_streams(model, xs, ys, chunk=128, memory=spent)
    assert (tmp_path / "resid.npy").is_file()
    np.testing.assert_array_equal(on_disk.numpy(), in_memory.numpy())
    # the layout is the capture's, by position
    from probe.capture import RESID, capture

    direct = np.asarray(capture(model, xs[:3], ys[:3], hooks=[RESID]).acts[RESID])
    np.testing.assert_allclose(in_memory[:, :, :3].numpy(), direct.transpose(0, 2, 1, 3), atol=1e-6)


def test_a_tie_between_two_sweeps_keeps_the_recipes_first_candidate():
    """gd_linear and gd_log holding the same GD setting score equal up to round-off: the verdicts'
    candidate is the recipe's first sweep, not whichever round-off favours; a real gain wins."""
    from types import SimpleNamespace

    from probe.analysis.pipeline import TIE, _keep_best

    kept = {}
    values = torch.tensor([[0.5, 0.25], [0.9, 0.7]], dtype=torch.float64)  # (K, P): k = 1 is best
    result = SimpleNamespace(grid=[{"steps": 1}, {"steps": 6}])
    first = SimpleNamespace(label="gd_linear", axis="steps")
    _keep_best(kept, first, result, values, torch.zeros(2, 3))
    _keep_best(kept, SimpleNamespace(label="gd_log", axis="steps"), result, values + TIE / 2, torch.zeros(2, 3))
    assert kept["gd"].sweep == "gd_linear" and kept["gd"].k == 6
    _keep_best(kept, SimpleNamespace(label="gd_log", axis="steps"), result, values + 1e-6, torch.zeros(2, 3))
    assert kept["gd"].sweep == "gd_log"


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_heads_fitted_in_blocks_equal_the_batched_fit(kind, monkeypatch):
    """fit_head fits at most HEAD_BLOCK_BYTES of probes at a time (the paper-scale memory bound);
    each probe's head is its own, so blocks of one probe give the batched heads, penalties and errors."""
    from probe.analysis import probe_heads as probes  # where fit_head reads HEAD_BLOCK_BYTES
    from probe.analysis.probes import ALPHAS, fit_head

    g = torch.Generator().manual_seed(3)
    z = torch.randn(5, 40, 6, generator=g, dtype=torch.float64)
    y = z[..., :2] @ torch.randn(5, 2, 2, generator=g, dtype=torch.float64) + 0.1 * torch.randn(5, 40, 2, generator=g, dtype=torch.float64)
    batched = fit_head(kind, z, y, ALPHAS, 8, 0)
    monkeypatch.setattr(probes, "HEAD_BLOCK_BYTES", 1)
    blocks = fit_head(kind, z, y, ALPHAS, 8, 0)
    for a, b in zip(batched[1:], blocks[1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    zt = torch.randn(5, 7, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(batched[0].predict(zt), blocks[0].predict(zt), rtol=1e-12, atol=1e-14)


def test_mlp_head_given_the_linear_heads_choice_is_the_mlp_head_that_chooses_again():
    """fit_probe_grid hands the linear head's penalty and leave-one-out error (and those of the
    pooling fit at uniform pooling) to the MLP head on the same pooling instead of choosing again."""
    from probe.analysis.probes import ALPHAS, fit_head

    g = torch.Generator().manual_seed(4)
    z = torch.randn(5, 40, 6, generator=g, dtype=torch.float64)
    y = torch.tanh(z[..., :2]) @ torch.randn(5, 2, 2, generator=g, dtype=torch.float64)
    _, penalty, loo = fit_head("linear", z, y, ALPHAS, 8, 0)
    again, reused = fit_head("mlp", z, y, ALPHAS, 8, 0), fit_head("mlp", z, y, ALPHAS, 8, 0, (penalty, loo))
    for a, b in zip(again[1:], reused[1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    zt = torch.randn(5, 7, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(again[0].predict(zt), reused[0].predict(zt), rtol=1e-12, atol=1e-14)
    wrong = fit_head("mlp", z, y, ALPHAS, 8, 0, (penalty * 100, loo))  # the choice is really used
    assert not torch.allclose(wrong[0].predict(zt), reused[0].predict(zt))


def test_leave_one_out_in_blocks_equals_the_batched_error(monkeypatch):
    from probe.analysis import ridge

    g = torch.Generator().manual_seed(5)
    fc = torch.randn(4, 30, 6, generator=g, dtype=torch.float64)
    fc = fc - fc.mean(1, keepdim=True)
    yc = torch.randn(4, 30, 2, generator=g, dtype=torch.float64)
    penalties = ridge.ridge_penalties(fc, (1e-3, 1e-1, 10.0))
    batched = ridge.ridge_loo(fc, yc, penalties)
    monkeypatch.setattr(ridge, "LOO_BLOCK_BYTES", 1)
    torch.testing.assert_close(ridge.ridge_loo(fc, yc, penalties), batched, rtol=1e-12, atol=0)


def test_probe_intervals_pair_the_best_layers_over_test_prompt_resamples():
    """Hand-built draws: a target whose layer 1 wins on every resample is decoded before one whose
    layer 2 always wins; with the second target's layers 1 and 2 tied, nothing is claimed."""
    from probe.analysis.probe_study import probe_intervals
    from probe.analysis.probes import R2_DRAWS

    g = np.random.default_rng(0)

    def table(peaks):
        rows = []
        for target, peak in (("xty", {1}), ("w_ols", peaks)):
            for layer in range(4):
                for prefix in (3, 5):
                    base = 0.9 if layer in peak else 0.5
                    rows.append({"target": target, "kind": "linear", "control": "none", "layer": layer,
                                 "prefix": prefix, "r2": base, R2_DRAWS: base + 0.01 * g.standard_normal(200)})
        return pd.DataFrame(rows)

    out = probe_intervals(table({2}))
    assert out["fits"]["xty"]["linear"]["best_layer_low"] == out["fits"]["xty"]["linear"]["best_layer_high"] == 1
    (order,) = out["order"]
    assert (order["first"], order["then"], order["difference"], order["earlier"]) == ("xty", "w_ols", 1, "xty")
    lo, hi = out["fits"]["w_ols"]["linear"]["r2_low"][2], out["fits"]["w_ols"]["linear"]["r2_high"][2]
    assert lo < 0.9 < hi and hi - lo < 0.05
    (order,) = probe_intervals(table({1, 2}))["order"]
    assert order["earlier"] is None and order["ci_low"] <= 0 <= order["ci_high"]


def test_r2_resamples_equal_r2_score_on_each_resample():
    from probe.analysis.stats import r2_resamples, r2_score, resamples

    g = torch.Generator().manual_seed(0)
    truth = torch.randn(3, 40, 2, generator=g, dtype=torch.float64)
    pred = truth + 0.5 * torch.randn(3, 40, 2, generator=g, dtype=torch.float64)
    (idx,) = resamples(40, 25, 7)
    reference = torch.stack([r2_score(truth[:, i], pred[:, i]) for i in idx])
    torch.testing.assert_close(r2_resamples(truth, pred, 25, seed=7), reference)


def test_paired_layers_pair_by_relative_depth_with_known_errors():
    """Two GD oracles, l steps at layer l (6 layers) and 2l steps (3 layers): layers pair by
    relative depth (layer l with round(l / 2)); where both run the same number of steps the paired
    difference is exactly 0 and neither is lower; layer 0 is the zero predictor, mean y^2 / d."""
    from probe.analysis.paired_layers import paired_by_depth, paired_layer_difference
    from probe.analysis.pipeline import analysis_prompts

    assert paired_by_depth(3, 3) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert paired_by_depth(6, 3) == [(0, 0), (1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (6, 3)]
    assert paired_by_depth(2, 4) == [(0, 0), (1, 2), (2, 4)]
    a = LearnerOracle("gd", "steps", lambda l: l, n_layers=6, n_dims=4, n_points=14)
    b = LearnerOracle("gd", "steps", lambda l: 2 * l, n_layers=3, n_dims=4, n_points=14)
    settings = small(())
    frame = paired_layer_difference(a, None, b, None, TASK, settings, n_examples=9, n_boot=200)
    assert list(zip(frame.layer_a, frame.layer_b)) == paired_by_depth(6, 3)
    same_steps = frame[frame.layer_a == 2 * frame.layer_b]  # a's l steps against b's 2 (l / 2) steps
    assert list(same_steps.layer_a) == [0, 2, 4, 6]
    np.testing.assert_allclose(same_steps.difference, 0.0, atol=1e-12)
    assert same_steps.lower.isna().all()
    assert frame.set_index("layer_a").loc[1, "lower"] == "b"  # one GD step against two
    ys = analysis_prompts(TASK, settings, "test", settings.prompts.test).ys.double()
    assert frame.error_a[0] == pytest.approx(float((ys[:, 9] ** 2).mean() / 4), rel=1e-6)
    with pytest.raises(ValueError, match="n_examples 14 is outside 0..13"):
        paired_layer_difference(a, None, b, None, TASK, settings, n_examples=14)


@pytest.mark.parametrize("shift", ["orthogonal_train_test", "opposite_quadrants", "overlapping_train_test"])
def test_shifted_queries_by_the_cache_equal_one_sequence_per_prefix(shift):
    """A shift that replaces each position's query (Garg et al.'s orthogonal, opposite-quadrant and
    overlapping queries): the GPT-2 family runs each prompt once and each query as one token after
    the cached prefix; the prediction equals the model's forward on (x_1, y_1, ..., x_t, y_t, q_t),
    one sequence per t, to float round-off, and positions the shift defines no query for stay NaN."""
    from probe.analysis.evaluate import predict, shifted_predictions
    from probe.data.tasks import Prompts
    from probe.io.formats import load_checkpoint

    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    assert ckpt.model.key_value_cache
    p, preds, defined = shifted_predictions(ckpt.model, ckpt.config.task, shift, n_prompts=24, seed=3)
    assert preds.shape == (24, ckpt.config.task.n_points)
    for t in range(p.xs.shape[1]):
        if not defined[t]:
            assert preds[:, t].isnan().all()
            continue
        xs = torch.cat([p.xs[:, :t], p.queries[:, t : t + 1]], 1)
        ys = torch.cat([p.ys[:, :t], p.query_ys[:, t : t + 1]], 1)
        torch.testing.assert_close(preds[:, t], predict(ckpt.model, Prompts(xs, ys))[:, t], atol=2e-5, rtol=1e-4)
    assert bool(defined.any())


def test_matching_in_chunks_of_the_grid_finds_the_members_of_the_whole_grid(monkeypatch):
    """matched_members runs each family's grid a chunk at a time (grid_chunks, in grid order, so the
    first of equal distances still wins): the same member and distance as the whole grid at once."""
    from probe.analysis import shift_tracking as st
    from probe.io.formats import load_checkpoint

    grid = {"eta": (1, 2, 3, 4, 5), "steps": (0, 1, 2), "convention": ("paper",)}
    parts = st.grid_chunks(grid, 6)
    assert [p["eta"] for p in parts] == [(1, 2), (3, 4), (5,)] and all(p["steps"] == (0, 1, 2) for p in parts)
    assert st.grid_chunks(grid, 15) == [grid]
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    monkeypatch.setattr(st, "MATCH_MEMBERS", 10**6)
    whole = st.matched_members(ckpt.model, ckpt.config.task, n_prompts=32)
    monkeypatch.setattr(st, "MATCH_MEMBERS", 8)
    chunked = st.matched_members(ckpt.model, ckpt.config.task, n_prompts=32)
    assert chunked.keys() == whole.keys()
    for family in whole:
        assert chunked[family][:2] == whole[family][:2], family
        assert chunked[family][2] == pytest.approx(whole[family][2], rel=1e-9), family
