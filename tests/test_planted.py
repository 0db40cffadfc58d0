"""Planted transformers: the analyses must recover the algorithm their weights implement."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from probe.cli import main
from probe.core.errors import ConfigError
from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.io.formats import load_checkpoint
from probe.io.planted_io import planted_config
from probe.learners import run_learner
from probe.models.constructions import CONSTRUCTIONS
from probe.models.planted import plant

SMALL = ["--set", "prompts.curve=64", "--set", "prompts.train=64", "--set", "prompts.val=32", "--set", "prompts.test=128",
         "--set", "prompts.induced=32", "--set", "probes.enabled=false", "--set", "forgetting.prompts=16",
         "--set", "similarity.bootstrap=100", "--set", "interventions.prompts=16", "--set", "interventions.patch_prompts=8"]


def _prompts(d=4, n=12, b=40):
    p = sample_prompts(TaskConfig(n_dims=d, n_points=n), b, generator=generator_for(5))
    return p.xs.double(), p.ys.double()


def test_planted_layers_equal_their_learner_exactly():
    xs, ys = _prompts()
    gd = plant(planted_config("gd", 5, 4, 12, step_size=0.1).model).double()
    out = gd.run(xs, ys)
    ref = run_learner("gd", xs, ys, eta=(0.1,), steps=range(6)).preds
    for layer in range(6):
        np.testing.assert_allclose(gd.lens(out.resid[layer][:, 0::2]).numpy(), ref[layer].numpy(), atol=1e-6)
    cfg = planted_config("newton", 9, 4, 12).model
    newton = plant(cfg).double()
    out = newton.run(xs, ys)
    ref = run_learner("newton", xs, ys, iterations=range(4), alpha=(cfg.planted_scale,)).preds
    for layer in range(3, 10):
        np.testing.assert_allclose(newton.lens(out.resid[layer][:, 0::2]).numpy(), ref[CONSTRUCTIONS.get("newton").layer_map(layer)].numpy(),
                                   atol=1e-6)
    # causality: changing later examples never changes earlier predictions
    xs2 = xs.clone()
    xs2[:, 7:] += 1
    np.testing.assert_allclose(newton(xs2, ys)[:, :7].numpy(), newton(xs, ys)[:, :7].numpy())


def test_relu_attention_newton_runs_one_iteration_per_layer():
    """Seed 003 Thm. 1's construction: boundary l >= 2 holds Newton iteration l - 2 exactly, and the
    attention weights it uses are ReLU scores (never negative)."""
    xs, ys = _prompts()
    cfg = planted_config("newton-relu", 8, 4, 12).model
    model = plant(cfg).double()
    out = model.run(xs, ys)
    ref = run_learner("newton", xs, ys, iterations=range(7), alpha=(cfg.planted_scale,)).preds
    for layer in range(9):
        k = CONSTRUCTIONS.get("newton-relu").layer_map(layer)
        pred = model.lens(out.resid[layer][:, 0::2]).numpy()
        np.testing.assert_allclose(pred, 0.0 if k is None else ref[k].numpy(), atol=1e-7, err_msg=f"layer {layer}")
    xs2, ys2 = xs.clone(), ys.clone()
    xs2[:, 5:] += 1
    ys2[:, 5:] -= 2
    np.testing.assert_allclose(model(xs2, ys2)[:, :5].numpy(), model(xs, ys)[:, :5].numpy())  # causal
    h = torch.randn(3, 12, 14, model.layout.width, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    q, k = h @ model.q[1, 0].T, h @ model.k[1, 0].T
    assert (model.scores(q, k) >= 0).all() and (model.scores(q, k) == 0).any()


def test_a_relu_head_pair_with_opposite_values_computes_the_product_that_equal_values_do_not():
    """Eq. 20/27 of Fu et al. 2024 take V_1 = V_2; ReLU(a) + ReLU(-a) = |a|, so the pair needs V_2 = -V_1."""
    a = torch.linspace(-2, 2, 9)
    assert torch.equal(a.relu() - (-a).relu(), a)
    assert torch.equal(a.relu() + (-a).relu(), a.abs())


@pytest.mark.slow
def test_report_on_planted_gd_recovers_steps(tmp_path):
    assert main(["planted", "--algorithm", "gd", "--layers", "6", "--out", str(tmp_path / "gd")]) == 0
    assert main(["-q", "report", str(tmp_path / "gd"), "--out", str(tmp_path / "r"), *SMALL]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    gd = s["best_match"]["gd"]["sime"]
    assert gd["k"] == gd["layer"] == list(range(7))
    assert min(gd["similarity"][1:]) > 0.999
    newton = s["best_match"]["newton"]["sime"]
    assert max(newton["similarity"][1:]) < min(gd["similarity"][1:])
    assert max(s["span"]["residual"]) < 1e-5  # GD iterates lie in the span of the examples
    assert s["trend"]["gd"]["verdict"].startswith("gd_log: linear, about 1.0 [1.0, 1.0] steps per layer")
    # the causal check confirms the planted map end to end: patched predictions move exactly as GD says
    check = s["interventions"]["iteration"]["gd_log"]
    # boundary 0 predicts 0 (GD's step 0): left out of every map alike
    assert check["skipped"] == [0] and check["k"] == list(range(1, 6)) and check["deviation"] < 1e-4
    assert check["testable"] and check["confirmed"]
    assert {r["verdict"] for r in check["map_alternatives"]} == {"claimed map closer"}  # shifted by 2 included


@pytest.mark.slow
def test_report_on_planted_newton_recovers_the_layer_map(tmp_path):
    assert main(["planted", "--algorithm", "newton", "--layers", "11", "--out", str(tmp_path / "nt")]) == 0
    assert main(["-q", "report", str(tmp_path / "nt"), "--out", str(tmp_path / "r"), *SMALL]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    for metric in ("sime", "simw"):
        block = s["best_match"]["newton"][metric]
        assert block["k"][3:] == [CONSTRUCTIONS.get("newton").layer_map(l) for l in range(3, 12)], metric
    assert min(s["best_match"]["newton"]["simw"]["similarity"][3:]) > 0.999
    methods = (tmp_path / "r" / "index.html").read_text()
    assert "(fixed alpha)" in methods and "('spectral')" not in methods.split("Iterative Newton: M_(k+1)")[1][:80]
    assert max(s["span"]["residual"]) < 1e-5
    checks = s["interventions"]["iteration"]
    newton = checks["newton"]  # M_k lives in the column tokens: the written-state check tests it
    assert newton["testable"] and newton["deviation"] < 1e-5 and "state written" in newton["picture"]
    verdicts = {r["alternative"]: r["verdict"] for r in newton["map_alternatives"]}
    assert verdicts["shifted -2"] == verdicts["shifted +2"] == verdicts["constant"] == "claimed map closer"
    assert not checks["gd_log"]["testable"]  # GD's picture cannot test here (GD's map on this small model: 0 steps)
    paired = {(v["metric"], v["b"]): v for v in s["verdicts"] if v["a"] == "newton"}
    for metric in ("sime", "simw"):  # a model that is Newton: Newton closer than tuned GD, interval above 0
        gd = paired[(metric, "gd")]
        assert gd["verdict"] == "newton closer" and gd["ci_low"] > 0, metric
        assert gd["difference"] <= gd["resolution"] + 1e-9  # a perfect Newton model reaches at most the resolution


@pytest.mark.slow
def test_report_on_relu_attention_newton_recovers_one_iteration_per_layer(tmp_path):
    # 10 layers: the first iterates predict ~0 (a small fixed alpha), so the trend, which leaves out
    # layers no better than the zero predictor, needs the later ones
    assert main(["planted", "--algorithm", "newton-relu", "--layers", "10", "--out", str(tmp_path / "nr")]) == 0
    assert main(["-q", "report", str(tmp_path / "nr"), "--out", str(tmp_path / "r"), *SMALL]) == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    for metric in ("sime", "simw"):
        assert s["best_match"]["newton"][metric]["k"][2:] == list(range(9)), metric
    assert min(s["best_match"]["newton"]["simw"]["similarity"][2:]) > 0.999
    assert s["trend"]["newton"]["verdict"].startswith("newton: linear, about 1.0 [1.0, 1.0] iterations per layer")
    assert s["trend"]["newton"]["layers"][0] > 3  # the degenerate early iterates are left out
    # the spectral filter is scale-free: the preconditioned (Newton) class from the first iterate on
    assert s["spectral"]["verdict"][3:] == ["precond_gd"] * 8
    html = (tmp_path / "r" / "index.html").read_text()
    assert ("Iterative Newton with ReLU attention (Fu et al. 2024, Thm. 1), 1 layer per iteration, first prediction at layer 2 "
            "(the linear-attention construction needs 2); the SimE best matches recover this map") in html


def test_planted_bad_input(tmp_path, capsys):
    assert main(["planted", "--algorithm", "newtn", "--layers", "4", "--out", str(tmp_path / "x")]) == 2
    assert "Unknown planted algorithm 'newtn'. Did you mean: newton?" in capsys.readouterr().err
    assert main(["planted", "--algorithm", "gd", "--layers", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--layers must be an integer in 1..10000" in capsys.readouterr().err
    assert main(["planted", "--algorithm", "gd", "--layers", "3", "--step-size", "0.5", "--out", str(tmp_path / "x")]) == 2
    assert "--step-size 0.5 is unstable for d=4" in capsys.readouterr().err
    assert main(["planted", "--algorithm", "newton-relu", "--layers", "1", "--out", str(tmp_path / "x")]) == 2
    assert "needs at least 2 layers (initialisation, then 1 per iteration)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", ["gd", "newton"])
def test_shipped_planted_checkpoints_load(name):
    from conftest import REPO

    ckpt = load_checkpoint(REPO / "checkpoints" / "planted" / name)
    assert ckpt.config.model.planted == name and ckpt.format == "icl-probe"


@pytest.mark.parametrize("algorithm,layers", [("gd", 4), ("newton", 7), ("newton-relu", 4), ("sgd", 3)])
def test_planted_hook_points_give_the_plain_forward_in_their_per_run_layout(algorithm, layers):
    """With a function on every hook point, each layer runs site by site (`_hooked_layer`): the
    predictions and boundaries equal the plain forward; z sums to the attention output, its last
    head is the skip map A h, and the pattern is the planted one (identity for the skip head)."""
    from probe.capture import READOUT, RESID, capture

    model = plant(planted_config(algorithm, layers, 4, 10).model)
    p = sample_prompts(TaskConfig(n_dims=4, n_points=10), 6, generator=generator_for(1))
    caught = {}

    def keep(value, hook):
        caught[hook.name] = value.clone()

    with torch.no_grad():
        plain = model.run(p.xs, p.ys)
        hooked = model.run_with_hooks(p.xs, p.ys, [(name, keep) for name in model.hook_dict])
    assert (hooked.pred - plain.pred).abs().max() < 1e-5
    for a, b in zip(hooked.resid, plain.resid):
        assert (a - b).abs().max() < 1e-5
    z, h = caught["blocks.1.attn.hook_z"], caught["blocks.1.hook_resid_pre"]  # (runs, T, heads + 1, W), (runs, T, W)
    assert z.shape[:3] == (6 * 10, h.shape[1], model.q.shape[1] + 1)
    assert (z.sum(2) - caught["blocks.1.hook_attn_out"]).abs().max() < 1e-5
    assert (z[:, :, -1] - h @ model.skip[1].T).abs().max() < 1e-6
    captured = capture(model, p.xs, p.ys, hooks=[RESID, READOUT, "blocks.1.attn.hook_pattern"], batch_size=4)
    assert np.abs(captured.pred - plain.pred.numpy()).max() < 1e-5
    pattern = captured.acts["blocks.1.attn.hook_pattern"]  # (B, runs, heads + 1, T, T): the planted attention weights
    assert pattern.shape[:3] == (6, 10, model.q.shape[1] + 1)
    np.testing.assert_allclose(pattern[:, :, -1], np.broadcast_to(np.eye(pattern.shape[-1]), pattern[:, :, -1].shape))
    if algorithm == "newton-relu":
        assert (pattern >= 0).all() and (pattern[:, :, :-1] == 0).any()  # ReLU scores / t


@pytest.mark.slow
def test_zero_predictor_baseline_flags_layers_that_predict_zero_and_not_the_gd_layers():
    from probe.analysis.pipeline import LayerSettings, analyse_layers
    from probe.analysis.readout import ReadoutSettings
    from probe.core.settings import PromptSettings, SimilaritySettings, SweepSettings

    settings = LayerSettings(PromptSettings(train=64, val=32, test=128, induced=32), ReadoutSettings(method="model"),
                             SimilaritySettings(bootstrap=100),
                             sweeps=(SweepSettings("gd", "gd", "steps", {"eta": (0.1,), "steps": tuple(range(5))}),))
    gd = planted_config("gd", 4, 4, 10, step_size=0.1)
    best = analyse_layers(plant(gd.model), gd.task, settings).best
    for metric, rows in best.groupby("metric"):
        assert rows.sort_values("layer").degenerate.tolist() == [True, False, False, False, False], metric
    assert best[best.layer == 0].predicts_zero.all() and (best[best.layer == 0].zero_similarity > 0.999).all()
    newton = planted_config("newton", 7, 4, 10)
    settings.sweeps = (SweepSettings("newton", "newton", "iterations", {"alpha": (newton.model.planted_scale,), "iterations": tuple(range(4))}),)
    rows = analyse_layers(plant(newton.model), newton.task, settings).best.query("metric == 'sime'").sort_values("layer")
    assert rows.degenerate.tolist()[:3] == [True, True, True]  # boundaries 0-2 of the construction predict 0
    assert rows.predicts_zero.tolist()[:3] == [True, True, True]


@pytest.mark.parametrize("algorithm,layers,d,n", [("newton-relu", 4, 4, 10), ("sgd", 3, 4, 10), ("adam", 8, 4, 10),
                                                  ("prng", 1, 32, 3)])
def test_planted_mlp_in_blocks_equals_the_full_product(algorithm, layers, d, n, monkeypatch):
    """PlantedICL.mlp runs a block of tokens at a time (no giant temporary); with blocks of a few
    rows the model's every stream equals the one-block computation (float64: float32 kernels for
    a few rows may sum in another order)."""
    from probe.models import planted

    model = plant(planted_config(algorithm, layers, d, n).model).double()
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(3, n, d, generator=g, dtype=torch.float64), torch.randn(3, n, generator=g, dtype=torch.float64)
    monkeypatch.setattr(planted, "MLP_BLOCK_BYTES", 1 << 40)  # one block
    whole = model.run(xs, ys)
    monkeypatch.setattr(planted, "MLP_BLOCK_BYTES", 7 * model.d_mlp * 8)  # 7 rows a block
    blocks = model.run(xs, ys)
    assert len(whole.resid) == layers + 1
    for a, b in zip(whole.resid, blocks.resid):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(whole.pred, blocks.pred, rtol=1e-12, atol=1e-12)


ALL_PLANTED = [("gd", 3, 4, 10), ("newton", 7, 4, 10), ("newton-relu", 4, 4, 10), ("sgd", 3, 4, 10), ("adam", 8, 4, 10),
               ("uniform", 1, 4, 10), ("prng", 1, 32, 3)]


@pytest.mark.parametrize("algorithm,layers,d,n", ALL_PLANTED)
def test_capture_of_some_positions_runs_only_their_runs_and_equals_the_full_capture(algorithm, layers, d, n):
    """A planted capture restricted to a few token positions runs only the prefix runs they are read
    from: the kept states equal the full capture's, the other runs' predictions are NaN."""
    from probe.capture import RESID, capture
    from probe.models.planted import PlantedICL

    model = plant(planted_config(algorithm, layers, d, n).model)
    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(5, n, d, generator=g), torch.randn(5, n, generator=g)
    if algorithm == "prng":
        xs = (xs > 0).float()
    full = capture(model, xs, ys, hooks=[RESID])
    for positions in ([2 * (n - 1)], [1, 2], [2 * n - 1]):
        runs = PlantedICL.runs_reading(positions, n)
        part = capture(model, xs, ys, hooks=[RESID], positions=positions)
        np.testing.assert_allclose(part.acts[RESID], full.acts[RESID][:, :, positions], rtol=1e-5, atol=1e-5)  # float32
        np.testing.assert_allclose(part.pred[:, runs], full.pred[:, runs], rtol=1e-6, atol=1e-6)
        others = [t for t in range(n) if t not in runs]
        assert np.isnan(part.pred[:, others]).all() and len(runs) < n


@pytest.mark.slow
def test_ablating_a_component_whose_weights_are_zero_reuses_the_unablated_run(monkeypatch):
    """Planted adam: most layers have an all-zero MLP. Their ablations are taken from the unablated
    run without running them, and equal running them through hooks."""
    from probe.interventions.ablate import ablate
    from probe.interventions.runner import PlantedRunner

    model = plant(planted_config("adam", 8, 4, 10).model)
    runner = PlantedRunner(model, "cpu")
    silent = [layer for layer in range(8) if runner.silent(layer)]
    assert 0 < len(silent) < 8 and not runner.silent(1)  # layer B of each step carries psi's MLP
    g = torch.Generator().manual_seed(2)
    xs, ys = torch.randn(12, 10, 4, generator=g), torch.randn(12, 10, generator=g)
    held = (torch.randn(8, 10, 4, generator=g), torch.randn(8, 10, generator=g))
    shortcut = ablate(runner, xs, ys, held, heads=False, n_boot=50)
    monkeypatch.setattr(PlantedRunner, "silent", lambda self, layer, head=None: False)
    ran = ablate(runner, xs, ys, held, heads=False, n_boot=50)
    pd.testing.assert_frame_equal(shortcut, ran)
    quiet = shortcut[(shortcut.component == "mlp") & shortcut.layer.isin(silent)]
    assert len(quiet) and (quiet.increase == 0).all()


def _run_edited(model, xs, ys, boundary, edit):
    """The native forward with `edit(h)` applied to the per-run tokens (B, n, T, W) at `boundary`;
    returns each run's read-out (B, n)."""
    h, t = model.tokens(xs, ys)
    for layer in range(model.config.n_layer):
        if layer == boundary:
            h = edit(h.clone())
        h = model.layer(h, layer, t)
    return model.readout(h[:, :, -1])


def test_steering_the_stored_newton_iterate_moves_the_prediction_as_the_construction_says():
    """Planted Newton (linear attention): the column tokens hold M_k, the query z = M_k x_q, and the
    last layer reads out p = b . z with b = X^T y / t. Adding Delta to the stored M_k before the last
    iteration's layer (A) moves the prediction by b^T Delta x_q; adding delta to z before layer (B)
    moves it by b . delta (exactly, in float64)."""
    layers, d, n = 9, 3, 8
    model = plant(planted_config("newton", layers, d, n).model).double()
    s = model.layout
    g = torch.Generator().manual_seed(4)
    xs, ys = torch.randn(5, n, d, generator=g, dtype=torch.float64), torch.randn(5, n, generator=g, dtype=torch.float64)
    base = _run_edited(model, xs, ys, -1, lambda h: h)
    torch.testing.assert_close(base, model.run(xs, ys).pred, rtol=1e-12, atol=1e-12)
    t = torch.arange(n, dtype=torch.float64).clamp_min(1).view(1, n, 1)
    seen = torch.arange(n).view(1, n, 1) > torch.arange(n).view(1, 1, n)  # run t holds examples i < t
    b = (xs.unsqueeze(1) * (ys.unsqueeze(1) * seen).unsqueeze(-1)).sum(2) / t  # (B, n, d): X^T y / t per run
    delta = 0.01 * torch.randn(d, d, generator=g, dtype=torch.float64)  # Delta[:, j] is added to column m_j

    def move_m(h):
        h[:, :, n : n + d, s["m"]] += delta.T  # column token j holds m_j in slot m
        return h

    moved = _run_edited(model, xs, ys, layers - 2, move_m)  # before the last (A): z = (M_k + Delta) x_q
    expected = torch.einsum("bnd,de,bne->bn", b, delta, xs)  # b^T Delta x_q, x_q of run t = x_{t+1}
    torch.testing.assert_close(moved - base, expected, rtol=1e-9, atol=1e-12)
    shift = 0.05 * torch.randn(d, generator=g, dtype=torch.float64)

    def move_z(h):
        h[:, :, -1, s["z"]] += shift
        return h

    torch.testing.assert_close(_run_edited(model, xs, ys, layers - 1, move_z) - base, b @ shift, rtol=1e-9, atol=1e-12)


def test_steering_the_relu_newton_query_iterate_moves_the_prediction_as_the_construction_says():
    """Planted Newton with ReLU attention: the query's tq slot holds T^(l-1) x_q and layer l writes
    p = 1/t sum_i y_i <x_i, tq>; adding delta to tq before the last layer moves the prediction by
    b . delta, b = X^T y / t."""
    layers, d, n = 5, 3, 8
    model = plant(planted_config("newton-relu", layers, d, n).model).double()
    g = torch.Generator().manual_seed(5)
    xs, ys = torch.randn(5, n, d, generator=g, dtype=torch.float64), torch.randn(5, n, generator=g, dtype=torch.float64)
    base = _run_edited(model, xs, ys, -1, lambda h: h)
    t = torch.arange(n, dtype=torch.float64).clamp_min(1).view(1, n, 1)
    seen = torch.arange(n).view(1, n, 1) > torch.arange(n).view(1, 1, n)
    b = (xs.unsqueeze(1) * (ys.unsqueeze(1) * seen).unsqueeze(-1)).sum(2) / t
    shift = 0.05 * torch.randn(d, generator=g, dtype=torch.float64)

    def move(h):
        h[:, :, -1, model.layout["tq"]] += shift
        return h

    torch.testing.assert_close(_run_edited(model, xs, ys, layers - 1, move) - base, b @ shift, rtol=1e-9, atol=1e-12)


def test_planted_models_have_no_random_weights_control_and_the_report_says_so():
    """A planted class has no initialisation (a fresh one is all zeros), so no random-weights control is
    drawn: the null baselines keep the zero predictor only, the probe summary carries no control
    R^2, and the findings say why; GPT-2 keeps its seeded random copy."""
    from conftest import build_cfg

    from probe.analysis.nulls import null_predictions
    from probe.models import random_weights_model
    from probe.stages.probes import PROBES, Probes, probe_summary

    cfg = planted_config("gd", 3, 3, 8, step_size=0.1)
    assert random_weights_model(cfg.model, 0) is None
    assert random_weights_model(build_cfg(layers=2).model, 0) is not None
    model = plant(cfg.model)
    xs, ys = torch.randn(4, 8, 3), torch.randn(4, 8)
    assert set(null_predictions(model, xs, ys, seed=0)) == {"zero"}
    rows = pd.DataFrame(
        [
            {"target": "w_ols", "kind": "linear", "control": c, "layer": l, "prefix": 4, "r2": r}
            for c, r in (("none", 0.5), ("shuffled", 0.0))
            for l in range(3)
        ]
    )
    fits = probe_summary(rows)
    assert fits["w_ols"]["linear"].control_r2 == []

    assert PROBES.findings(Probes(fits), {}).endswith("No random-weights control: a planted model's weights are its construction.")


@pytest.mark.parametrize("name", sorted(CONSTRUCTIONS))
def test_every_construction_describes_itself_consistently(name):
    """A construction is one class: the model built from its defaults has the sizes it declares, its
    learner is registered, and the sweep its report checks runs that learner in the adapted quick recipe."""
    from probe.learners import LEARNERS
    from probe.reporting.recipe import adapt_recipe, resolve_recipe

    c = CONSTRUCTIONS.get(name)
    layers = {"adam": 8, "uniform": 1, "prng": 1}.get(name, 5)
    cfg = planted_config(name, layers, 32 if name == "prng" else 3, 6)
    model = plant(cfg.model)
    width, heads, d_mlp = c.sizes(cfg.model)
    assert (model.layout.width, model.q.shape[1], model.d_mlp) == (width, heads, d_mlp)
    p = sample_prompts(cfg.task, 2, generator=generator_for(0))
    xs, ys = p.xs, p.ys
    assert model.run(xs, ys).pred.shape == (2, 6)
    if c.first is None:
        assert not c.learner and c.layer_map(layers) is None
        return
    assert c.learner in LEARNERS and c.layer_map(c.first) == 0
    sweeps = {s.label: s.learner for s in adapt_recipe(resolve_recipe("quick"), cfg).sweeps}
    assert sweeps.get(c.matching_sweep, c.matching_sweep) == c.learner  # a sweep, or the learner's best (an alias)


def test_unknown_construction_gets_a_close_match():
    with pytest.raises(ConfigError, match="Unknown planted algorithm 'newtn'. Did you mean: newton?"):
        planted_config("newtn", 5, 4, 8)
