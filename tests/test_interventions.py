"""Interventions through TransformerLens: known answers on planted models, the public bridge's
round trip against Hugging Face's forward, and the CLI commands."""

import json

import numpy as np
import pytest
import torch
from conftest import REPO, GargTransformerModel, build_cfg, write_garg_run

from probe.cli import main
from probe.core.errors import ConfigError
from probe.core.settings import SweepSettings
from probe.interventions import iteration_patching, paired_prompts, patching_heatmap, runner_for, to_bridge
from probe.interventions.runner import skip_hooks
from probe.io.checkpoint import save_model
from probe.io.formats import load_checkpoint
from probe.io.planted_io import planted_config
from probe.learners import run_learner
from probe.models import build_model
from probe.models.planted import plant

ETA = 0.1


@pytest.fixture(scope="module")
def planted_gd():
    cfg = planted_config("gd", 5, 4, 10, step_size=ETA)
    return plant(cfg.model), cfg.task


def _gd(xs, ys, steps):
    return run_learner("gd", xs, ys, eta=(ETA,), steps=(steps,)).preds[0].float()


def test_skipping_any_layer_of_planted_gd_is_gd_with_one_step_fewer(planted_gd):
    model, task = planted_gd
    xs, ys, _ = paired_prompts(task, 24, 0)
    runner = runner_for(model)
    np.testing.assert_allclose(runner.predict(xs, ys).numpy(), _gd(xs, ys, 5).numpy(), atol=1e-5)
    for layer in range(5):
        np.testing.assert_allclose(runner.predict(xs, ys, skip_hooks([layer])).numpy(), _gd(xs, ys, 4).numpy(), atol=1e-5)


def test_skipping_an_iterations_two_layers_of_planted_newton_is_one_iteration_fewer():
    cfg = planted_config("newton", 9, 4, 10)
    runner = runner_for(plant(cfg.model))
    xs, ys, _ = paired_prompts(cfg.task, 24, 0)
    ref = lambda k: run_learner("newton", xs, ys, iterations=(k,), alpha=(cfg.model.planted_scale,)).preds[0].numpy()
    np.testing.assert_allclose(runner.predict(xs, ys).numpy(), ref(3), atol=1e-5)  # boundary 9 holds iteration 3
    for first in (1, 3, 5, 7):  # layers (A, B) of one iteration
        np.testing.assert_allclose(runner.predict(xs, ys, skip_hooks([first, first + 1])).numpy(), ref(2), atol=1e-5)


def test_skipping_one_layer_of_the_relu_attention_newton_is_one_iteration_fewer():
    cfg = planted_config("newton-relu", 6, 4, 10)
    runner = runner_for(plant(cfg.model))
    assert runner.heads == list(range(6)) and runner.has_mlp
    xs, ys, _ = paired_prompts(cfg.task, 24, 0)
    ref = lambda k: run_learner("newton", xs, ys, iterations=(k,), alpha=(cfg.model.planted_scale,)).preds[0].numpy()
    np.testing.assert_allclose(runner.predict(xs, ys).numpy(), ref(4), atol=1e-5)  # boundary 6 holds iteration 4
    for layer in (1, 2, 3, 4):  # each is one whole iteration (attention + MLP)
        np.testing.assert_allclose(runner.predict(xs, ys, skip_hooks([layer])).numpy(), ref(3), atol=1e-5)


@pytest.mark.parametrize("which", ["gpt2", "planted"])
def test_patching_the_whole_clean_stream_at_the_last_layer_restores_everything(which, planted_gd):
    if which == "planted":
        model, task = planted_gd
    else:
        cfg = build_cfg(layers=3)
        torch.manual_seed(0)
        model, task = build_model(cfg.model).eval(), cfg.task
    runner = runner_for(model)
    xs, ys, yc = paired_prompts(task, 16, 0)
    n_layers, n = runner.n_layers, xs.shape[1]
    name = f"blocks.{n_layers - 1}.hook_resid_post"
    for q in (n - 1, 3):
        clean = runner.states(xs, ys, [name], query=q)[name]
        patched = runner.patched(name, xs, yc, clean, torch.ones(1, 2 * n, dtype=torch.bool), q, 4096)[0]
        np.testing.assert_allclose(patched.numpy(), runner.predict(xs, ys)[:, q].numpy(), atol=1e-5)
        np.testing.assert_allclose(runner.predict(xs, yc, query=q).numpy(), runner.predict(xs, yc)[:, q].numpy(), atol=1e-5)


def test_patching_example_tokens_at_layer_0_restores_the_closed_form_fraction(planted_gd):
    model, task = planted_gd
    xs, ys, yc = paired_prompts(task, 64, 0)
    q = 9
    frame = patching_heatmap(runner_for(model), xs, ys, yc, query=q, n_boot=50)
    f = lambda y: _gd(xs, y, 5)[:, q].double()
    f_clean, f_corr = f(ys), f(yc)
    at0 = frame[frame.layer == 0].set_index("position").restored
    for i in range(q):  # GD is linear in y: patching y_i gives GD on the mixed labels
        mixed = yc.clone()
        mixed[:, i] = ys[:, i]
        expected = ((f(mixed) - f_corr) * (f_clean - f_corr)).sum() / ((f_clean - f_corr) ** 2).sum()
        assert at0[2 * i + 1] == pytest.approx(expected.item(), abs=1e-4)
        assert at0[2 * i] == pytest.approx(0.0, abs=1e-6)  # x tokens are shared: nothing to restore
    assert at0[2 * q] == pytest.approx(0.0, abs=1e-6)
    last = frame[frame.layer == 5].set_index("position").restored  # the read-out sees only the query token
    assert last[2 * q] == pytest.approx(1.0, abs=1e-5) and last.drop(2 * q).abs().max() < 1e-5


def test_iteration_patching_confirms_the_planted_map_and_rejects_shuffled_ones(planted_gd):
    model, task = planted_gd
    xs, ys, yc = paired_prompts(task, 48, 0)
    sweep = SweepSettings("gd", "gd", "steps", {"eta": (ETA,), "steps": tuple(range(6))})
    frame, check = iteration_patching(runner_for(model), xs, ys, yc, sweep, {b: b for b in range(6)}, n_boot=200)
    np.testing.assert_allclose(frame.observed, frame.expected, atol=1e-5)
    assert frame.expected.iloc[0] == pytest.approx(1.0)  # GD at 0 steps predicts 0: the whole change comes later
    assert check["deviation"] < 1e-5 and check["testable"]
    verdicts = {r["alternative"]: r for r in check["map_alternatives"]}
    assert set(verdicts) == {"shifted -2", "shifted -1", "shifted +1", "shifted +2", "constant"}
    for name, row in verdicts.items():  # the true map beats every named alternative, paired over prompts
        assert row["verdict"] == "claimed map closer" and row["ci_low"] > 0, name
    _wrong, wrong = iteration_patching(runner_for(model), xs, ys, yc, sweep, {b: min(5, 2 * b) for b in range(6)},
                                       n_boot=200)
    assert wrong["deviation"] > 0.05


def _hf_run(tmp_path, kind):
    """A GPT-2 with non-identity LayerNorms saved in `kind` format, and its Hugging Face reference."""
    from safetensors.torch import save_file

    torch.manual_seed(7)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    with torch.no_grad():
        for p in ref._backbone.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    if kind == "garg":
        return write_garg_run(tmp_path / "garg", ref, 3, 8, 16, 2, 2), ref
    if kind == "hf":
        ref._backbone.save_pretrained(tmp_path / "hf")
        save_file({"read_in.weight": ref._read_in.weight.detach().contiguous(), "read_in.bias": ref._read_in.bias.detach(),
                   "read_out.weight": ref._read_out.weight.detach().contiguous(),
                   "read_out.bias": ref._read_out.bias.detach()}, str(tmp_path / "hf" / "icl_head.safetensors"))
        return tmp_path / "hf", ref
    garg = load_checkpoint(write_garg_run(tmp_path / "garg", ref, 3, 8, 16, 2, 2))
    save_model(garg.model, garg.config, tmp_path / "own")
    return tmp_path / "own", ref


@pytest.mark.parametrize("kind", ["own", "garg", "hf"])
def test_bridge_round_trips_predictions_and_residuals_against_hugging_face(tmp_path, kind):
    from probe.capture import RESID, capture

    path, ref = _hf_run(tmp_path, kind)
    bridge = to_bridge(path)
    xs, ys = torch.randn(5, 8, 3), torch.randn(5, 8)
    with torch.no_grad():
        logits, cache = bridge.run_with_cache((xs, ys))
        hidden = ref._backbone(inputs_embeds=ref._read_in(ref._combine(xs, ys)), output_hidden_states=True).hidden_states
        expected = ref(xs, ys)
    assert (bridge.predictions(logits) - expected).abs().max() < 1e-5
    for layer in range(2):
        assert (cache[f"blocks.{layer}.hook_resid_pre"] - hidden[layer]).abs().max() < 1e-5
    own = capture(load_checkpoint(path).model, xs, ys, hooks=[RESID])
    assert np.abs(cache["blocks.1.hook_resid_post"].numpy() - own.acts[RESID][2]).max() < 1e-5
    assert "hook_embed" in cache and "hook_pos_embed" in cache  # the read-in is hookable like an embedding
    with torch.no_grad():
        zeroed = bridge.run_with_hooks((xs, ys), fwd_hooks=[("hook_embed", lambda v, hook: torch.zeros_like(v))])
        only_positions = bridge(torch.zeros(5, 16, 16))
    assert torch.allclose(zeroed, only_positions, atol=1e-6)


def test_capture_as_cache_is_indexed_by_transformer_lens_names(tmp_path):
    from probe.capture import RESID, capture

    path, _ = _hf_run(tmp_path, "own")
    model = load_checkpoint(path).model
    xs, ys = torch.randn(4, 8, 3), torch.randn(4, 8)
    cache = capture(model, xs, ys, hooks=[RESID, "blocks.1.attn.hook_pattern"], as_cache=True)
    _, tl = to_bridge(model).run_with_cache((xs, ys))
    for name in ("blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern"):
        assert (cache[name] - tl[name]).abs().max() < 1e-5
    assert cache.accumulated_resid(layer=2).shape == (3, 4, 16, 16)  # a TransformerLens idiom on our capture


def test_models_without_a_transformer_lens_form_are_refused_clearly(planted_gd):
    cfg = build_cfg(family="lstm")
    with pytest.raises(ConfigError, match="to_bridge needs a GPT-2 family model"):
        to_bridge(build_model(cfg.model))
    with pytest.raises(ConfigError, match="to_bridge needs a GPT-2 family model.*Planted"):
        to_bridge(planted_gd[0])
    with pytest.raises(ConfigError, match="interventions need a transformer.*lstm"):
        runner_for(build_model(cfg.model))
    bridge = to_bridge(build_model(build_cfg().model))
    with pytest.raises(ConfigError, match=r"prompts have d=2 but the model takes d=3"):
        bridge((torch.randn(2, 8, 2), torch.randn(2, 8)))


@pytest.mark.slow
def test_ablate_and_patch_cli_on_a_small_checkpoint(tmp_path, capsys):
    cfg = build_cfg(layers=2)
    torch.manual_seed(0)
    save_model(build_model(cfg.model), cfg, tmp_path / "run")
    assert main(["-q", "ablate", str(tmp_path / "run"), "--out", str(tmp_path / "ab"), "--prompts", "16",
                 "--bootstrap", "20"]) == 0
    table = __import__("pandas").read_csv(tmp_path / "ab" / "ablation.csv")
    assert set(table.kind) == {"none", "zero", "mean", "skip"} and len(table) == 8 * (1 + 2 * (1 + 2 * (2 + 1)))  # none; per layer: skip, 2 kinds x (2 heads + MLP)
    assert (tmp_path / "ab" / "ablation.png").is_file()
    assert main(["-q", "patch", str(tmp_path / "run"), "--out", str(tmp_path / "pa"), "--prompts", "8",
                 "--bootstrap", "20", "--learners", "gd_log", "--sites", "resid", "mlp_out"]) == 0
    summary = json.loads((tmp_path / "pa" / "interventions_summary.json").read_text())["interventions"]
    assert set(summary["patching"]) == {"resid", "mlp_out"} and "gd_log" in summary["iteration"]
    assert not (tmp_path / "pa" / "ablation.csv").exists() and not (tmp_path / "ab" / "patching.csv").exists()
    assert (tmp_path / "pa" / "iteration_gd_log.csv").is_file()
    capsys.readouterr()
    lstm = build_cfg(family="lstm")
    save_model(build_model(lstm.model), lstm, tmp_path / "lstm")
    assert main(["ablate", str(tmp_path / "lstm"), "--out", str(tmp_path / "ab2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no attention heads or residual stream" in err[0]
    assert not (tmp_path / "ab2").exists()
    assert main(["patch", str(tmp_path / "run"), "--out", str(tmp_path / "pa2"), "--map-from", str(tmp_path / "nope.csv")]) == 2
    assert "--map-from" in capsys.readouterr().err and not (tmp_path / "pa2").exists()


def test_position_and_query_limits_keep_the_latest_tokens_and_spread_the_queries(planted_gd):
    from probe.interventions.patch import spread_examples

    model, task = planted_gd
    xs, ys, yc = paired_prompts(task, 8, 0)
    full = patching_heatmap(runner_for(model), xs, ys, yc, n_boot=20)
    cut = patching_heatmap(runner_for(model), xs, ys, yc, n_boot=20, max_positions=5)
    assert sorted(cut.position.unique()) == [14, 15, 16, 17, 18]  # the query x10 and the 4 tokens before it
    merged = cut.merge(full, on=["site", "layer", "position"], suffixes=("", "_full"))
    np.testing.assert_allclose(merged.restored, merged.restored_full, atol=1e-9)
    assert spread_examples(10, 0) == list(range(1, 10)) and spread_examples(41, 8) == [1, 7, 12, 18, 23, 29, 34, 40]


def _gpt2(which: str, tmp_path):
    """(model, task): the trained default checkpoint, or a random Garg-layout run."""
    if which == "default":
        loaded = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    elif which == "relu-attention":
        from conftest import relu_attention_model

        return relu_attention_model()
    else:
        write_garg_run(tmp_path / "g", GargTransformerModel(3, 8, 16, 2, 2).eval(), 3, 8, 16, 2, 2)
        loaded = load_checkpoint(tmp_path / "g")
    return loaded.model, loaded.config.task


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default", "garg", "relu-attention"])
def test_resumed_patching_equals_patching_through_hooks(which, tmp_path):
    """Residual patching that resumes the native blocks from the patched boundary (and, for the
    context check, recomputes only the query token) against TransformerLens hooks on full runs."""
    from probe.capture.hooks import resid
    from probe.interventions.patch import context_patching
    from probe.interventions.runner import GPT2Runner

    model, task = _gpt2(which, tmp_path)
    xs, ys, yc = paired_prompts(task, 6, seed=3)
    fast, hooked = GPT2Runner(model.eval(), "cpu"), GPT2Runner(model.eval(), "cpu", resumed=False)
    for query, positions in ((task.n_points - 1, list(range(2 * task.n_points - 1))), (task.n_points - 3, [2 * task.n_points - 10, 2 * task.n_points - 9, 2 * task.n_points - 6])):
        direct = fast.patched_resid(xs, yc, ys, list(range(model.n_layers + 1)), positions, query)
        masks = torch.zeros(len(positions), 2 * task.n_points, dtype=torch.bool)
        masks[torch.arange(len(positions)), torch.tensor(positions)] = True
        for b, got in direct.items():
            src = hooked.states(xs, ys, [resid(b)], query=query)[resid(b)]
            want = hooked.patched(resid(b), xs, yc, src, masks, query, 4096)
            np.testing.assert_allclose(got, want, atol=1e-5)
    if which == "default":  # the ratios too (the random Garg model's clean and corrupted predictions differ by ~1e-3)
        a = patching_heatmap(fast, xs, ys, yc, n_boot=10, max_positions=9)
        b = patching_heatmap(hooked, xs, ys, yc, n_boot=10, max_positions=9)
        assert len(a) == len(b) == 9 * (model.n_layers + 1)
        np.testing.assert_allclose(a.restored, b.restored, atol=1e-4)
    boundaries, examples = list(range(model.n_layers)), [1, 3, task.n_points - 1]
    direct = fast.context_patched(xs, ys, yc, boundaries, examples)
    for b in boundaries:  # predictions, before any ratio
        for j, t in enumerate(examples):
            mask = (torch.arange(2 * task.n_points) < 2 * t).view(1, -1)
            name = resid(b)
            src = hooked.states(xs, yc, [name], query=t)[name]
            want = hooked.patched(name, xs, ys, src, mask, t, 4096)[0]
            np.testing.assert_allclose(direct[b][:, j], want, atol=1e-5)
    pa = context_patching(fast, xs, ys, yc, boundaries, examples)
    pb = context_patching(hooked, xs, ys, yc, boundaries, examples)
    for b in boundaries:
        np.testing.assert_allclose(pa.num[b], pb.num[b], atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["default", "garg", "relu-attention"])
def test_resumed_ablation_equals_ablation_through_hooks(which, tmp_path):
    """Every head / MLP / layer ablation resumed from the ablated block against the same hooks on
    full runs."""
    from probe.interventions.ablate import ablate, components, hooks_for
    from probe.interventions.runner import GPT2Runner

    model, task = _gpt2(which, tmp_path)
    xs, ys, _ = paired_prompts(task, 12, seed=3)
    held = paired_prompts(task, 12, seed=4)[:2]
    fast, hooked = GPT2Runner(model.eval(), "cpu"), GPT2Runner(model.eval(), "cpu", resumed=False)
    comps = components(fast)
    assert {c.component for c in comps} == {"none", "head", "mlp", "layer"}
    edits = [(model.n_layers if c.kind == "none" else c.layer, hooks_for(fast, c, {})) for c in comps if c.kind != "mean"]
    resumed, full = fast.predict_each(xs, ys, edits), hooked.predict_each(xs, ys, edits)
    assert len(resumed) == len(edits)
    for a, b in zip(resumed, full):  # the same hooks, resumed from the edited block vs on full runs
        np.testing.assert_allclose(a, b, atol=1e-5)
    a = ablate(fast, xs, ys, held, n_boot=10, batch_size=5)
    b = ablate(hooked, xs, ys, held, n_boot=10, batch_size=5)
    assert len(a) == len(b) == len(comps) * task.n_points
    np.testing.assert_allclose(a.error, b.error, rtol=1e-4, atol=1e-6)
    assert (a.increase.abs() > 1e-3).any()  # the ablations do something


def test_transformer_lens_patching_runs_unchanged_on_a_prompt_and_equals_ours(tmp_path):
    """probe.prompt(xs, ys) is a TransformerLens input: transformer_lens.patching's residual
    patching runs on the bridge as it is and equals icl-probe's (resumed) patching cell by cell."""
    from transformer_lens import patching

    from probe import prompt, to_bridge
    from probe.interventions.runner import GPT2Runner

    for which in ("garg", "relu-attention"):
        model, task = _gpt2(which, tmp_path / which)
        xs, ys, yc = paired_prompts(task, 6, seed=3)
        bridge = to_bridge(model)
        _, clean = bridge.run_with_cache(prompt(xs, ys))
        q = task.n_points - 1
        tl = patching.get_act_patch_resid_pre(bridge, prompt(xs, yc), clean, lambda logits, q=q: logits[:, 2 * q, 0].mean())
        assert tl.shape == (model.n_layers, 2 * task.n_points)
        ours = GPT2Runner(model.eval(), "cpu").patched_resid(xs, yc, ys, list(range(model.n_layers)),
                                                             list(range(2 * q + 1)), q)
        expected = torch.stack([ours[b].mean(-1) for b in range(model.n_layers)])
        np.testing.assert_allclose(tl[:, : 2 * q + 1].numpy(), expected.numpy(), atol=1e-5)
        assert prompt(xs, ys).shape == (6, 2 * task.n_points)


def test_named_alternatives_shift_and_flatten_the_map():
    """Shifted maps give boundary b the claim's count at b + s (clamped), the constant map the
    middle count; the last boundary keeps its count in every alternative."""
    from probe.interventions.patch import named_alternatives

    claim = {b: 2 * b for b in range(5)}
    alt = named_alternatives(claim, 4)
    assert alt["shifted +1"] == {0: 2, 1: 4, 2: 6, 3: 8, 4: 8}
    assert alt["shifted -2"] == {0: 0, 1: 0, 2: 0, 3: 2, 4: 8}
    assert alt["constant"] == {0: 4, 1: 4, 2: 4, 3: 4, 4: 8}



@pytest.mark.slow
def test_map_check_cannot_test_a_model_whose_context_patch_fits_no_map():
    """Planted Adam keeps a step's gradient and moments in the query between its four layers per
    step, so the context patch moves its prediction unlike any map's expectation: the check says it
    cannot test the map (instead of reading a poor fit as evidence against a map that is true by
    construction); planted GD under the same check is testable."""
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    cfg = planted_config("adam", 8, 3, 8, step_size=0.1, batch=3)
    model = plant(cfg.model)
    xs, ys, yc = paired_prompts(cfg.task, 48, 0)
    sweep = SweepSettings("adam_replay", "adam", "steps",
                          {"steps": [0, 1, 2], "eta": [0.1], "batch_size": [3], "masks_seed": 0})
    _frame, check = iteration_patching(runner_for(model), xs, ys, yc, sweep, {b: b // 4 for b in range(9)}, n_boot=50)
    assert not check["testable"] and "no map fits" in check["reason"]
    assert {r["verdict"] for r in check["map_alternatives"]} == {"cannot test here"}


@pytest.mark.parametrize("kind,layers,true_map", [
    ("newton", 9, lambda b: max((b - 3) // 2, 0)),  # two layers per iteration, boundaries 0-2 predict 0
    ("newton-relu", 6, lambda b: max(b - 2, 0)),  # one layer per iteration
])
@pytest.mark.slow
def test_state_check_confirms_the_newton_constructions_maps_and_rejects_shifted_ones(kind, layers, true_map):
    """Writing M' = alpha S'/t of fresh x's as the stored iterate and resuming: the observed effect
    equals the true map's expectation (float32 bridge vs float64 learner), and the true map beats
    every named alternative whose expectation differs, paired over prompts (interval above 0);
    maps shifted by 2 boundaries are among them. The full context patch cannot test these maps."""
    from probe.interventions.state import source_xs, state_map_check
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    cfg = planted_config(kind, layers, 4, 12)
    runner = runner_for(plant(cfg.model))
    xs, ys, yc = paired_prompts(cfg.task, 48, 0)
    layer_map = {b: true_map(b) for b in range(layers + 1)}
    frame, check = state_map_check(runner, xs, ys, source_xs(cfg.task, 48, 0), layer_map, range(1, 12), n_boot=200)
    np.testing.assert_allclose(frame.observed, frame.expected, atol=1e-5)
    assert frame.observed.iloc[0] < 0.8 and frame.observed.iloc[-1] == pytest.approx(1.0, abs=1e-5)  # washed out early
    assert check["testable"] and check["deviation"] < 1e-5
    verdicts = {r["alternative"]: r for r in check["map_alternatives"]}
    assert {"shifted -2", "shifted +2"} <= {name for name, r in verdicts.items() if r["verdict"] == "claimed map closer"}
    for name, row in verdicts.items():
        assert row["verdict"] == "claimed map closer" and row["ci_low"] > 0 or row["resolution"] < 1e-6, name
    sweep = SweepSettings("newton", "newton", "iterations", {"iterations": tuple(range(6)), "alpha": (cfg.model.planted_scale,)})
    _frame, flat = iteration_patching(runner, xs, ys, yc, sweep, layer_map, n_boot=50)
    assert not flat["testable"] and "same fraction at every boundary" in flat["reason"]


def test_state_check_is_refused_for_a_model_that_keeps_no_state(planted_gd):
    from probe.interventions.state import state_map_check

    model, task = planted_gd
    xs, ys, _ = paired_prompts(task, 8, 0)
    with pytest.raises(ConfigError, match="does not say where it keeps"):
        state_map_check(runner_for(model), xs, ys, xs, {b: b for b in range(6)}, range(1, 10))


def test_context_check_confirms_the_planted_sgd_map_and_rejects_shifted_ones():
    """Planted SGD (Hataya & Imaizumi 2024, Thm. 4) keeps its residuals in the context and its prediction in the
    query, as GD does: the replayed-minibatch SGD map (boundary l = step l) beats every shift and
    the constant map with an interval above 0."""
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    cfg = planted_config("sgd", 6, 3, 10, step_size=0.1, batch=3)
    runner = runner_for(plant(cfg.model))
    xs, ys, yc = paired_prompts(cfg.task, 48, 0)
    sweep = SweepSettings("sgd_replay", "sgd", "steps",
                          {"steps": list(range(7)), "eta": [0.1], "batch_size": [3], "masks_seed": 0})
    frame, check = iteration_patching(runner, xs, ys, yc, sweep, {b: b for b in range(7)}, n_boot=200)
    np.testing.assert_allclose(frame.observed, frame.expected, atol=1e-4)
    assert check["testable"]
    for row in check["map_alternatives"]:
        assert row["verdict"] == "claimed map closer" and row["ci_low"] > 0, row["alternative"]


def test_the_map_check_leaves_out_the_layers_that_predict_zero_for_every_map_alike():
    """A layer that predicts ~0 is a property of the layer: left out of every map; a match that is
    degenerate for one learner only (planted GD's layers against Newton) is not."""
    import pandas as pd

    from probe.core.settings import SweepSettings
    from probe.interventions.pipeline import degenerate_boundaries

    sweeps = [SweepSettings("newton", "newton", "iterations", {}), SweepSettings("gd", "gd", "steps", {})]
    rows = [
        {"sweep": s, "metric": "sime", "layer": l, "predicts_zero": l == 0, "degenerate": l == 0 or s == "newton"}
        for s in ("newton", "gd")
        for l in range(4)
    ]
    best = pd.DataFrame(rows)
    assert degenerate_boundaries(best, sweeps) == [0]
    assert degenerate_boundaries(best.drop(columns="predicts_zero"), sweeps) == [0]
    assert degenerate_boundaries(best.drop(columns=["predicts_zero", "degenerate"]), sweeps) == []


def test_the_map_checks_page_tables_name_each_map_by_its_sweeps_recipe_title():
    """The committed quick report's causal checks read back: the layer maps are named as the recipe
    titles its sweeps ("GD (log grid)"), not by their internal labels ("gd_log")."""
    import json
    from pathlib import Path

    from probe.core.stages import registered
    from probe.reporting.schema import Summary

    data = json.loads((Path(__file__).parents[1] / "reports" / "gpt2-default-quick" / "summary.json").read_text())
    summary = Summary.from_json(data)
    stage = registered()["interventions"]
    assert stage.tables is not None
    tables = stage.tables(summary.interventions, summary, {})
    assert "GD (log grid): observed and expected fractions by boundary" in tables
    maps = next(frame for frame in tables.values() if "layer map" in frame)
    assert list(maps["layer map"]) == ["Iterative Newton", "GD (log grid)"]
    assert not any(title.startswith("gd_log") for title in tables)
