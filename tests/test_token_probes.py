"""Per-token probes for the state a learner keeps (probe/analysis/token_probes.py):
targets against numpy, the planted Newton-ReLU model holding M_k x exactly where its construction
writes it, the planted GD model holding no more of S x than its raw tokens, and the command."""

import numpy as np
import pytest
import torch

from probe.analysis.token_probes import (
    TokenTarget,
    expand_targets,
    fit_token_probes,
    token_moments,
    token_probe_study,
    token_targets,
)
from probe.cli import main
from probe.core.errors import ConfigError
from probe.io.planted_io import planted_config
from probe.models.planted import plant


def _numpy_targets(xs, token, alpha, k):
    """S the token sees (x: the examples before it, y: through it), normalised; S x, S^3 x, M_k x."""
    b, n, d = xs.shape
    out = {"sx": np.zeros((b, n, d)), "s3x": np.zeros((b, n, d)), "newton": np.zeros((b, n, d))}
    for p in range(b):
        for j in range(n):
            seen = xs[p, : j + (token == "y")]
            s = seen.T @ seen / max(len(seen), 1)
            m = alpha * s
            for _ in range(k):
                m = 2 * m - m @ s @ m
            out["sx"][p, j], out["s3x"][p, j] = s @ xs[p, j], s @ s @ s @ xs[p, j]
            out["newton"][p, j] = m @ xs[p, j]
    return out


@pytest.mark.parametrize("token", ["x", "y"])
def test_targets_match_numpy(token):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    expected = _numpy_targets(xs.numpy(), token, 0.05, 3)
    np.testing.assert_allclose(token_targets(xs, TokenTarget("sx"), token).numpy(), expected["sx"], atol=1e-12)
    np.testing.assert_allclose(token_targets(xs, TokenTarget("s3x"), token).numpy(), expected["s3x"], atol=1e-12)
    newton = token_targets(xs, TokenTarget("newton_mx", 3, 0.05), token).numpy()
    np.testing.assert_allclose(newton, expected["newton"], atol=1e-10)
    assert token_moments(xs, token).shape == (3, 6, 4, 4)


def test_the_spectral_alpha_converges_to_the_pseudo_inverse():
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(2, 9, 3, generator=g, dtype=torch.float64)
    s = token_moments(xs, "y")
    got = token_targets(xs, TokenTarget("newton_mx", 30, "spectral"), "y")
    expected = (torch.linalg.pinv(s, hermitian=True) @ xs.unsqueeze(-1)).squeeze(-1)
    np.testing.assert_allclose(got[:, 3:].numpy(), expected[:, 3:].numpy(), atol=1e-8)  # full rank from t >= d


def test_a_linearly_held_target_is_read_exactly_and_a_missing_one_not():
    """States that hold S x at example tokens (layer 1) and only x (layer 0): R^2 1 against ~0.5."""
    g = torch.Generator().manual_seed(2)

    def streams(n_prompts):
        xs = torch.randn(n_prompts, 8, 3, generator=g, dtype=torch.float64)
        states = torch.zeros(2, 16, n_prompts, 6, dtype=torch.float64)
        states[:, 0::2, :, :3] = xs.transpose(0, 1)
        states[1, 0::2, :, 3:] = token_targets(xs, TokenTarget("sx"), "x").transpose(0, 1)
        return states, xs

    (tr, xtr), (te, xte) = streams(300), streams(200)
    table = fit_token_probes(tr, xtr, te, xte, [TokenTarget("sx")], tokens=["x"], n_boot=200).set_index("layer")
    assert table.loc[1, "r2"] > 0.999 and table.loc[0, "r2"] < 0.9
    assert table.loc[1, "gain_low"] > 0 and abs(table.loc[0, "gain"]) < 0.01  # layer 0 is x: the floor


def test_probes_fitted_a_layer_at_a_time_equal_the_whole_batch(monkeypatch):
    """The features are built and factored a block of layers at a time (memory); each probe's numbers
    are its own, so one layer per block gives the numbers of every layer in one block."""
    from probe.analysis import ridge

    g = torch.Generator().manual_seed(3)
    xs, xt = (torch.randn(n, 7, 3, generator=g, dtype=torch.float64) for n in (40, 30))
    ys, yt = xs.sum(-1), xt.sum(-1)
    states, test = (torch.randn(4, 14, n, 5, generator=g, dtype=torch.float64) for n in (40, 30))
    targets = [TokenTarget("sx"), TokenTarget("w_ols")]

    def table():
        return fit_token_probes(states, xs, test, xt, targets, ys, yt, tokens=["x", "y"], n_boot=50)

    whole = table()
    monkeypatch.setattr(ridge, "LOO_BLOCK_BYTES", 1)  # loo_block: one probe per block
    assert ridge.loo_block(40 * 6, 5, 5, 3) == 1
    one_layer = table()
    assert len(whole) == 4 * 2 * 2
    np.testing.assert_array_equal(
        one_layer.select_dtypes("number").to_numpy(), whole.select_dtypes("number").to_numpy()
    )


@pytest.mark.slow
def test_the_planted_newton_relu_model_holds_m_k_x_where_its_construction_writes_it():
    cfg = planted_config("newton-relu", 6, 4, 12)
    model, alpha = plant(cfg.model), cfg.model.planted_scale
    targets = expand_targets(["newton_mx"], range(6), alpha)
    table = token_probe_study(model, cfg.task, targets, 256, 128, n_boot=100)
    for token in ("x", "y"):
        rows = table[table.token == token]
        best = rows.loc[rows.groupby("layer").r2.idxmax()].set_index("layer")
        for layer in range(1, 7):  # boundary l holds T^(l-1) x = M_(l-1) x (newton_relu.py)
            assert best.loc[layer, "iterations"] == layer - 1 and best.loc[layer, "r2"] > 0.999, (token, layer)
        assert best.loc[0, "r2"] < 0.95  # the raw tokens hold x only


def test_the_planted_gd_model_holds_no_more_of_s_x_than_its_raw_tokens():
    cfg = planted_config("gd", 6, 4, 12, step_size=1 / 9)
    table = token_probe_study(
        plant(cfg.model), cfg.task, expand_targets(["sx", "s3x"], [], "spectral"), 256, 128, n_boot=100
    )
    assert (table.gain_low <= 0).all() and (table.gain < 0.02).all()  # no layer above the example's own x
    assert (table[table.target == "s3x"].r2 < 0.1).all()


def test_targets_and_the_command_refuse_bad_input(tmp_path, capsys):
    with pytest.raises(ConfigError, match="unknown token target 'sxx'; known: sx, s3x, newton_mx"):
        expand_targets(["sxx"], [0], "spectral")
    code = main(["-q", "token-probes", "--alpha", "-1", "--out", str(tmp_path / "o")])
    message = "token_probes.alpha must be auto, spectral or a positive number, got '-1'"
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # Newton's M_k is iterated k times: 10^12 iterations ran on, unchecked; now refused before any work
    code = main(["-q", "token-probes", "--iterations", "2", str(10**12), "--out", str(tmp_path / "o")])
    assert code == 2 and "token_probes.iterations = 1000000000000 on gpt2-default makes this need about" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_command_writes_its_table_figure_and_record(tmp_path):
    out = tmp_path / "tp"
    args = ["-q", "token-probes", "checkpoints/planted/gd", "--targets", "sx", "--prompts", "64"]
    assert main([*args, "--test-prompts", "32", "--set", "similarity.bootstrap=50", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"token_probes.csv", "token_probes.png", "token_probes_summary.json"}


@pytest.mark.slow
def test_the_planted_newton_model_writes_m_k_x_into_the_query_and_clears_it():
    """newton.py: layer (A) writes z = M_k x_q into the query token, layer (B) clears it; so boundary
    2k + 2 holds M_k x at the x (query) token exactly, and the odd boundaries hold no more than x."""
    from probe.io.formats import load_checkpoint

    ckpt = load_checkpoint("checkpoints/planted/newton")
    targets = expand_targets(["newton_mx"], range(5), ckpt.config.model.planted_scale)
    table = token_probe_study(ckpt.model, ckpt.config.task, targets, 256, 128, tokens=["x"], n_boot=100)
    best = table.loc[table.groupby("layer").r2.idxmax()].set_index("layer")
    for k in range(5):
        assert best.loc[2 * k + 2, "iterations"] == k and best.loc[2 * k + 2, "r2"] > 0.999
    odd = table[table.layer.isin([3, 5, 7, 9])]
    assert (odd.gain < 0.005).all()


@pytest.mark.parametrize("token", ["x", "y"])
def test_weight_iterates_match_the_learners(token):
    """w_gd and w_newton at a token are the gd and newton learners' weights after the examples it
    sees (x token of example j: the first j; y token: the first j + 1), and w_ols least squares'."""
    from probe.learners import run_learner

    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(4, 9, 3, generator=g, dtype=torch.float64), torch.randn(4, 9, generator=g, dtype=torch.float64)
    shift = 0 if token == "x" else 1  # learner weights index t = after t examples
    at = lambda w: torch.stack([w[:, j + shift] for j in range(8)], 1)
    gd = run_learner("gd", xs, ys, steps=(5,), eta=(0.1,)).weights[0]
    newton = run_learner("newton", xs, ys, iterations=(3,), alpha=("spectral",)).weights[0]
    ols = run_learner("least_squares", xs, ys).weights[0]
    for target, learner in (
        (TokenTarget("w_gd", 5, 0.1), gd),
        (TokenTarget("w_newton", 3), newton),
        (TokenTarget("w_ols"), ols),
    ):
        got = token_targets(xs, target, token, ys)[:, :8]
        np.testing.assert_allclose(got[:, 1:].numpy(), at(learner)[:, 1:].numpy(), atol=1e-8, err_msg=target.name)


def test_column_targets_are_the_matrices_columns_in_the_x_tokens_run():
    """Column token j of example t's run holds column j of S/t, (S/t)^3, M_k over the examples before
    t (what example t's x token sees); weight targets repeat at every column token."""
    g = torch.Generator().manual_seed(4)
    xs, ys = torch.randn(3, 6, 4, generator=g, dtype=torch.float64), torch.randn(3, 6, generator=g, dtype=torch.float64)
    s = token_moments(xs, "x")
    m = 0.05 * s
    for _ in range(3):
        m = 2 * m - m @ s @ m
    for target, matrix in (
        (TokenTarget("sx"), s),
        (TokenTarget("s3x"), s @ s @ s),
        (TokenTarget("newton_mx", 3, 0.05), m),
    ):
        got = token_targets(xs, target, "column")  # (B, n, j, d): column j at [..., j, :]
        np.testing.assert_allclose(got.numpy(), matrix.transpose(-1, -2).numpy(), atol=1e-10, err_msg=target.name)
    w = token_targets(xs, TokenTarget("w_ols"), "x", ys)
    np.testing.assert_allclose(token_targets(xs, TokenTarget("w_ols"), "column", ys)[:, :, 2].numpy(), w.numpy())


@pytest.mark.slow
def test_the_planted_newton_model_holds_the_columns_of_m_k_in_its_column_tokens():
    """newton.py writes column j of M_0 = alpha S/t into column token j at layer 1 and updates it every
    second layer: boundaries 2k + 1 and 2k + 2 hold M_k exactly, layer 0 only the token's e_j."""
    from probe.io.formats import load_checkpoint

    ckpt = load_checkpoint("checkpoints/planted/newton")
    targets = expand_targets(["newton_mx"], range(4), ckpt.config.model.planted_scale)
    table = token_probe_study(ckpt.model, ckpt.config.task, targets, 128, 64, tokens=["column"], n_boot=100)
    best = table.loc[table.groupby("layer").r2.idxmax()].set_index("layer")
    for k in range(4):
        for layer in (2 * k + 1, 2 * k + 2):
            assert best.loc[layer, "iterations"] == k and best.loc[layer, "r2"] > 0.9999, layer
            assert best.loc[layer, "gain_low"] > 0.3
    assert abs(table[table.layer == 0].gain).max() < 1e-3  # the raw column token is its e_j: the floor


def test_column_tokens_are_probed_only_where_a_model_keeps_them(tmp_path, capsys):
    from probe.analysis.token_probes import probed_tokens
    from probe.io.formats import load_checkpoint

    gd, newton = (load_checkpoint(f"checkpoints/planted/{name}").model for name in ("gd", "newton"))
    assert probed_tokens(gd, ("x", "y", "column")) == ["x", "y"]
    assert probed_tokens(newton, ("x", "column")) == ["x", "column"]
    with pytest.raises(ConfigError, match="keeps no column tokens .* probe its x and y tokens"):
        token_probe_study(gd, planted_config("gd", 6, 4, 12).task, [TokenTarget("sx")], 16, 8, tokens=["column"])
    code = main(["-q", "token-probes", "checkpoints/planted/gd", "--tokens", "column", "--out", str(tmp_path / "o")])
    assert code == 2 and "keeps no column tokens" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_streams_made_a_block_of_layers_at_a_time_equal_the_captured_ones(monkeypatch):
    """LayerStreams (a GPT-2's stream carried through one block after another, a chunk of prompts
    at a time) gives by_position_streams' float64 streams, and the token probes on it the numbers
    of the probes on the whole capture (within 1e-10: the same float64 operations, batched differently)."""
    from conftest import build_cfg

    from probe.capture.streams import LayerStreams, by_position_streams
    from probe.data.config import TaskConfig
    from probe.models import build_model

    cfg = build_cfg(d=3, points=8, width=16, layers=3)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(20, 8, 3, generator=g)
    ys = xs.sum(-1)
    whole = by_position_streams(model, xs, ys, dtype=torch.float64)
    streamed = LayerStreams(model, xs, ys, chunk=7)
    blocks = [streamed[0:2], streamed[2:4]]
    assert streamed[2:4] is blocks[1]  # a second reader of the last block gets it again
    torch.testing.assert_close(torch.cat(blocks), whole, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="read in order"):
        streamed[0:1]

    task = TaskConfig(n_dims=3, n_points=8)
    targets = [TokenTarget("sx"), TokenTarget("w_ols")]
    by_blocks = token_probe_study(model, task, targets, n_train=48, n_test=32, n_boot=50)
    monkeypatch.setattr(type(model), "key_value_cache", False)  # the whole capture instead
    captured = token_probe_study(model, task, targets, n_train=48, n_test=32, n_boot=50)
    assert by_blocks[["token", "target", "layer"]].equals(captured[["token", "target", "layer"]])
    np.testing.assert_allclose(
        by_blocks.select_dtypes("number").to_numpy(), captured.select_dtypes("number").to_numpy(), rtol=0, atol=1e-10
    )


def test_the_token_probes_fit_on_the_prompts_device(monkeypatch):
    """On a GPU the token probes' features, targets and ridge fits stay on the device the prompts and
    streams are on (the meta device raises on any tensor made on the host and mixed in), every kind
    of target included. The ridge head's one host read (did every Cholesky factorisation succeed)
    cannot run on meta tensors, so here the head always takes the Cholesky branch."""
    from probe.analysis import ridge
    from probe.analysis.token_probes import _token_kinds, fit_token_heads

    def cholesky_head(gram, fc, yc, penalty):
        gram.diagonal(dim1=1, dim2=2).add_(penalty.unsqueeze(-1))
        return torch.cholesky_solve(fc.transpose(1, 2) @ yc, torch.linalg.cholesky_ex(gram)[0])

    monkeypatch.setattr(ridge, "_head", cholesky_head)

    xs, ys = torch.empty(40, 7, 3, device="meta", dtype=torch.float64), torch.empty(40, 7, device="meta")
    states = torch.empty(4, 14, 40, 5, device="meta", dtype=torch.float64)
    targets = expand_targets(["sx", "s3x", "newton_mx", "w_ols", "w_gd", "w_newton"], (2,), "spectral", (3,))
    columns = torch.empty(4, 40, 7, 3, 5, device="meta", dtype=torch.float64)  # a planted Newton model's
    tokens = ["x", "y", "column"]
    heads = fit_token_heads(states, xs, targets, ys.double(), tokens=tokens, columns=columns)
    tensors = [t for kind in heads.values() for pair in kind.values() for h in pair for t in vars(h).values()]
    assert len(tensors) == 3 * len(targets) * 2 * 4 and {t.device.type for t in tensors} == {"meta"}
    kinds = _token_kinds(tokens, states, columns, xs, ys.double(), targets)
    features = [feats.block(slice(0, 2)) for (feats, _), _ in kinds]
    made = [t for (_, own), y in kinds for t in (own, *y.values())] + features
    assert {t.device.type for t in made} == {"meta"}
