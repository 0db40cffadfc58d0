"""Layer analyses on models whose answer is known by construction."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO
from sklearn.linear_model import Ridge

from probe.analysis.matching import trend
from probe.analysis.pipeline import LayerSettings, analyse_layers
from probe.analysis.readout import RidgeReadout, fit_layer_readouts
from probe.analysis.span import span_residuals
from probe.config import TaskConfig
from probe.models.oracle import LearnerOracle
from probe.settings import PromptSettings, ReadoutSettings, SimilaritySettings, SweepSettings

TASK = TaskConfig(n_dims=4, n_points=14)
SMALL_PROMPTS = PromptSettings(train=64, val=32, test=96, induced=24, queries=12)


def small(sweeps, method="ridge"):
    return LayerSettings(SMALL_PROMPTS, ReadoutSettings(method=method), SimilaritySettings(bootstrap=100), sweeps)


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
    assert verdict["verdict"].startswith("newton: linear, about 3.0 iterations per layer")
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
    assert "linear, about 1.0 steps per layer" in next(t for t in res.trends if t["learner"] == "gd_linear"
                                                        and t["metric"] == "sime")["verdict"]


def test_trend_prefers_exponential_for_doubling():
    best = pd.DataFrame({"sweep": "gd", "metric": "sime", "layer": range(7), "k": [0, 2, 4, 8, 16, 32, 64],
                         "at_grid_end": False})
    out = trend(best, "gd")
    assert out["verdict"].startswith("gd: exponential, about x2.00 per layer")
    assert out["exponential_r2"] == pytest.approx(1.0) and out["linear_r2"] < 0.95


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


def test_probe_recovers_planted_target_and_controls_score_near_zero():
    from probe.analysis.probes import AttentionPoolProbe

    g = torch.Generator().manual_seed(0)
    h = torch.randn(600, 8, 16, generator=g)
    a = torch.randn(16, 3, generator=g)
    target = h[:, 5] @ a  # planted linearly at position 5
    probe = AttentionPoolProbe("linear", steps=600, lr=1e-2).fit(h[:400], target[:400])
    assert probe.score(h[400:], target[400:]) > 0.98
    assert probe.attention_.argmax() == 5
    unrelated = torch.randn(600, 3, generator=g)
    control = AttentionPoolProbe("linear", steps=600, lr=1e-2).fit(h[:400], unrelated[:400])
    assert abs(control.score(h[400:], unrelated[400:])) < 0.1


def test_batched_probes_and_r2_match_sklearn():
    from sklearn.metrics import r2_score

    from probe.analysis.probes import fit_probes, probe_targets
    from probe.stats import r2_score as r2_ours

    g = torch.Generator().manual_seed(1)
    truth, pred = torch.randn(2, 50, 3, generator=g).double(), torch.randn(2, 50, 3, generator=g).double()
    for i in range(2):
        assert r2_ours(truth[i], pred[i]).mean(-1).item() == pytest.approx(r2_score(truth[i].numpy(), pred[i].numpy()))
    # a grid whose layer 1 holds X^T y of the prefix at the last y token: only that layer decodes it
    xs, ys = torch.randn(500, 6, 3, generator=g), torch.randn(500, 6, generator=g)
    xty = probe_targets(xs, ys, "xty")  # (N, n, d)
    states = torch.randn(2, 500, 12, 5, generator=g)
    states[1, :, 5, :3] = xty[:, 3]  # token 5 is y_3: it has seen 3 examples
    table = fit_probes(states[:, :400], {"xty": xty[:400]}, states[:, 400:], {"xty": xty[400:]}, [(3, "xty")], "linear",
                       steps=500, lr=1e-2)
    r2 = table.set_index("layer").r2
    assert r2[1] > 0.95 and r2[0] < 0.3
    assert table.set_index("layer").peak_position[1] == 5


@pytest.mark.parametrize("which", ["default", "garg", "relu-attention"])
def test_cached_query_states_equal_one_sequence_per_query(which, tmp_path):
    """The key/value-cache path (each prompt once) against one TransformerLens-captured
    sequence per prefix and query, on the trained default checkpoint and a Garg-layout run."""
    from conftest import GargTransformerModel, write_garg_run

    from probe.analysis.states import cached_query_states, sequence_query_states
    from probe.formats import load_checkpoint

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
        check_estimator(AttentionPoolProbe(steps=20))  # 2-D data: one position per sample
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
    probe = AttentionPoolProbe(steps=5).set_params(steps=150, lr=1e-2)
    assert probe.get_params()["steps"] == 150
    with pytest.raises(NotFittedError):
        probe.predict(H)
    assert probe.fit(H, Y).score(H, Y) > 0.9 and probe.n_features_in_ == 6
    search = GridSearchCV(AttentionPoolProbe(lr=1e-2), {"steps": [1, 150]}, cv=2).fit(H, Y[:, 0])
    assert np.isfinite(search.cv_results_["mean_test_score"]).all() and search.best_params_["steps"] == 150
    with pytest.raises(ValueError, match=r"H has \(1, 6\) \(positions, width\) but the probe was fitted on \(4, 6\)"):
        probe.predict(H[:, 0])


def test_the_documented_estimators_reproduce_the_batched_fits():
    """AttentionPoolProbe with fit_probes' settings equals fit_probes' probe for one (layer,
    prefix, target), and RidgeReadout(alpha chosen) equals fit_layer_readouts' layer read-out."""
    from probe.analysis.probes import AttentionPoolProbe, fit_probes

    states, all_targets = _calibration_states(300)
    train, test = slice(0, 200), slice(200, 300)
    targets, test_targets = {"xty": all_targets["xty"][train]}, {"xty": all_targets["xty"][test]}
    combos = [(2, "xty"), (5, "xty")]
    for kind in ("linear", "mlp"):
        table = fit_probes(states[:, train], targets, states[:, test], test_targets, combos, kind, steps=60,
                           lr=[0.1, 0.01], hidden=[32], eval_every=10, patience=2)
        for layer in (1, 3):
            for t, _ in combos:
                row = table[(table.layer == layer) & (table.prefix == t)].iloc[0]
                probe = AttentionPoolProbe(kind, steps=60, lr=(0.1, 0.01), hidden=32, eval_every=10, patience=2)
                probe.fit(states[layer, train, : 2 * t].numpy(), targets["xty"][:, t].numpy())
                assert (probe.lr_, probe.n_steps_, probe.converged_) == (row.lr, row.steps, row.converged)
                got = probe.score(states[layer, test, : 2 * t].numpy(), test_targets["xty"][:, t].numpy())
                assert got == pytest.approx(row.r2, abs=1e-5)
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
    training stops on validation before the step limit and says so."""
    from probe.analysis.probes import fit_probes

    states, targets = _calibration_states(1200)
    train, test = (states[:, :1000], {k: v[:1000] for k, v in targets.items()}), (states[:, 1000:], {k: v[1000:] for k, v in targets.items()})
    table = fit_probes(*train, *test, [(6, "xty"), (7, "xty"), (6, "w_ols"), (7, "w_ols")], "linear", steps=4000,
                       lr=(3e-2, 1e-2), eval_every=50, patience=4)
    r2 = table.groupby(["target", "layer"]).r2.min().unstack()
    assert r2.loc["xty", 1] > 0.95 and r2.loc["w_ols", 2] > 0.95
    assert r2.loc["xty", 2] < 0.95 and r2.loc["w_ols", 1] < 0.95  # a different (non-linear) function of the data
    assert table[table.layer.isin([0, 3])].r2.abs().max() < 0.1
    assert table.converged.mean() >= 0.75 and (table[table.converged].steps < 4000).all()
    assert set(table.lr) <= {3e-2, 1e-2}


def test_probes_that_hit_the_step_limit_say_so(report):
    import dataclasses

    from probe.analysis.probes import fit_probes
    from probe.report.findings import caveats
    from probe.report.schema import Probes, Summary
    from probe.report.summary import probe_summary

    states, targets = _calibration_states(300)
    table = fit_probes(states[:, :200], {"xty": targets["xty"][:200]}, states[:, 200:], {"xty": targets["xty"][200:]},
                       [(4, "xty")], "mlp", steps=10, lr=1e-3, hidden=(16, 32), eval_every=5)
    assert not table.converged.any() and (table.steps <= 10).all() and set(table.hidden) <= {16, 32}
    written = Summary.from_json(json.loads((report / "summary.json").read_text()))
    summary = dataclasses.replace(written, probes=Probes(probe_summary(table.assign(control="none"))))
    assert summary.probes.fits["xty"]["mlp"].converged_share == 0.0
    assert any("stopped at the step limit (10 steps)" in c for c in caveats(summary))


def test_probe_streams_go_to_disk_when_the_memory_budget_is_spent(tmp_path, monkeypatch):
    """`--max-memory` counts what the process already holds: with none left, the probes' streams
    are a memmap on disk, equal to the in-memory ones."""
    import importlib

    from probe.capture.streams import by_position_streams
    from probe.formats import load_checkpoint
    from probe.memory import MemoryBudget, resident_memory

    model = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(512, 16, 4, generator=g), torch.randn(512, 16, generator=g)
    in_memory = by_position_streams(model, xs, ys, chunk=128)
    assert in_memory.shape == (9, 32, 512, 64)
    monkeypatch.setattr(importlib.import_module("probe.capture.streams"), "spill_dir", lambda: str(tmp_path))
    spent = MemoryBudget(resident_memory())  # as `--max-memory` equal to what the process holds
    assert spent.headroom() < 128 << 20  # the floor, or what was allocated since
    on_disk = by_position_streams(model, xs, ys, chunk=128, memory=spent)
    assert (tmp_path / "probe_streams.npy").is_file()
    np.testing.assert_array_equal(on_disk.numpy(), in_memory.numpy())
    # the layout is the capture's, by position
    from probe.capture import RESID, capture

    direct = np.asarray(capture(model, xs[:3], ys[:3], hooks=[RESID]).acts[RESID])
    np.testing.assert_allclose(in_memory[:, :, :3].numpy(), direct.transpose(0, 2, 1, 3), atol=1e-6)
