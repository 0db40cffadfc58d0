import pytest
import torch

from probe.models import build_model
from probe.models.config import ModelConfig
from probe.models.encoding import interleave


@pytest.mark.parametrize("family", ["gpt2", "lstm", "lstm_residual"])
@pytest.mark.parametrize("encoding", ["garg", "akyurek"])
def test_causality(family, encoding):
    """Changing example t+1 or later never changes the prediction at x_t."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family=family, n_dims=3, n_positions=6, n_embd=16, n_layer=2, n_head=2,
                                    encoding=encoding)).eval()
    xs, ys = torch.randn(2, 6, 3), torch.randn(2, 6)
    base = model(xs, ys)
    for t in range(6):
        xs2, ys2 = xs.clone(), ys.clone()
        xs2[:, t + 1 :] += 1.0
        ys2[:, t:] += 1.0  # y_t itself comes after x_t in the sequence
        pred = model(xs2, ys2)
        torch.testing.assert_close(pred[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-6)
        if t + 1 < 6:
            assert not torch.allclose(pred[:, t + 1 :], base[:, t + 1 :])


def test_residual_lstm_adds_each_layers_output_to_its_input():
    torch.manual_seed(1)
    model = build_model(ModelConfig(family="lstm_residual", n_dims=3, n_positions=5, n_embd=8, n_layer=3)).eval()
    xs, ys = torch.randn(2, 5, 3), torch.randn(2, 5)
    out = model.run(xs, ys)
    for layer, lstm in enumerate(model._layers):
        torch.testing.assert_close(out.resid[layer + 1], out.resid[layer] + lstm(out.resid[layer])[0])
    plain = build_model(ModelConfig(family="lstm", n_dims=3, n_positions=5, n_embd=8, n_layer=3)).eval()
    plain.load_state_dict(model.state_dict())  # same parameters, stacked without the skip
    assert not torch.allclose(plain(xs, ys), model(xs, ys))


def test_encodings():
    xs = torch.arange(12.0).view(1, 2, 6)[:, :, :3].reshape(1, 2, 3)
    ys = torch.tensor([[10.0, 20.0]])
    garg = interleave(xs, ys, "garg")
    assert garg.tolist() == [[[0, 1, 2], [10, 0, 0], [6, 7, 8], [20, 0, 0]]]
    aky = interleave(xs, ys, "akyurek")
    assert aky.tolist() == [[[0, 0, 1, 2], [10, 0, 0, 0], [0, 6, 7, 8], [20, 0, 0, 0]]]


def test_hidden_states_match_hugging_face_conventions():
    """resid[l] equals HF hidden_states[l] for l < L; HF's last entry is after ln_f = our `final`."""
    from conftest import GargTransformerModel

    torch.manual_seed(0)
    ours = build_model(ModelConfig(n_dims=3, n_positions=6, n_embd=16, n_layer=3, n_head=2)).eval()
    ref = GargTransformerModel(3, 6, 16, 3, 2).eval()
    sd = dict(ours.state_dict())
    sd["_backbone.wte.weight"] = torch.zeros(50257, 16)
    ref.load_state_dict(sd)
    xs, ys = torch.randn(4, 6, 3), torch.randn(4, 6)
    out = ours.run(xs, ys)
    hf = ref._backbone(inputs_embeds=ref._read_in(ref._combine(xs, ys)), output_hidden_states=True)
    for layer in range(3):
        torch.testing.assert_close(out.resid[layer], hf.hidden_states[layer], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.final, hf.hidden_states[3], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.pred, ref(xs, ys), rtol=0, atol=1e-5)
    assert len(out.resid) == 4  # embeddings + one per block, raw (before ln_f)


@pytest.mark.parametrize(
    "family", ["gpt2", "lstm", "lstm_residual", "lsa", "lsa_sparse", "lsa_mlp", "newton", "newton-relu"]
)
def test_the_size_estimate_from_the_config_is_the_built_models(family):
    """`model_bytes` (the memory checks before building a model or loading a checkpoint) reads its
    family class's `parameter_count`: 4 bytes per parameter of the model actually built."""
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant
    from probe.models.sizes import model_bytes

    if family.startswith("newton"):
        cfg = planted_config(family, 5, 4, 12).model
        model = plant(cfg)
    else:
        width = 5 if family.startswith("lsa") else 16
        cfg = ModelConfig(family=family, n_dims=4, n_positions=6, n_embd=width, n_layer=3, n_head=1)
        model = build_model(cfg)
    assert model_bytes(cfg) == 4 * sum(p.numel() for p in model.parameters())


def test_no_code_outside_the_families_dispatches_on_a_family_name():
    """A model family declares its traits (probe/models/base.py FamilyTraits); code elsewhere asks
    `family_class(name)`, never compares the name."""
    import inspect
    import re
    from pathlib import Path

    import probe
    from probe.models import FAMILIES, family_class

    root = Path(probe.__file__).parent
    names = "|".join(sorted(FAMILIES.names(), key=len, reverse=True))
    own = {Path(inspect.getfile(FAMILIES.get(name))) for name in FAMILIES.names()}  # each family's own module
    pattern = re.compile(rf"""family["'\])]*(\s*,[^)]*\))?\s*(==|!=|in)\s*[(\[]?\s*["']({names})["']""")
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        if p not in own
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) or 'hasattr(model, "resume")' in line
    ]
    assert found == []
    assert family_class("gpt2").garg_format and not family_class("lstm").garg_format
    assert family_class("lsa").attention_heads and not family_class("planted").random_init
