import numpy as np
import pytest
import torch

from probe.analysis.similarity import best_match, ilw, induced_weights, sime, similarity_frame, simw, spd
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.learners import run_learner


@pytest.fixture(scope="module")
def data():
    p = sample_prompts(TaskConfig(n_dims=3, n_points=9), 50, generator=generator_for(2))
    queries = torch.randn(50, 40, 3, generator=generator_for(9)).double()
    return p.xs.double(), p.ys.double(), queries


def test_sime_identical_is_one_and_negated_residuals_minus_one(data):
    xs, ys, _ = data
    pred = run_learner("averaging", xs, ys).preds
    mirrored = 2 * ys - pred  # residual -> -residual
    assert torch.allclose(sime(pred, pred, ys), torch.ones(1, 1, 50, dtype=torch.float64))
    assert torch.allclose(sime(pred, mirrored, ys), -torch.ones(1, 1, 50, dtype=torch.float64))


def test_sime_matches_numpy_cosine_and_position_option(data):
    xs, ys, _ = data
    a = run_learner("averaging", xs, ys).preds
    b = run_learner("newton", xs, ys, iterations=(0, 2)).preds
    vals = sime(a, b, ys)
    ra, rb = (a[0, 4] - ys[4])[1:].numpy(), (b[1, 4] - ys[4])[1:].numpy()
    assert vals[0, 1, 4].item() == pytest.approx(ra @ rb / np.linalg.norm(ra) / np.linalg.norm(rb))
    with_first = sime(a, b, ys, include_first=True)
    ra, rb = (a[0, 4] - ys[4]).numpy(), (b[1, 4] - ys[4]).numpy()
    assert with_first[0, 1, 4].item() == pytest.approx(ra @ rb / np.linalg.norm(ra) / np.linalg.norm(rb))


def test_induced_weights_recover_linear_learners(data):
    xs, ys, queries = data
    res = run_learner("ridge", xs, ys, queries, lam=(0.3,))
    torch.testing.assert_close(induced_weights(res.query_preds, queries), res.weights)


def test_simw_identical_scaled_and_negated(data):
    xs, ys, _ = data
    w = run_learner("least_squares", xs, ys).weights
    assert torch.allclose(simw(w, w), torch.ones(1, 1, 50, dtype=torch.float64))
    assert torch.allclose(simw(w, 3 * w), torch.ones(1, 1, 50, dtype=torch.float64))
    assert torch.allclose(simw(w, -w), -torch.ones(1, 1, 50, dtype=torch.float64))


def test_spd_and_ilw_against_direct_formulas(data):
    xs, ys, queries = data
    a = run_learner("ridge", xs, ys, queries, lam=(0.1, 1.0))
    b = run_learner("least_squares", xs, ys, queries)
    direct_spd = ((a.query_preds[:, None, :, 1:] - b.query_preds[None, :, :, 1:]) ** 2).mean((-1, -2))
    torch.testing.assert_close(spd(a.query_preds, b.query_preds), direct_spd)
    direct_ilw = ((a.weights[:, None, :, 1:] - b.weights[None, :, :, 1:]) ** 2).sum(-1).mean(-1)
    torch.testing.assert_close(ilw(a.weights, b.weights), direct_ilw)
    assert torch.allclose(spd(b.query_preds, b.query_preds), torch.zeros(1, 1, 50, dtype=torch.float64), atol=1e-12)


def test_best_match_recovers_planted_iteration_map(data):
    """A family whose member a is exactly Newton with 2a iterations is matched at k = 2a."""
    xs, ys, _ = data
    grid = list(range(12))
    newton = run_learner("newton", xs, ys, iterations=grid)
    family = newton.preds[[0, 2, 4, 6]]
    table = best_match(sime(family, newton.preds, ys), n_boot=200)
    assert table.best_index.tolist() == [0, 2, 4, 6]
    assert (table.similarity > 0.999999).all()
    assert (table.best_index_low <= table.best_index).all() and (table.best_index <= table.best_index_high).all()
    frame = similarity_frame(sime(family, newton.preds, ys), "sime", "family", "newton", newton.grid, n_boot=100)
    assert set(frame.columns) >= {"a_index", "iterations", "metric", "value", "ci_low", "ci_high"}
    assert len(frame) == 4 * 12
    assert (frame.ci_low <= frame.value + 1e-12).all() and (frame.value <= frame.ci_high + 1e-12).all()


def test_best_match_minimises_distances(data):
    xs, ys, queries = data
    newton = run_learner("newton", xs, ys, queries, iterations=range(8))
    table = best_match(ilw(newton.weights[[3]], newton.weights), higher_is_better=False, n_boot=50)
    assert table.best_index.tolist() == [3] and table.similarity[0] == pytest.approx(0, abs=1e-12)


def test_best_match_ties_up_to_round_off_go_to_the_fewest_iterations(data):
    """Exact-line-search BFGS on a quadratic reaches OLS after d steps and then repeats it up to
    float round-off; a layer equal to OLS is matched at k = d, not at a later repetition."""
    xs, ys, _ = data
    d = xs.shape[-1]
    bfgs = run_learner("bfgs", xs, ys, iterations=range(12))
    ols = run_learner("least_squares", xs, ys).preds
    later = (bfgs.preds[d:, :, d + 1 :] - ols[:, :, d + 1 :]).abs().max()
    assert 0 < later < 1e-9  # converged, up to round-off
    noise = 1e-13 * torch.arange(12.0, dtype=torch.float64)[None, :, None]  # later k favoured by noise alone
    values = sime(ols, bfgs.preds, ys) + noise
    assert torch.argmax(values.mean(-1)).item() == 11  # what a plain argmax reports
    table = best_match(values, n_boot=100)
    assert table.best_index.tolist() == [d] and table.best_index_high.tolist() == [d]
    assert best_match(-values, higher_is_better=False, n_boot=10).best_index.tolist() == [d]


def test_paired_verdict_uses_the_per_prompt_difference_and_the_resolution():
    """Two candidates scored on the same prompts: a shared prompt effect cancels in the paired
    difference (its interval is far narrower than either score's), a real gap gives "<a> closer",
    no gap gives "not separable", and a gap wider than the resolution cannot be claimed either."""
    from probe.analysis.stats import bootstrap_mean
    from probe.analysis.verdicts import NOT_SEPARABLE, Candidate, paired_verdict

    g = torch.Generator().manual_seed(0)
    prompt_effect = 0.2 * torch.randn(400, generator=g, dtype=torch.float64)
    b_scores = 0.7 + prompt_effect
    a_scores = b_scores + 0.01 + 0.002 * torch.randn(400, generator=g, dtype=torch.float64)
    between = torch.full((400,), 0.95, dtype=torch.float64)
    out = lambda: torch.zeros(400, 3)
    a, b = Candidate("newton", "newton", 3, a_scores, out()), Candidate("gd", "gd_log", 64, b_scores, out())
    row = paired_verdict("final layer", "sime", a, b, between, n_boot=500)
    assert row["verdict"] == "newton closer" and row["ci_low"] > 0.009 and row["ci_high"] < 0.011
    assert row["difference"] == pytest.approx(float((a_scores - b_scores).mean()))
    assert row["resolution"] == pytest.approx(0.05)
    separate = [hi - lo for lo, hi in (bootstrap_mean(s, n_boot=500) for s in (a_scores, b_scores))]
    assert row["ci_high"] - row["ci_low"] < min(separate) / 10
    tie = paired_verdict("final layer", "sime", Candidate("newton", "newton", 3, b_scores, out()), b, between)
    assert tie["verdict"] == NOT_SEPARABLE and tie["ci_low"] <= 0 <= tie["ci_high"]
    assert paired_verdict("final layer", "sime", b, a, between)["verdict"] == "newton closer"
    unresolved = paired_verdict("final layer", "sime", a, b, torch.full((400,), 0.9999, dtype=torch.float64))
    assert unresolved["verdict"] == NOT_SEPARABLE and unresolved["resolution"] == pytest.approx(1e-4)


def test_resolution_ceiling_is_one_minus_the_best_match_between_the_learners():
    """A resolution cell recomputed by hand (numpy cosines of the two learners' errors), and the
    known ordering: Iterative Newton and tuned GD can be put at most ~0.02 apart on SimE, GD and
    least squares much further."""
    from probe.analysis.resolution import LEARNER_GRIDS, ResolutionGrid, _task, resolution_table

    table = resolution_table(ResolutionGrid(dims=(4,), kappas=(1.0,), noises=(0.0,), prompts=64))
    newton_gd = table[(table.a == "newton") & (table.b == "gd") & (table.metric == "sime")].iloc[0]
    assert newton_gd.resolution_max < 0.03 and newton_gd.trend.startswith("exponential")
    gd_ls = table[(table.a == "gd") & (table.b == "least_squares") & (table.metric == "sime")].iloc[0]
    assert gd_ls.resolution_max > 10 * newton_gd.resolution_max
    p = sample_prompts(_task(4, 1.0, 0.0), 64, generator=generator_for(0))
    newton = run_learner("newton", p.xs, p.ys, **LEARNER_GRIDS["newton"][1]).preds.numpy()
    gd = run_learner("gd", p.xs, p.ys, **LEARNER_GRIDS["gd"][1]).preds.numpy()
    ea, eb = newton[..., 1:] - p.ys.numpy()[..., 1:], gd[..., 1:] - p.ys.numpy()[..., 1:]
    cos = np.einsum("abm,kbm->akb", ea, eb) / (
        np.linalg.norm(ea, axis=-1)[:, None] * np.linalg.norm(eb, axis=-1)[None]
    )
    by_hand = 1 - cos.mean(-1).max(-1)[1:]  # k_a >= 1
    assert newton_gd.resolution_max == pytest.approx(by_hand.max(), abs=1e-9)
    assert newton_gd.resolution_min == pytest.approx(by_hand.min(), abs=1e-9)


def test_resampled_means_are_the_means_of_the_drawn_prompts():
    """The bootstrap's resample means as one product of prompt counts equal the mean of each
    resample's drawn rows (numpy, on `resamples`' own index draws), in the values' dtype; values
    with a NaN take the drawn rows themselves, so a prompt never drawn leaves a resample finite."""
    from probe.analysis.stats import bootstrap_mean, resample_counts, resampled_means, resamples

    values = torch.randn(37, 3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (idx,) = resamples(37, 200, seed=4)
    expected = values.numpy()[idx.numpy()].mean(axis=1)
    np.testing.assert_allclose(resampled_means(values, 200, seed=4).numpy(), expected, rtol=1e-13, atol=1e-15)
    assert resample_counts(37, 200, seed=4).sum(1).eq(37).all()
    single = resampled_means(values.float(), 200, seed=4)
    assert single.dtype == torch.float32 and np.allclose(single.numpy(), expected, rtol=1e-6, atol=1e-6)
    lo, hi = bootstrap_mean(values, n_boot=200, seed=4)
    np.testing.assert_allclose(lo.numpy(), np.quantile(expected, 0.05, axis=0), rtol=1e-12)
    np.testing.assert_allclose(hi.numpy(), np.quantile(expected, 0.95, axis=0), rtol=1e-12)
    never = int(np.setdiff1d(np.arange(37), idx[0].numpy())[0])  # a prompt the first resample does not draw
    values[never, 0, 0] = float("nan")
    first = resampled_means(values, 200, seed=4)[0]
    assert torch.isfinite(first).all() and torch.allclose(first, values[idx[0]].mean(0))
