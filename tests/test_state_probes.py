"""Probes for the state an algorithm keeps: S = X^T X / t of the prefix, the
matrix Newton-type learners build (Fu et al. 2024, eq. 5) and GD never forms."""

import numpy as np
import pytest
import torch
from conftest import REPO

from probe.analysis.probe_study import ProbeSettings, probe_study
from probe.analysis.probes import fit_probes, probe_targets
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.io.formats import load_checkpoint


def test_the_s_target_is_the_prefix_second_moment_above_the_diagonal():
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(3, 7, 4, generator=g), torch.randn(3, 7, generator=g)
    got = probe_targets(xs, ys, "xtx").numpy()
    x = xs.double().numpy()
    rows, cols = np.triu_indices(4)
    for t in range(7):
        s = np.einsum("bti,btj->bij", x[:, :t], x[:, :t]) / max(t, 1)
        np.testing.assert_allclose(got[:, t], s[:, rows, cols], atol=1e-12)
    assert got.shape == (3, 7, 10)


def _streams(n_prompts, seed):
    """Two layers over the interleaved tokens of d = 3 prompts: layer 0 holds each token's x or y
    (linear in the prompt), layer 1 adds, at example i's y token, S after i + 1 examples."""
    task = TaskConfig(n_dims=3, n_points=8)
    p = sample_prompts(task, n_prompts, generator=generator_for(seed))
    s_after = probe_targets(p.xs, p.ys, "xtx")  # (N, n, 6): index t after t examples
    n, width = 8, 3 + 1 + 6
    states = torch.zeros(2, n_prompts, 2 * n, width, dtype=torch.float64)
    states[:, :, 0::2, :3] = p.xs.double()
    states[:, :, 1::2, 3] = p.ys.double()
    states[1, :, 1::2, 4:][:, : n - 1] = s_after[:, 1:]
    return states, {k: probe_targets(p.xs, p.ys, k) for k in ("xtx", "xty")}


def test_a_linear_probe_reads_s_where_a_layer_writes_it_and_not_from_the_raw_tokens():
    train_states, train_targets = _streams(300, 1)
    test_states, test_targets = _streams(200, 2)
    table = fit_probes(train_states, train_targets, test_states, test_targets, [(3, "xtx"), (6, "xtx")], "linear")
    r2 = table.set_index(["layer", "prefix"]).r2
    assert (r2.loc[1] > 0.99).all()  # written linearly at the last example's token
    assert (r2.loc[0] < 0.05).all()  # a quadratic of the tokens: no linear read-out of layer 0


@pytest.mark.slow
def test_the_planted_gd_model_holds_no_more_of_s_than_its_layer_0():
    ckpt = load_checkpoint(REPO / "checkpoints" / "planted" / "gd")
    settings = ProbeSettings(kinds=("linear",), targets=("xtx",), prompts=256, controls=False, max_iter=100)
    table = probe_study(ckpt.model, ckpt.config.task, settings, n_test=128, n_boot=200)
    by_layer = table.groupby("layer").r2.max()
    half_width = (table.r2_high - table.r2_low).max() / 2
    assert (by_layer <= by_layer.loc[0] + half_width).all() and by_layer.max() < 0.05


def test_probes_fitted_a_block_of_layers_at_a_time_are_the_probes_of_one_grid(monkeypatch):
    """On a GPT-2 (a forward resumed from a layer) with float64 streams, the probe study fits and
    scores a block of layers at a time (`layer_blocks`): each probe's pooling fit is its own, so the
    fits take the same iterations and stop alike, at the same numbers to the round-off of the batched
    products (a batch of fewer probes may take another BLAS kernel: exact on some CPUs, not on an
    AVX-512 one), rows in the same order, with the controls; with every layer in one block (a large
    PROBE_BLOCK_BYTES) the whole capture is used."""
    from conftest import build_cfg

    import probe.analysis.probe_study as study
    from probe.models import build_model

    cfg = build_cfg(layers=2)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    control = build_model(cfg.model).eval()  # the random-weights control: another draw of the architecture
    settings = ProbeSettings(prompts=24, max_iter=30, hidden=8, targets=("xty", "xtx"), prefixes=(2, 5))  # two widths: two grids
    assert study.layer_blocks(model, 24, cfg.task.n_points, torch.float64) == [slice(0, 3)]
    whole = probe_study(model, cfg.task, settings, n_test=12, control_model=control, n_boot=20)
    monkeypatch.setattr(study, "PROBE_BLOCK_BYTES", 1)  # one layer boundary per block
    assert study.layer_blocks(model, 24, cfg.task.n_points, torch.float64) == [slice(i, i + 1) for i in range(3)]
    assert study.layer_blocks(model, 24, cfg.task.n_points, torch.float32) == [slice(0, 3)]
    # on a GPU the blocks are held there, up to DEVICE_BLOCK_BYTES (no CUDA needed to ask)
    assert study.layer_blocks(model, 24, cfg.task.n_points, torch.float64, "cuda") == [slice(0, 3)]
    monkeypatch.setattr(study, "DEVICE_BLOCK_BYTES", 1)
    assert study.layer_blocks(model, 24, cfg.task.n_points, torch.float64, "cuda") == [slice(i, i + 1) for i in range(3)]
    blocked = probe_study(model, cfg.task, settings, n_test=12, control_model=control, n_boot=20)
    assert list(blocked.columns) == list(whole.columns) and len(whole) == 3 * 2 * 2 * 2 * 3  # boundaries, prefixes,
    # targets, kinds, controls
    exact = ["layer", "prefix", "target", "kind", "control", "iterations", "converged", "peak_position"]
    assert blocked[exact].equals(whole[exact])
    np.testing.assert_allclose(blocked.penalty, whole.penalty, rtol=1e-8, atol=0, err_msg="penalty")
    for name in ("grad_norm", "y_mass", "loo_r2", "r2", "r2_low", "r2_high", "nmse"):
        np.testing.assert_allclose(blocked[name], whole[name], rtol=0, atol=1e-9, err_msg=name)
