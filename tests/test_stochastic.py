"""Seed 000's constructions (planted SGD, uniform, prng), the learners that replay a model's
minibatches, and order sensitivity: each against a plain reference."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from probe.analysis.order import order_share, order_table, permuted_prompts
from probe.analysis.pipeline import ModelLens
from probe.cli import main
from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.io.planted_io import planted_config
from probe.learners import run_learner
from probe.learners.stochastic import minibatch_masks
from probe.models.planted import plant
from probe.models.xorshift import PRNG_BITS, xorshift32_step


def _prompts(d=4, n=12, b=40, seed=5):
    p = sample_prompts(TaskConfig(n_dims=d, n_points=n), b, generator=generator_for(seed))
    return p.xs.double(), p.ys.double()


def _sgd_reference(xs, ys, masks, eta, steps):
    """Plain loops of Hataya & Imaizumi 2024, eq. 9: weights (steps + 1, B, n, d) after each step, per prefix."""
    b, n, d = xs.shape
    out = np.zeros((steps + 1, b, n, d))
    for p in range(b):
        for t in range(n):
            w = np.zeros(d)
            for step in range(steps):
                batch = np.nonzero(masks[step, t])[0]
                if len(batch):
                    w = w - eta * sum((w @ xs[p, i] - ys[p, i]) * xs[p, i] for i in batch) / len(batch)
                out[step + 1, p, t] = w
    return out


def test_minibatch_masks_follow_assumption_1():
    m = minibatch_masks(5, 10, 3, seed=2)
    assert ((m == 0) | (m == 1)).all() and not m.triu().any()  # only seen examples
    np.testing.assert_array_equal(m.sum(-1)[0].numpy(), [0, 1, 2, 3, 3, 3, 3, 3, 3, 3])  # min(K, t) distinct
    assert torch.equal(minibatch_masks(2, 6, 3, seed=2), m[:2, :6, :6])  # prefix- and step-consistent
    assert not torch.equal(minibatch_masks(5, 10, 3, seed=3), m)


def test_sgd_and_adam_replay_explicit_masks_against_plain_loops():
    xs, ys = _prompts(n=8, b=6)
    masks = minibatch_masks(4, 8, 2, seed=1)
    res = run_learner("sgd", xs, ys, eta=[0.1], steps=range(5), batch_size=[2], masks_seed=1)
    ref = _sgd_reference(xs.numpy(), ys.numpy(), masks.numpy(), 0.1, 4)
    np.testing.assert_allclose(res.weights.numpy(), ref, atol=1e-12)
    explicit = run_learner("sgd", xs, ys, eta=[0.1], steps=range(5), masks=masks)
    assert torch.equal(explicit.weights, res.weights)
    adam = run_learner("adam", xs, ys, eta=[0.1], steps=[3], batch_size=[2], masks_seed=1).weights
    assert adam.shape == (1, 6, 8, 4) and torch.isfinite(adam).all()
    with pytest.raises(ConfigError, match=r"masks must have shape \(steps >= 4, n=8, n=8\)"):
        run_learner("sgd", xs, ys, steps=[4], masks=masks[:, :5, :5])
    with pytest.raises(ConfigError, match="masks must hold 0 or 1"):
        run_learner("sgd", xs, ys, steps=[2], masks=masks * 2)
    with pytest.raises(ConfigError, match=r"learner .sgd.: masks_seed must be an integer, got 1.5"):
        run_learner("sgd", xs, ys, steps=[2], masks_seed=1.5)


def test_planted_sgd_holds_l_steps_of_its_minibatch_sgd_at_layer_l():
    """Seed 000 Thm. 4: boundary l = l steps of eq. 9 on the masks it carries, exact for the square
    loss (eps = 0) while residuals stay within R; native forward and TransformerLens agree."""
    from probe.capture import RESID, capture

    xs, ys = _prompts()
    cfg = planted_config("sgd", 5, 4, 12, step_size=0.1, batch=3, seed=4).model
    model = plant(cfg).double()
    assert torch.equal(model.masks, minibatch_masks(5, 12, 3, 4).double())  # written with the model
    out = model.run(xs, ys)
    eta = float(torch.tensor(0.1, dtype=torch.float32))  # the weights are float32
    ref = _sgd_reference(xs.numpy(), ys.numpy(), model.masks.numpy(), eta, 5)
    for layer in range(6):
        pred = model.lens(out.resid[layer][:, 0::2]).numpy()
        np.testing.assert_allclose(pred, np.einsum("bnd,bnd->bn", ref[layer], xs.numpy()), atol=1e-9)
    replay = run_learner("sgd", xs, ys, eta=[eta], steps=range(6), batch_size=[3], masks_seed=4).preds
    np.testing.assert_allclose(model.lens(out.resid[5][:, 0::2]).numpy(), replay[5].numpy(), atol=1e-9)
    bridged = capture(plant(cfg), xs.float(), ys.float(), hooks=[RESID], batch_size=8)
    assert np.abs(bridged.pred - replay[5].numpy()).max() < 1e-4


def test_planted_adam_holds_step_k_at_layer_4k_within_eq_16s_bound():
    """Seed 000 Thm. 5: boundary 4k holds k Adam steps (eq. 12-15, eps inside the root) on the
    model's masks. The one approximation is psi(t) = 1/sqrt(t + eps), relative error delta =
    adam_psi_error(); eq. 16 then bounds the weights' error by delta k eta B_u sqrt(d) with
    |u_c| <= (1 - b1) / sqrt(1 - b2) (Kingma & Ba §2.1), so predictions by that times ||x||."""
    from probe.models.adam_psi import ADAM_BETAS, adam_psi_error, psi, psi_knots, relu_segments

    knots = psi_knots()
    t = torch.logspace(-12, 4, 5000, dtype=torch.float64)
    delta = adam_psi_error()
    assert delta < 1e-2
    assert ((relu_segments(knots, psi(knots), t) - psi(t)).abs() / psi(t)).max() <= delta * 1.01  # independent grid
    xs, ys = _prompts()
    cfg = planted_config("adam", 12, 4, 12, step_size=0.1, batch=3, seed=4).model
    model = plant(cfg).double()
    assert torch.equal(model.masks, minibatch_masks(3, 12, 3, 4).double())
    out = model.run(xs, ys)
    eta = float(torch.tensor(0.1, dtype=torch.float32))
    ref = run_learner("adam", xs, ys, eta=[eta], steps=range(4), batch_size=[3], masks_seed=4).preds
    b1, b2 = ADAM_BETAS
    norms = xs.norm(dim=-1)
    for layer in range(13):
        k = layer // 4
        pred = model.lens(out.resid[layer][:, 0::2])
        bound = delta * k * eta * (1 - b1) / (1 - b2) ** 0.5 * 4**0.5 * norms
        assert ((pred - ref[k]).abs() <= bound + 1e-9).all(), layer
    sgd = run_learner("sgd", xs, ys, eta=[eta], steps=[3], batch_size=[3], masks_seed=4).preds[0]
    assert (model.lens(out.resid[12][:, 0::2]) - sgd).abs().max() > 1e-2  # Adam's steps, not SGD's


def test_planted_sgd_gate_is_exact_within_its_bound_and_leaks_outside():
    """g = ReLU(r - R(1-b)) - ReLU(-r - R(1-b)) equals b r for |r| <= R; a bound below the residuals
    lets unselected examples into the step, so the construction leaves SGD."""
    xs, ys = _prompts()
    exact = plant(planted_config("sgd", 3, 4, 12, step_size=0.1, seed=4).model).double()
    loose = plant(planted_config("sgd", 3, 4, 12, step_size=0.1, seed=4).model).double()
    with torch.no_grad():
        loose.mlp_in[:, :, loose.layout["one"]] /= 1e4  # R = 0.1
        loose.mlp_in[:, :, loose.layout["b"]] /= 1e4
    a, b = exact(xs, ys), loose(xs, ys)
    assert (a - b).abs().max() > 1e-2


@pytest.mark.slow
def test_uniform_block_is_the_empirical_cdf_of_the_held_out_example_and_tends_to_uniform():
    xs, ys = _prompts(n=30, b=50)
    eps = 0.05
    model = plant(planted_config("uniform", 1, 4, 30, eps=eps).model).double()
    u = model(xs, ys)
    z = xs[..., 0].numpy()
    a = 1 / (4 * eps)
    for t in (2, 7, 29):  # run t: the CDF of z_1..z_{t-1} at z_t (eq. 17's ramps)
        s = a * (z[:, t - 1 : t] - z[:, : t - 1])
        ref = (np.clip(s + 0.5, 0, None) - np.clip(s - 0.5, 0, None)).mean(1)
        np.testing.assert_allclose(u[:, t].numpy(), ref, atol=1e-12)
    assert (u[:, :2] == 0).all()  # no keys yet
    # eq. 8: the KS distance of u over prompts to U(0, 1) shrinks with N, within eps + O(1/sqrt N)
    distances = []
    for n in (4, 16, 64):
        xs, ys = _prompts(n=n + 1, b=3000, seed=n)
        model = plant(planted_config("uniform", 1, 4, n + 1, eps=0.01).model).double()
        u = torch.cat([model(x, y)[:, n] for x, y in zip(xs.split(100), ys.split(100))])  # bounded memory
        d = stats.kstest(u.numpy(), "uniform").statistic
        assert d <= 0.01 + 1.5 / np.sqrt(n)
        distances.append(d)
    assert distances[0] > distances[1] > distances[2]


@pytest.mark.parametrize("seed", [1, 123456789, 0xDEADBEEF])
def test_prng_block_equals_xorshift32_bit_for_bit(seed):
    from probe.capture import RESID, capture

    cfg = planted_config("prng", 1, PRNG_BITS, 3, outputs=5).model
    model = plant(cfg)
    xs = torch.zeros(1, 3, PRNG_BITS)
    xs[0, 0] = torch.tensor([(seed >> i) & 1 for i in range(PRNG_BITS)], dtype=torch.float32)
    reference, state = [], seed
    for _ in range(5):
        state = xorshift32_step(state)
        reference.append([(state >> i) & 1 for i in range(PRNG_BITS)])
    o = model.layout["o"]
    for backend in ("native", "hooked"):
        resid = capture(model, xs, torch.zeros(1, 3), hooks=[RESID], backend=backend).acts[RESID]
        bits = resid[-1, 0, 2, o].reshape(5, PRNG_BITS)  # the query of run 1 (x token 1)
        np.testing.assert_array_equal(bits, np.array(reference, dtype=np.float32))
    first = sum(b * 2.0 ** -(i + 1) for i, b in enumerate(reference[0][:24]))
    assert abs(float(model(xs, torch.zeros(1, 3))[0, 1]) - first) < 1e-7


def test_order_share_against_numpy_and_the_order_free_learners():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(3, 5, 40))  # (layers, P, B)
    value, lo, hi = order_share(f, n_boot=200)
    np.testing.assert_allclose(value.numpy(), f.var(1).mean(-1) / f.mean(1).var(-1), rtol=1e-12)
    assert (lo <= value).all() and (value <= hi).all()
    xs, ys = _prompts(n=10, b=30)
    xp, yp = permuted_prompts(xs, ys, 6, 4, torch.Generator().manual_seed(0))
    assert torch.equal(yp[:, :, 6], ys[:, 6].expand(4, -1))  # the query's label kept
    assert torch.equal(xp[0], xs[:, :7]) and torch.equal(xp[:, :, 6], xs[:, 6].expand(4, -1, -1))
    assert torch.equal(xp[2, :, :6].sort(1).values, xs[:, :6].sort(1).values)  # the same examples
    learners = {
        "least_squares": {"learner": "least_squares"},
        "gd": {"learner": "gd", "grid": {"steps": [8]}},
        "newton": {"learner": "newton", "grid": {"iterations": [4]}},
        "ridge": {"learner": "ridge", "grid": {"lam": [0.1]}},
        "ogd": {"learner": "ogd"},
        "sgd": {"learner": "sgd", "grid": {"steps": [8], "eta": [0.05], "batch_size": [2], "masks_seed": 0}},
    }
    gd_model = plant(planted_config("gd", 3, 4, 10).model)
    table = order_table(gd_model, ModelLens(gd_model), xs, ys, [6, 9], 6, learners, n_boot=100)
    by = table.set_index(["predictor", "prefix"]).sensitivity
    for name in ("least_squares", "gd", "newton", "ridge"):
        assert by[name].max() < 1e-20, name
    assert by["ogd"].min() > 1e-3 and by["sgd"].min() > 1e-3
    model_rows = table[(table.predictor == "model") & (table.layer > 0)]
    assert model_rows.sensitivity.max() < 1e-9  # the planted GD model: order-free to float round-off


def test_planted_stochastic_models_are_order_sensitive():
    xs, ys = _prompts(n=10, b=40)
    sgd = plant(planted_config("sgd", 3, 4, 10, batch=2).model)
    uniform = plant(planted_config("uniform", 1, 4, 10).model)
    for model in (sgd, uniform):
        table = order_table(model, ModelLens(model), xs, ys, [8], 6, {}, n_boot=100)
        assert table.sensitivity.iloc[-1] > 1e-2


def test_order_command_and_bad_input(tmp_path, capsys):
    assert main(["planted", "--algorithm", "sgd", "--layers", "3", "--out", str(tmp_path / "sgd")]) == 0
    assert main(["-q", "order", str(tmp_path / "sgd"), "--out", str(tmp_path / "o"), "--prompts", "32",
                 "--permutations", "3", "--prefixes", "5", "9"]) == 0
    s = json.loads((tmp_path / "o" / "order_summary.json").read_text())["order_sensitivity"]
    assert s["prefixes"] == [5, 9] and s["layer"] == [0, 1, 2, 3]
    assert s["learners"]["least_squares"]["9"]["sensitivity"] < 1e-20
    assert s["learners"]["ogd"]["9"]["sensitivity"] > 1e-3
    assert (tmp_path / "o" / "order.png").is_file()
    capsys.readouterr()
    assert main(["order", str(tmp_path / "sgd"), "--out", str(tmp_path / "o2"), "--prefixes", "16"]) == 2
    assert "order.prefixes [16] leave no query: prompts have 16 points" in capsys.readouterr().err
    for args, message in [
        (["--algorithm", "sgd", "--layers", "3", "--batch", "0"], "--batch must be an integer >= 1, got 0"),
        (["--algorithm", "uniform", "--layers", "1", "--eps", "0"], "--eps must be a number > 0"),
        (["--algorithm", "uniform", "--layers", "2"], "is one block (Hataya & Imaizumi 2024, Thm. 2); use --layers 1"),
        (["--algorithm", "prng", "--layers", "1"], "use --dims 32"),
        (["--algorithm", "adam", "--layers", "6"], "4 layers per step; use --layers 4, 8, 12"),
        (["--algorithm", "sgd", "--layers", "3", "--step-size", "0.9"], "--step-size 0.9 is unstable for d=4"),
    ]:
        assert main(["planted", *args, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_report_on_planted_sgd_recovers_k_equals_l_with_sgd_and_measures_order(tmp_path):
    from test_planted import SMALL

    assert main(["planted", "--algorithm", "sgd", "--layers", "4", "--out", str(tmp_path / "sgd")]) == 0
    assert main(["-q", "report", str(tmp_path / "sgd"), "--out", str(tmp_path / "r"), *SMALL,
                 "--set", "interventions.enabled=false", "--set", "order.prompts=32"]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    for metric in ("sime", "simw"):
        block = s["best_match"]["sgd_replay"][metric]
        assert block["k"] == block["layer"] == list(range(5)), metric
        assert min(block["similarity"][1:]) > 0.9999, metric
    assert "sgd_other" in s["best_match"] and s["order_sensitivity"]["model"]["15"]["sensitivity"][-1] > 1e-3
    html = (tmp_path / "r" / "index.html").read_text()
    assert "minibatch SGD with seeded masks (Hataya &amp; Imaizumi 2024, Thm. 4), 1 layer per step" in html
    assert "the SimE best matches of SGD (the model&#x27;s minibatches) recover this map" in html or \
        "the SimE best matches of SGD (the model&#39;s minibatches) recover this map" in html
    assert "Order sensitivity" in html


def test_report_order_stage_reads_the_readout_stages_read_outs(ckpt):
    """The order stage needs the readout stage: asked for alone it brings it and reads its fitted
    read-outs (exactly `fit_readouts`' own), and gives the table it gives beside the layers stage."""
    from probe.analysis.pipeline import LayerSettings, fit_readouts
    from probe.analysis.readout import LayerReadouts
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import adapt_recipe, resolve_recipe

    sizes = {"train": 48, "val": 24, "test": 48, "induced": 12}
    recipe = resolve_recipe("quick", [{"prompts": sizes, "order": {"prompts": 16, "permutations": 3}}])
    loaded = load_checkpoint(ckpt)
    alone = run_stages(loaded, recipe, "cpu", StageCache(None), False, only={"order"})
    assert list(alone.timings) == ["readout", "order"]
    fitted, _, _ = fit_readouts(loaded.model, loaded.config.task, LayerSettings.from_recipe(adapt_recipe(recipe, loaded.config)))
    np.testing.assert_array_equal(LayerReadouts.from_json(alone.data["readouts"]).coef, fitted.coef)
    beside = run_stages(loaded, recipe, "cpu", StageCache(None), False, only={"layers", "order"})
    pd.testing.assert_frame_equal(beside.tables["order"], alone.tables["order"], rtol=0, atol=0)


def test_order_learners_in_blocks_equal_one_batch(monkeypatch):
    """order_table runs the learners a block of sequences at a time (the paper-scale memory bound);
    each sequence's prediction is its own, so blocks of one sequence give the one-batch table (to
    round-off: the order-free learners' shares are 0 +- 1e-31 either way)."""
    from probe.analysis import order

    xs, ys = _prompts(n=10, b=12)
    learners = {
        "gd": {"learner": "gd", "grid": {"steps": [8]}},
        "ogd": {"learner": "ogd"},
        "sgd": {"learner": "sgd", "grid": {"steps": [8], "eta": [0.05], "batch_size": [2], "masks_seed": 0}},
    }
    model = plant(planted_config("gd", 3, 4, 10).model)
    whole = order_table(model, ModelLens(model), xs, ys, [6, 9], 4, learners, n_boot=50)
    monkeypatch.setattr(order, "LEARNER_BLOCK_BYTES", 1)
    blocks = order_table(model, ModelLens(model), xs, ys, [6, 9], 4, learners, n_boot=50)
    pd.testing.assert_frame_equal(whole, blocks, check_exact=False, rtol=1e-9, atol=1e-20)
