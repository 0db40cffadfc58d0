import os
import pickle

import pytest
import torch
from conftest import GargTransformerModel, build_cfg, write_garg_run

from probe.checkpoint import export_garg, load_checkpoint, save_model
from probe.errors import CheckpointError
from probe.models import build_model


@pytest.mark.parametrize("family", ["gpt2", "lstm"])
def test_save_load_identical_outputs(tmp_path, family):
    cfg = build_cfg(family=family)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    save_model(model, cfg, tmp_path / "run")
    loaded = load_checkpoint(tmp_path / "run")
    assert loaded.format == "icl-probe" and loaded.config == cfg
    xs, ys = torch.randn(3, 8, 3), torch.randn(3, 8)
    assert torch.equal(model(xs, ys), loaded.model(xs, ys))


def test_garg_export_has_their_exact_keys_and_shapes(tmp_path):
    cfg = build_cfg()
    model = build_model(cfg.model).eval()
    export_garg(model, cfg, tmp_path / "garg")
    blob = torch.load(tmp_path / "garg" / "state.pt", weights_only=True)
    reference = GargTransformerModel(3, 8, 16, 2, 2).state_dict()
    assert {k: tuple(v.shape) for k, v in blob["model_state_dict"].items()} == \
        {k: tuple(v.shape) for k, v in reference.items()}
    # their model loads it strictly and predicts as ours does
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    ref.load_state_dict(blob["model_state_dict"])
    xs, ys = torch.randn(3, 8, 3), torch.randn(3, 8)
    torch.testing.assert_close(ref(xs, ys), model(xs, ys), rtol=0, atol=1e-5)
    # and it loads back into ours
    again = load_checkpoint(tmp_path / "garg")
    assert again.format == "garg"
    torch.testing.assert_close(again.model(xs, ys), model(xs, ys), rtol=0, atol=0)


@pytest.mark.parametrize("prefix", ["", "module.", "_orig_mod."])
@pytest.mark.parametrize("name", ["state.pt", "model_100.pt"])
def test_load_garg_run_directory(tmp_path, prefix, name):
    torch.manual_seed(1)
    ref = GargTransformerModel(3, 8, 16, 2, 2).eval()
    legacy = {f"_backbone.h.{i}.attn.{b}": torch.zeros(1, 1, 16, 16) for i in range(2) for b in ("bias", "masked_bias")}
    write_garg_run(tmp_path / "run", ref, 3, 8, 16, 2, 2, prefix=prefix, extra=legacy, name=name)
    loaded = load_checkpoint(tmp_path / "run")
    xs, ys = torch.randn(5, 8, 3), torch.randn(5, 8)
    torch.testing.assert_close(loaded.model(xs, ys), ref(xs, ys), rtol=0, atol=1e-5)


def test_missing_directory():
    with pytest.raises(CheckpointError, match="Checkpoint not found: /no/such/run"):
        load_checkpoint("/no/such/run")


def test_directory_without_checkpoint_lists_formats_tried(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match=r"Tried icl-probe: no config.json; garg: no config.yaml; hf-gpt2"):
        load_checkpoint(tmp_path)


def test_corrupt_and_truncated_files(tmp_path):
    ref = GargTransformerModel(3, 8, 16, 2, 2)
    run = write_garg_run(tmp_path / "garg", ref, 3, 8, 16, 2, 2)
    data = (run / "state.pt").read_bytes()
    (run / "state.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"state\.pt: not a readable PyTorch file"):
        load_checkpoint(run)
    cfg = build_cfg()
    save_model(build_model(cfg.model), cfg, tmp_path / "own")
    weights = tmp_path / "own" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load_checkpoint(tmp_path / "own")


def test_mismatched_config_names_keys(tmp_path):
    ref = GargTransformerModel(3, 8, 16, 2, 2)
    run = write_garg_run(tmp_path / "run", ref, 3, 8, 16, 3, 2)  # config says 3 layers, weights have 2
    with pytest.raises(CheckpointError, match=r"missing keys \[_backbone\.h\.2\.attn\.c_attn\.bias"):
        load_checkpoint(run)
    run = write_garg_run(tmp_path / "run2", ref, 3, 8, 32, 2, 2)  # width differs
    with pytest.raises(CheckpointError, match=r"shape mismatches \[_backbone\.h\.0\.attn\.c_attn\.bias: file \(48,\) vs config \(96,\)"):
        load_checkpoint(run)


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_refused_and_not_run(tmp_path):
    run = write_garg_run(tmp_path / "run", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    marker = tmp_path / "pwned"
    exploit = _Exploit()
    exploit.marker = marker
    with open(run / "state.pt", "wb") as f:
        pickle.dump({"model_state_dict": exploit}, f)
    with pytest.raises(CheckpointError, match="refused to load: the file holds pickled Python objects"):
        load_checkpoint(run)
    assert not marker.exists()
