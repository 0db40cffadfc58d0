"""The GPT-2 forward's hook points (probe/models/hooked.py): named, laid out and valued as a
TransformerLens TransformerBridge of the same weights gives them, readable and editable."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import REPO

from probe import to_bridge
from probe.core.errors import ConfigError
from probe.io.formats import load_checkpoint
from probe.models import build_model


def _models():
    trained = load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    torch.manual_seed(0)
    relu = build_model(dataclasses.replace(trained.config, attn_activation="relu")).eval()
    return {"softmax": trained, "relu": relu}


@pytest.fixture(scope="module")
def models():
    return _models()


def _prompts(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 7, 4, generator=g), torch.randn(3, 7, generator=g)


@pytest.mark.parametrize("attention", ["softmax", "relu"])
def test_every_hook_point_equals_the_bridge_at_the_same_name(models, attention):
    """Every hook point the bridge also has (all but hook_attn_scores, which TransformerLens 4.x's
    bridge reports after the softmax) holds the bridge's tensor, same shape, to float32 round-off."""
    model = models[attention]
    xs, ys = _prompts()
    caught = {}

    def keep(value, hook):
        caught[hook.name] = value.clone()

    with torch.no_grad():
        out = model.run_with_hooks(xs, ys, [(name, keep) for name in model.hook_dict])
        logits, cache = to_bridge(model).run_with_cache((xs, ys))
    names = [n for n in model.hook_dict if not n.endswith("hook_attn_scores")]
    assert len(names) == 2 + 14 * model.n_layers + 1
    for name in names:
        reference = cache[name]
        assert caught[name].shape == reference.shape, name
        scale = reference.abs().max().item()
        assert (caught[name] - reference).abs().max().item() <= 1e-5 * max(scale, 1.0), name
    np.testing.assert_allclose(out.pred.numpy(), logits[:, ::2, 0].numpy(), atol=1e-5)


def test_attention_scores_are_scaled_dot_products_with_unseen_keys_minus_infinity(models):
    model = models["softmax"]
    xs, ys = _prompts(2)
    caught = {}
    with torch.no_grad():
        out = model.run_with_hooks(
            xs,
            ys,
            [
                (n, lambda v, hook: caught.__setitem__(hook.name, v.clone()))
                for n in (
                    "blocks.1.attn.hook_q",
                    "blocks.1.attn.hook_k",
                    "blocks.1.attn.hook_attn_scores",
                    "blocks.1.attn.hook_pattern",
                )
            ],
        )
    q, k = caught["blocks.1.attn.hook_q"].double(), caught["blocks.1.attn.hook_k"].double()
    scores = torch.einsum("bihe,bjhe->bhij", q, k) / np.sqrt(q.shape[-1])
    t = scores.shape[-1]
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    got = caught["blocks.1.attn.hook_attn_scores"].double()
    assert torch.equal(torch.isinf(got), torch.isinf(scores))
    finite = torch.isfinite(scores)
    assert (got[finite] - scores[finite]).abs().max() < 1e-5
    np.testing.assert_allclose(caught["blocks.1.attn.hook_pattern"].double(), torch.softmax(scores, -1), atol=1e-6)
    assert out.pred.shape == (3, 7)


@pytest.mark.parametrize(
    "name, edit",
    [
        ("blocks.0.attn.hook_z", lambda z, hook: z * torch.tensor([0.0, 1, 1, 1]).view(1, 1, 4, 1)),
        ("blocks.1.hook_mlp_out", lambda v, hook: torch.zeros_like(v)),
        ("blocks.2.attn.hook_pattern", lambda p, hook: p.flip(-1).tril()),
        ("blocks.0.ln1.hook_normalized", lambda v, hook: 0.5 * v),
        ("hook_pos_embed", lambda v, hook: torch.zeros_like(v)),
        ("blocks.1.attn.hook_attn_scores", lambda s, hook: 2 * s),
    ],
)
def test_edits_at_a_hook_point_change_the_forward_as_they_change_the_bridge(models, name, edit):
    model = models["softmax"]
    xs, ys = _prompts(3)
    with torch.no_grad():
        plain = model.run(xs, ys).pred
        ours = model.run_with_hooks(xs, ys, [(name, edit)]).pred
        if name.endswith("hook_attn_scores"):  # the bridge's scores hook sees the pattern: check by hand
            assert (ours - plain).abs().max() > 1e-3
            return
        theirs = to_bridge(model).run_with_hooks((xs, ys), fwd_hooks=[(name, edit)])[:, ::2, 0]
    assert (ours - plain).abs().max() > 1e-3
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), atol=1e-4)


def test_hooks_are_removed_after_the_call_even_when_it_raises(models):
    model = models["softmax"]
    xs, ys = _prompts()

    def fail(value, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        model.run_with_hooks(xs, ys, [("blocks.0.hook_resid_post", fail)])
    assert not any(point.fns for point in model.hook_dict.values())
    with pytest.raises(
        ConfigError, match=r"unknown hook 'blocks.0.hook_resid_pots'.*did you mean blocks.0.hook_resid_post"
    ):
        model.run_with_hooks(xs, ys, [("blocks.0.hook_resid_pots", fail)])
