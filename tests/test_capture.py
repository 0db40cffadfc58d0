"""Capture through TransformerLens equals the plain PyTorch / Hugging Face forward, for every format."""

import numpy as np
import pytest
import torch
from conftest import REPO, GargTransformerModel, build_cfg, write_garg_run

from probe.capture import FINAL, READOUT, RESID, capture, resid
from probe.core.errors import ConfigError
from probe.io.checkpoint import save_model
from probe.io.formats import load_checkpoint
from probe.models import build_model

TOL = 1e-5


def _hf_reference(ref: GargTransformerModel, xs, ys):
    with torch.no_grad():
        out = ref._backbone(inputs_embeds=ref._read_in(ref._combine(xs, ys)), output_hidden_states=True)
        return ref(xs, ys), out.hidden_states


def _check_against_hf(model, ref, xs, ys):
    cap = capture(model, xs, ys, hooks=[RESID, READOUT], batch_size=3, backend="hooked")
    pred, hidden = _hf_reference(ref, xs, ys)
    layers = len(hidden) - 1
    assert np.abs(cap.pred - pred.numpy()).max() < TOL
    for b in range(layers):  # HF hidden_states[l] is the raw stream for l < L
        assert np.abs(cap.acts[RESID][b] - hidden[b].numpy()).max() < TOL
    assert np.abs(cap.acts[READOUT] - hidden[layers].numpy()).max() < TOL  # HF's last entry is after ln_f
    # the raw stream after the last block is a different tensor from the normalised one
    assert np.abs(cap.acts[RESID][layers] - cap.acts[READOUT]).max() > 1e-2


@pytest.fixture
def garg_run(tmp_path):
    torch.manual_seed(3)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    return write_garg_run(tmp_path / "garg", ref, 3, 8, 16, 2, 2, prefix="module."), ref


def test_garg_directory_parity(garg_run):
    run, ref = garg_run
    xs, ys = torch.randn(7, 8, 3), torch.randn(7, 8)
    _check_against_hf(load_checkpoint(run).model, ref, xs, ys)


def test_hf_gpt2_directory_parity(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(4)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    ref._backbone.save_pretrained(tmp_path / "hf")
    save_file({"read_in.weight": ref._read_in.weight.detach().contiguous(), "read_in.bias": ref._read_in.bias.detach(),
               "read_out.weight": ref._read_out.weight.detach().contiguous(), "read_out.bias": ref._read_out.bias.detach()},
              str(tmp_path / "hf" / "icl_head.safetensors"))
    loaded = load_checkpoint(tmp_path / "hf")
    assert loaded.format == "hf-gpt2" and loaded.config.model.n_positions == 8
    xs, ys = torch.randn(5, 8, 3), torch.randn(5, 8)
    _check_against_hf(loaded.model, ref, xs, ys)


def test_hf_directory_without_head_says_what_is_missing(tmp_path):
    GargTransformerModel(3, 8, 16, 2, 2)._backbone.save_pretrained(tmp_path / "hf")
    with pytest.raises(Exception, match=r"hf-gpt2: GPT-2 weights but no icl_head\.safetensors"):
        load_checkpoint(tmp_path / "hf")


def test_own_checkpoint_parity_and_hooks(tmp_path):
    cfg = build_cfg(layers=3)
    torch.manual_seed(0)
    save_model(build_model(cfg.model), cfg, tmp_path / "own")
    model = load_checkpoint(tmp_path / "own").model
    xs, ys = torch.randn(6, 8, 3), torch.randn(6, 8)
    cap = capture(model, xs, ys, hooks=[RESID, "blocks.1.attn.hook_pattern"], positions="x", batch_size=4)
    out = model.run(xs, ys)
    assert cap.acts[RESID].shape == (4, 6, 8, 16)
    for b in range(4):
        assert np.abs(cap.acts[RESID][b] - out.resid[b][:, ::2].detach().numpy()).max() < TOL
    pattern = cap.acts["blocks.1.attn.hook_pattern"]
    assert pattern.shape == (6, 2, 16, 16)
    np.testing.assert_allclose(pattern.sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(pattern, k=1)).max() == 0  # causal


def test_lstm_native_capture_and_streaming(tmp_path):
    cfg = build_cfg(family="lstm")
    model = build_model(cfg.model).eval()
    xs, ys = torch.randn(9, 8, 3), torch.randn(9, 8)
    cap = capture(model, xs, ys, batch_size=4, out_dir=tmp_path / "acts")
    assert isinstance(cap.acts[RESID], np.memmap) and (tmp_path / "acts" / "resid.npy").exists()
    out = model.run(xs, ys)
    assert np.abs(np.load(tmp_path / "acts" / "resid.npy")[2] - out.resid[2].detach().numpy()).max() < TOL
    with pytest.raises(ConfigError, match="need TransformerLens-named hook points"):
        capture(model, xs, ys, hooks=["blocks.0.attn.hook_pattern"])
    with pytest.raises(ConfigError, match="the hooked backend needs a GPT-2 family, linear self-attention or planted model"):
        capture(model, xs, ys, backend="hooked")
    with pytest.raises(ConfigError, match=r"backend must be 'auto', 'hooked' .* or 'native', got 'transformer_lens'"):
        capture(model, xs, ys, backend="transformer_lens")
    big = capture(model, xs, ys, batch_size=4, max_bytes=1000)  # too big for memory: streamed automatically
    assert isinstance(big.acts[RESID], np.memmap)
    np.testing.assert_array_equal(np.asarray(big.acts[RESID]), np.load(tmp_path / "acts" / "resid.npy"))


def test_bad_prompts_are_rejected():
    model = build_model(build_cfg().model)
    with pytest.raises(ConfigError, match="prompts have d=4 but the model takes d=3"):
        capture(model, torch.randn(2, 8, 4), torch.randn(2, 8))
    with pytest.raises(ConfigError, match="prompts have 9 points but the model has positions for 8"):
        capture(model, torch.randn(2, 9, 3), torch.randn(2, 9))
    xs = torch.randn(2, 8, 3)
    xs[0, 0, 0] = float("nan")
    with pytest.raises(ConfigError, match="NaN"):
        capture(model, xs, torch.randn(2, 8))
    with pytest.raises(ConfigError, match="must hold floats"):
        capture(model, torch.ones(2, 8, 3, dtype=torch.long), torch.randn(2, 8))
    with pytest.raises(ConfigError, match=r"unknown hook 'blocks.9.nothing' for this GPT2ICL; valid names: hook_embed, .*blocks.{i}.attn.hook_pattern.* \(i in 0..1\)"):
        capture(model, torch.randn(2, 8, 3), torch.randn(2, 8), hooks=["blocks.9.nothing"])


def test_hook_names():
    assert resid(0) == "blocks.0.hook_resid_pre" and resid(3) == "blocks.2.hook_resid_post"


def test_final_hook_names_mean_the_same_on_both_backends_of_a_trained_model():
    """On the trained default checkpoint (ln_f weight != 1, bias != 0): READOUT is what the
    read-out sees (its prediction is read_out(READOUT)), FINAL is TransformerLens's pre-affine
    normalised stream: the same tensors on both back-ends, and FINAL is what a TransformerBridge
    gives at that name."""
    import torch.nn.functional as F
    from conftest import REPO

    from probe import to_bridge
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    torch.manual_seed(0)
    xs, ys = torch.randn(5, 16, 4), torch.randn(5, 16)
    tl = capture(model, xs, ys, hooks=[RESID, READOUT, FINAL], positions="x")
    nat = capture(model, xs, ys, hooks=[RESID, READOUT, FINAL], positions="x", backend="native")
    for name in (READOUT, FINAL):
        assert np.abs(tl.acts[name] - nat.acts[name]).max() < TOL
    with torch.no_grad():
        _, cache = to_bridge(model).run_with_cache((xs, ys))
    bridge_final = cache[FINAL][:, ::2].numpy()
    assert np.abs(tl.acts[FINAL] - bridge_final).max() < TOL
    ln_f = model._backbone.ln_f
    assert (ln_f.weight - 1).abs().max() > 0.05  # a non-identity LayerNorm, or this test proves nothing
    readout = model._read_out(torch.as_tensor(tl.acts[READOUT]))[..., 0].detach().numpy()
    assert np.abs(readout - tl.pred).max() < TOL
    h_last = torch.as_tensor(tl.acts[RESID][-1])
    np.testing.assert_allclose(tl.acts[FINAL], F.layer_norm(h_last, (64,), eps=ln_f.eps).numpy(), atol=TOL)
    assert np.abs(model._read_out(torch.as_tensor(tl.acts[FINAL]))[..., 0].detach().numpy() - tl.pred).max() > 1e-2


def test_final_norm_hook_needs_a_layernorm():
    from conftest import build_cfg

    from probe.core.errors import ConfigError
    from probe.models import build_model

    lstm = build_model(build_cfg(family="lstm").model)
    with pytest.raises(ConfigError, match="needs a model with a final LayerNorm"):
        capture(lstm, torch.randn(2, 8, 3), torch.randn(2, 8), hooks=[FINAL])


def _save_hf(tmp_path, ref, **overrides):
    import json as _json

    from safetensors.torch import save_file

    ref._backbone.save_pretrained(tmp_path / "hf")
    save_file({"read_in.weight": ref._read_in.weight.detach().contiguous(), "read_in.bias": ref._read_in.bias.detach(),
               "read_out.weight": ref._read_out.weight.detach().contiguous(), "read_out.bias": ref._read_out.bias.detach()},
              str(tmp_path / "hf" / "icl_head.safetensors"))
    cfg = _json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.update(overrides)
    (tmp_path / "hf" / "config.json").write_text(_json.dumps(cfg))
    return tmp_path / "hf"


@pytest.mark.parametrize("option,value", [("scale_attn_by_inverse_layer_idx", True), ("scale_attn_weights", False),
                                          ("activation_function", "relu"), ("layer_norm_epsilon", 1e-6),
                                          ("add_cross_attention", True), ("n_inner", 20)])
def test_hf_options_we_do_not_implement_are_refused_by_name(tmp_path, option, value):
    from probe.core.errors import CheckpointError

    path = _save_hf(tmp_path, GargTransformerModel(3, 8, 16, 2, 2), **{option: value})
    with pytest.raises(CheckpointError, match=rf"{option}=.* is not implemented by icl-probe's GPT-2"):
        load_checkpoint(path)


def test_hf_options_that_keep_the_forward_are_accepted_and_match_hugging_face(tmp_path):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(5)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    options = {"reorder_and_upcast_attn": True, "resid_pdrop": 0.3, "embd_pdrop": 0.3, "attn_pdrop": 0.3, "n_inner": 64}
    config = GPT2Config(n_positions=16, n_embd=16, n_layer=2, n_head=2, **options)
    backbone = GPT2Model(config).eval()
    backbone.load_state_dict(ref._backbone.state_dict())
    ref._backbone = backbone
    loaded = load_checkpoint(_save_hf(tmp_path, ref))
    xs, ys = torch.randn(4, 8, 3), torch.randn(4, 8)
    with torch.no_grad():
        assert (loaded.model(xs, ys) - ref(xs, ys)).abs().max() < TOL


def test_capture_batches_shrink_to_fit_the_memory_budget_with_the_same_numbers(monkeypatch):
    import importlib


    capture_module = importlib.import_module("probe.capture.activations")
    model = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(40, 16, 4, generator=g), torch.randn(40, 16, generator=g)
    full = capture_module.capture(model, xs, ys, hooks=[RESID])
    per_prompt = 8 * (model.n_layers + 2) * 32 * model.d_model * 4
    kept = capture_module._stored_bytes(model, [RESID], 40, 32)
    batches = []
    real_backend_for = capture_module.backend_for

    def counting_backend_for(*args):
        runner = real_backend_for(*args)
        run = runner.run
        runner.run = lambda bx, by, request: batches.append(len(bx)) or run(bx, by, request)
        return runner

    monkeypatch.setattr(capture_module, "backend_for", counting_backend_for)
    from probe.core.memory import MemoryBudget

    class Fixed(MemoryBudget):
        def headroom(self) -> int:
            return kept + 10 * per_prompt

    small = capture_module.capture(model, xs, ys, hooks=[RESID], memory=Fixed())
    assert batches == [10, 10, 10, 10]  # what the budget leaves beside the kept streams: 10 prompts
    np.testing.assert_allclose(np.asarray(small.acts[RESID]), np.asarray(full.acts[RESID]), atol=1e-6)
    np.testing.assert_allclose(small.pred, full.pred, atol=1e-6)


def test_relu_attention_bridge_equals_the_plain_forward_and_seed_001_definition(tmp_path):
    """A ReLU-attention GPT-2 (Wu et al. 2024, Def. 7) through TransformerLens: predictions and every
    boundary equal the plain forward, and the pattern is ReLU(q.k / sqrt(hs)) / (i + 1), computed
    here from the weights with numpy; saved and loaded, the option survives."""
    from conftest import relu_attention_model

    model, _ = relu_attention_model()
    cfg = build_cfg()
    cfg.model.attn_activation = "relu"
    save_model(model, cfg, tmp_path / "relu")
    loaded = load_checkpoint(tmp_path / "relu")
    assert loaded.config.model.attn_activation == "relu"
    model = loaded.model
    torch.manual_seed(1)
    xs, ys = torch.randn(5, 8, 3), torch.randn(5, 8)
    cap = capture(model, xs, ys, hooks=[RESID, "blocks.0.attn.hook_pattern"], batch_size=2)
    out = model.run(xs, ys)
    np.testing.assert_allclose(cap.pred, out.pred.detach().numpy(), atol=TOL)
    for b in range(3):
        np.testing.assert_allclose(cap.acts[RESID][b], out.resid[b].detach().numpy(), atol=TOL)
    # layer 0's pattern from the weights: ln_1, then Conv1D q and k, per head
    h = out.resid[0].detach().numpy().astype(np.float64)
    sd = {k: v.detach().numpy().astype(np.float64) for k, v in model.state_dict().items()}
    z = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5)
    z = z * sd["_backbone.h.0.ln_1.weight"] + sd["_backbone.h.0.ln_1.bias"]
    qkv = z @ sd["_backbone.h.0.attn.c_attn.weight"] + sd["_backbone.h.0.attn.c_attn.bias"]
    q, k = qkv[..., :16].reshape(5, 16, 2, 8), qkv[..., 16:32].reshape(5, 16, 2, 8)
    scores = np.einsum("bihe,bjhe->bhij", q, k) / np.sqrt(8)
    want = np.maximum(scores, 0) * np.tril(np.ones((16, 16))) / np.arange(1, 17)[:, None]
    pattern = cap.acts["blocks.0.attn.hook_pattern"]
    np.testing.assert_allclose(pattern, want, atol=1e-5)
    assert np.abs(pattern.sum(-1) - 1).max() > 0.1  # not a softmax
    assert (pattern[..., np.tril(np.ones((16, 16), bool))] == 0).mean() > 0.1  # the ReLU cuts


def test_relu_attention_is_refused_where_it_does_not_exist(tmp_path):
    from probe.io.checkpoint import export_garg
    from probe.models.config import ModelConfig

    with pytest.raises(ConfigError, match="attn_activation applies to the gpt2 family only"):
        ModelConfig(family="lstm", attn_activation="relu")
    with pytest.raises(ConfigError, match="attn_activation.*Did you mean: relu"):
        ModelConfig(attn_activation="rel")
    from conftest import relu_attention_model

    model, _ = relu_attention_model()
    cfg = build_cfg()
    cfg.model.attn_activation = "relu"
    with pytest.raises(ConfigError, match="softmax attention only"):
        export_garg(model, cfg, tmp_path / "g")


def _hf_run(tmp_path, width_in_head: int = 16):
    import json

    from safetensors.torch import save_file

    torch.manual_seed(4)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    ref._backbone.save_pretrained(tmp_path / "hf")
    head = {"read_in.weight": torch.randn(width_in_head, 3), "read_in.bias": torch.zeros(width_in_head),
            "read_out.weight": torch.randn(1, width_in_head), "read_out.bias": torch.zeros(1)}
    save_file(head, str(tmp_path / "hf" / "icl_head.safetensors"))
    return tmp_path / "hf", json.loads((tmp_path / "hf" / "config.json").read_text())


def test_hf_checkpoints_declare_their_task_and_head_errors_name_the_head(tmp_path):
    import json

    from probe.core.errors import CheckpointError

    path, config = _hf_run(tmp_path)
    assert load_checkpoint(path).config.task.noise_std == 0.0  # no declaration: the default task
    config["icl_task"] = {"noise_std": 0.5, "n_points": 6}
    (path / "config.json").write_text(json.dumps(config))
    task = load_checkpoint(path).config.task
    assert (task.name, task.noise_std, task.n_points, task.n_dims) == ("linear_regression", 0.5, 6, 3)
    config["icl_task"] = {"noise": 0.5}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: icl_task: Unknown key 'noise'"):
        load_checkpoint(path)
    config["icl_task"] = {"n_dims": 5}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="icl_task has n_dims = 5"):
        load_checkpoint(path)
    path, _ = _hf_run(tmp_path / "wide", width_in_head=32)
    with pytest.raises(CheckpointError, match=r"icl_head.safetensors: read_in.weight has shape \(32, 3\)"):
        load_checkpoint(path)


def test_double_capture_runs_a_float64_copy_and_agrees_with_float32():
    """`double=True` (the probes' default precision): float64 streams from a float64 copy of the
    model, equal to the float32 capture to float32 round-off; the caller's model stays float32."""
    from probe.analysis.probe_study import ProbeSettings
    from probe.capture.streams import by_position_streams

    torch.manual_seed(0)
    model = build_model(build_cfg(layers=2).model).eval()
    xs, ys = torch.randn(5, 6, 3), torch.randn(5, 6)
    single = capture(model, xs, ys, hooks=[RESID]).acts[RESID]
    double = capture(model, xs, ys, hooks=[RESID], double=True).acts[RESID]
    assert double.dtype == np.float64 and single.dtype == np.float32
    np.testing.assert_allclose(double, single, atol=1e-5, rtol=1e-5)
    assert next(model.parameters()).dtype == torch.float32
    streams = by_position_streams(model, xs, ys, dtype=torch.float64)
    np.testing.assert_array_equal(streams.numpy(), double.transpose(0, 2, 1, 3))
    with pytest.raises(ConfigError, match=r"probes.precision: Unknown value 'float16'. Did you mean: float\d\d\? Known: float32, float64"):
        ProbeSettings(precision="float16")


def test_weights_edited_in_place_are_seen_by_the_next_capture():
    """After an in-place edit the next capture runs the edited model (each runs its own hooked
    forward: nothing built from the weights is cached)."""
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    torch.manual_seed(0)
    gpt2 = build_model(build_cfg(layers=2).model).eval()
    planted = plant(planted_config("gd", 3, 3, 8, step_size=0.1).model)
    for model, weight in ((gpt2, lambda m: m._backbone.h[0].mlp.c_fc.weight), (planted, lambda m: m.v)):
        g = torch.Generator().manual_seed(2)
        xs, ys = torch.randn(4, 8, 3, generator=g), torch.randn(4, 8, generator=g)
        hooks = ["blocks.0.hook_resid_post"]  # a named hook: the hooked path
        before = capture(model, xs, ys, hooks=hooks).pred
        with torch.no_grad():
            weight(model).mul_(1.5)
        after = capture(model, xs, ys, hooks=hooks).pred
        with torch.no_grad():
            expected = model(xs, ys).numpy()
        assert not np.allclose(before, after)
        np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-5)


def test_capture_refuses_prompts_whose_predictions_overflow(tmp_path, capsys):
    """Prompts at 1e30 made the default checkpoint's LayerNorm overflow: NaN predictions and
    activations written with exit 0. Now one message naming the input scale, and no file."""
    import numpy as np
    from conftest import REPO

    from probe.cli import main

    g = np.random.default_rng(0)
    np.savez(tmp_path / "p.npz", xs=g.standard_normal((4, 16, 4)) * 1e30, ys=g.standard_normal((4, 16)) * 1e30)
    out = tmp_path / "acts.npz"
    assert main(["-q", "capture", str(REPO / "checkpoints" / "gpt2-default"), "--prompts", str(tmp_path / "p.npz"),
                 "--out", str(out)]) != 0
    assert "overflow to NaN or inf on these prompts (inputs reach |value| " in capsys.readouterr().err
    assert not out.exists()
