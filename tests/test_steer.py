"""Causal probes (probe/interventions/steer.py): the edit is the smallest that moves the decoded
quantity by delta, and on planted GD the prediction moves exactly as the construction says."""

import json

import numpy as np
import pytest
import torch

from probe.analysis.probes import AttentionPoolProbe
from probe.cli import main
from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.interventions.runner import runner_for
from probe.interventions.steer import ProbeMap, add_at_tokens, expected_move, steering_table
from probe.io.planted_io import planted_config
from probe.models.planted import plant

L, D, N, T, ETA = 5, 4, 12, 8, 0.1


def _planted_gd():
    model = plant(planted_config("gd", L, D, N, step_size=ETA).model)
    p = sample_prompts(TaskConfig(n_dims=D, n_points=N), 24, generator=generator_for(3))
    return model, p.xs[:, : T + 1], p.ys[:, : T + 1]


def test_probe_edit_is_the_smallest_that_moves_the_decoded_quantity_by_delta():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(300, 6, 5))
    y = h.mean(1) @ rng.normal(size=(5, 3))
    probe = AttentionPoolProbe(kind="linear").fit(h, y)
    pmap = ProbeMap.of(probe)
    delta = torch.as_tensor(rng.normal(size=(4, 3)))
    edit = pmap.edit(delta)
    np.testing.assert_allclose(probe.predict(h[:4] + edit.numpy()) - probe.predict(h[:4]), delta.numpy(), atol=1e-4)
    np.testing.assert_allclose(pmap.decoded_change(edit).numpy(), delta.numpy(), atol=1e-9)
    # minimum norm: numpy's least-squares solution of the stacked linear system (P*D unknowns)
    a = np.einsum("p,de->pde", pmap.alpha.numpy(), pmap.weight.numpy() * pmap.std.numpy()).reshape(-1, 3).T
    smallest = np.linalg.lstsq(a, delta.numpy().T, rcond=None)[0].T.reshape(4, 6, 5)
    np.testing.assert_allclose(edit.numpy(), smallest, atol=1e-9)
    with pytest.raises(ConfigError, match="only linear probes can be steered"):
        ProbeMap.of(AttentionPoolProbe(kind="mlp", hidden=8).fit(h, y))


def test_expected_move_of_xty_is_least_squares_reading_it():
    xs, ys = torch.randn(5, 7, 3, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    delta = torch.randn(5, 3, dtype=torch.float64)
    t = 4
    x, q = xs[:, :t].numpy(), xs[:, t].numpy()
    ref = [q[i] @ np.linalg.pinv(x[i].T @ x[i]) @ delta[i].numpy() for i in range(5)]
    np.testing.assert_allclose(expected_move("xty", xs, ys, t, delta).numpy(), ref, rtol=1e-10)
    np.testing.assert_allclose(expected_move("w_ols", xs, ys, t, delta).numpy(), (xs[:, t] * delta).sum(-1).numpy())


def test_planted_gd_known_answers():
    """Planted GD (probe/models/planted.py): the query token carries -w_l.x_q, which later layers
    only add to, so moving it by -x_q.delta moves the prediction by exactly x_q.delta at any layer;
    the examples carry r_i = y_i - w_l.x_i, which later layers recompute from: moving their w by
    delta moves the prediction by -x_q^T (I - (I - eta S/t)^(L-l)) delta (0 at the last layer)."""
    model, xs, ys = _planted_gd()
    runner = runner_for(model)
    r = model.layout["r"]
    delta = torch.randn(len(xs), D, generator=torch.Generator().manual_seed(1))
    base = runner.predict(xs, ys, query=T)
    s = torch.einsum("bti,btj->bij", xs[:, :T], xs[:, :T]) / T
    for layer in range(L + 1):
        query_edit = torch.zeros(len(xs), 2 * T + 1, model.layout.width)
        query_edit[:, 2 * T, r] = -(xs[:, T] * delta).sum(-1, keepdim=True)
        moved = runner.predict(xs, ys, [add_at_tokens(runner, layer, query_edit, T)], query=T)
        np.testing.assert_allclose((moved - base).numpy(), (xs[:, T] * delta).sum(-1).numpy(), atol=1e-5)
        example_edit = torch.zeros(len(xs), 2 * T, model.layout.width)
        example_edit[:, 1::2, r] = -(xs[:, :T] * delta[:, None]).sum(-1, keepdim=True)  # y tokens: example slots
        moved = runner.predict(xs, ys, [add_at_tokens(runner, layer, example_edit, T)], query=T)
        remaining = torch.eye(D) - torch.linalg.matrix_power(torch.eye(D) - ETA * s, L - layer)
        expect = -torch.einsum("bi,bij,bj->b", xs[:, T], remaining, delta)
        np.testing.assert_allclose((moved - base).numpy(), expect.numpy(), atol=1e-5)


@pytest.mark.slow
def test_steering_table_controls_and_a_gpt2_end_to_end(ckpt, tmp_path, capsys):
    model, xs, ys = _planted_gd()
    p = sample_prompts(TaskConfig(n_dims=D, n_points=N), 256, generator=generator_for(4))
    # planted GD keeps GD's iterates, not w_OLS: no linear probe decodes it, so no cell is steered
    table = steering_table(model, (p.xs, p.ys), (xs, ys), [1, L], [T], ("w_ols",), n_boot=100)
    assert set(table.edit) == {"probe", "random"} and table.slope.isna().all() and (table.probe_r2 < 0.1).all()
    assert main(["-q", "steer", str(ckpt), "--out", str(tmp_path / "s"), "--layers", "1", "3", "--prefixes", "3",
                 "--train-prompts", "64", "--test-prompts", "16"]) == 0
    s = json.loads((tmp_path / "s" / "steering_summary.json").read_text())["steering"]
    assert s["w_ols"]["probe"]["3"]["layer"] == [1, 3] and set(s) == {"w_ols", "xty"}
    assert (tmp_path / "s" / "steering.png").is_file()
    capsys.readouterr()
    assert main(["steer", str(ckpt), "--out", str(tmp_path / "bad"), "--layers", "9"]) == 2
    assert "--layers [9] out of range: this model's layer boundaries are 0..3" in capsys.readouterr().err
    assert main(["steer", str(ckpt), "--out", str(tmp_path / "bad"), "--prefixes", "40"]) == 2
    assert "--prefixes [40] out of range: use 1.." in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_steering_an_lstm_is_refused(tmp_path, capsys):
    from conftest import REPO

    assert main(["steer", str(REPO / "checkpoints" / "lstm-default"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "this checkpoint is a lstm model, with no attention heads or residual stream to intervene on" in err
    assert err.count("\n") == 1 and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_report_with_steering_has_the_section_and_the_key(ckpt, tmp_path):
    from conftest import TINY_REPORT

    out = tmp_path / "r"
    assert main(["-q", "report", str(ckpt), "--out", str(out), "--no-cache", *TINY_REPORT,
                 "--set", "steering.enabled=true", "--set", "steering.train_prompts=48",
                 "--set", "steering.test_prompts=12", "--set", "steering.layers=[1, 3]"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["steering"]["xty"]["random"]["3"]["layer"] == [1, 3]
    assert "Causal probes" in (out / "index.html").read_text()
