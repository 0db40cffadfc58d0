"""The MLP probe trained as a network (probe/analysis/mlp_head.py): it decodes what
a layer holds nonlinearly as well as an MLP given the true position, and costs nothing on linear codes."""

import numpy as np
import pytest
from sklearn.metrics import r2_score
from sklearn.neural_network import MLPRegressor

from probe.analysis.probes import AttentionPoolProbe
from probe.analysis.stats import percentile_interval, r2_resamples

N_FIT, N_TEST, POSITIONS, WIDTH, AT = 400, 400, 6, 12, 2


def _states(seed):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((N_FIT + N_TEST, POSITIONS, WIDTH))
    u = rng.standard_normal(WIDTH)
    return h, h[:, AT] @ (u / np.linalg.norm(u))


@pytest.mark.slow
def test_the_mlp_probe_decodes_a_saturating_code_as_well_as_an_mlp_on_the_true_position():
    h, a = _states(0)
    y = np.tanh(3 * a)  # a saturating code of one direction at one position
    fit, test = slice(0, N_FIT), slice(N_FIT, None)
    linear = AttentionPoolProbe("linear").fit(h[fit], y[fit])
    mlp = AttentionPoolProbe("mlp", hidden=32).fit(h[fit], y[fit])
    random = AttentionPoolProbe("mlp", hidden=32, mlp_head="random").fit(h[fit], y[fit])
    reference = MLPRegressor(hidden_layer_sizes=(32,), solver="lbfgs", alpha=1e-3, max_iter=5000, random_state=0)
    reference.fit(h[fit, AT], y[fit])
    ours, theirs = mlp.score(h[test], y[test]), r2_score(y[test], reference.predict(h[test, AT]))
    assert mlp.head_trained_ and mlp.attention_.argmax() == AT
    assert ours >= theirs - 0.02, (ours, theirs)
    assert ours > random.score(h[test], y[test]) + 0.1 > linear.score(h[test], y[test])  # random features fall short


@pytest.mark.slow
def test_the_mlp_probe_is_no_worse_than_the_linear_probe_on_a_linear_code():
    h, a = _states(1)
    y = a + 0.3 * np.random.default_rng(2).standard_normal(len(a))
    fit, test = slice(0, N_FIT), slice(N_FIT, None)
    linear = AttentionPoolProbe("linear").fit(h[fit], y[fit])
    mlp = AttentionPoolProbe("mlp", hidden=32).fit(h[fit], y[fit])
    import torch

    truth = torch.from_numpy(y[test]).view(1, -1, 1)
    preds = {name: torch.from_numpy(p.predict(h[test])).view(1, -1, 1) for name, p in (("linear", linear), ("mlp", mlp))}
    draws = r2_resamples(truth, preds["linear"], 500, 0)[:, 0, 0] - r2_resamples(truth, preds["mlp"], 500, 0)[:, 0, 0]
    low, high = percentile_interval(draws.unsqueeze(1))
    gap = linear.score(h[test], y[test]) - mlp.score(h[test], y[test])
    assert gap <= float(high[0]) and float(high[0]) - float(low[0]) < 0.05  # within its paired interval


def test_a_bad_mlp_head_is_refused():
    h, a = _states(3)
    with pytest.raises(ValueError, match="mlp_head must be 'trained' or 'random'"):
        AttentionPoolProbe("mlp", mlp_head="deep").fit(h[:50], a[:50])
