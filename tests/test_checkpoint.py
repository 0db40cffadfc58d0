import os
import pickle

import pytest
import torch
from conftest import REPO, GargTransformerModel, build_cfg, write_garg_run

from probe.core.errors import CheckpointError
from probe.io.checkpoint import export_garg, save_model
from probe.io.formats import load_checkpoint
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


# Garg et al.'s src/schema.py: the keys their QuinineArgumentParser requires or reads, by block.
GARG_SCHEMA = {
    "model": {"family", "n_positions", "n_dims", "n_embd", "n_layer", "n_head"},
    "training": {"task", "task_kwargs", "num_tasks", "num_training_examples", "data", "batch_size",
                 "learning_rate", "train_steps", "save_every_steps", "keep_every_steps", "resume_id", "curriculum"},
    "wandb": {"project", "entity", "notes", "name", "log_every_steps"},
}


def test_garg_export_resumes_and_evaluates_in_their_code(tmp_path):
    import yaml

    cfg = build_cfg()
    model = build_model(cfg.model).eval()
    export_garg(model, cfg, tmp_path / "garg", train_step=7)
    conf = yaml.safe_load((tmp_path / "garg" / "config.yaml").read_text())
    assert {k for k in conf if k in GARG_SCHEMA} == set(GARG_SCHEMA) and "out_dir" in conf and conf["test_run"] is False
    for block, keys in GARG_SCHEMA.items():
        assert keys <= set(conf[block]), (block, keys - set(conf[block]))
    for stage in ("dims", "points"):  # their Curriculum reads all four, as integers
        assert {k: type(v) for k, v in conf["training"]["curriculum"][stage].items()} == \
            {"start": int, "end": int, "inc": int, "interval": int}
    # build_evals: n_points from the points curriculum's end, the task and data by name
    assert conf["training"]["curriculum"]["points"]["end"] == cfg.task.n_points
    assert conf["training"]["task"] == "linear_regression" and conf["training"]["data"] == "gaussian"
    # train.py's resume path: load both state dicts, then take an optimizer step
    blob = torch.load(tmp_path / "garg" / "state.pt", weights_only=True)
    ref = GargTransformerModel(3, 8, 16, 2, 2)
    ref.load_state_dict(blob["model_state_dict"])
    opt = torch.optim.Adam(ref.parameters(), lr=conf["training"]["learning_rate"])
    opt.load_state_dict(blob["optimizer_state_dict"])
    xs = torch.randn(4, 8, 3)
    loss = ((ref(xs, xs.sum(-1)) - xs.sum(-1)) ** 2).mean()
    loss.backward()
    opt.step()
    assert blob["train_step"] == 7 and len(opt.state) == sum(p.grad is not None for p in ref.parameters())  # wte has no gradient


def test_garg_export_tasks_and_refusals(tmp_path):
    import yaml

    from probe.core.errors import ConfigError
    from probe.io.run_config import RunConfig

    noisy = RunConfig.from_dict({**build_cfg().to_dict(), "task": {**build_cfg().to_dict()["task"], "noise_std": 0.5, "w_scale": 2.0}})
    export_garg(build_model(noisy.model), noisy, tmp_path / "noisy")
    training = yaml.safe_load((tmp_path / "noisy" / "config.yaml").read_text())["training"]
    assert training["task"] == "noisy_linear_regression" and training["task_kwargs"] == {"scale": 2.0, "noise_std": 0.5}
    ill = RunConfig.from_dict({**build_cfg().to_dict(), "task": {**build_cfg().to_dict()["task"], "covariance": "ill_conditioned"}})
    with pytest.raises(ConfigError, match="ill_conditioned inputs has no equivalent in Garg"):
        export_garg(build_model(ill.model), ill, tmp_path / "ill")
    assert not (tmp_path / "ill").exists()


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


@pytest.mark.parametrize(
    ("change", "culprit"),
    [
        ({"task": "decision_tree"}, "training.task 'decision_tree' is not supported: icl-probe has no decision-tree"),
        ({"task": "relu_2nn_regression"}, "training.task 'relu_2nn_regression' is not supported: their 2-layer network"),
        ({"task": "cubic"}, "training.task 'cubic' is not a task icl-probe knows"),
        ({"data": "uniform"}, "training.data 'uniform' is not supported"),
        ({"task": "noisy_linear_regression", "task_kwargs": {"noise_std": 1.0, "renormalize_ys": True}},
         "training.task_kwargs.renormalize_ys = True changes the noisy_linear_regression task"),
        ({"task_kwargs": {"hidden_layer_size": 4}}, "training.task_kwargs.hidden_layer_size = 4"),
        ({"curriculum": {"points": {"start": 4, "end": 99, "inc": 1, "interval": 10}}},
         r"training.curriculum.points.end = 99 must be an integer in 1..model.n_positions \(8\)"),
    ],
)
def test_garg_configs_are_read_or_refused_by_name(tmp_path, change, culprit):
    import yaml
    from conftest import GargTransformerModel, write_garg_run

    run = write_garg_run(tmp_path / "g", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    conf = yaml.safe_load((run / "config.yaml").read_text())
    conf["training"].update(change)
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    with pytest.raises(CheckpointError, match=culprit):
        load_checkpoint(run)


def test_garg_configs_honour_the_evaluation_length_noise_and_sparsity(tmp_path):
    import yaml
    from conftest import GargTransformerModel, write_garg_run

    run = write_garg_run(tmp_path / "g", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    conf = yaml.safe_load((run / "config.yaml").read_text())
    conf["training"]["curriculum"]["points"]["end"] = 6  # their evaluation's prompt length
    conf["training"]["task"] = "sparse_linear_regression"
    conf["training"]["task_kwargs"] = {"valid_coords": 3}
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    task = load_checkpoint(run).config.task
    assert (task.name, task.n_points, task.sparsity) == ("sparse_linear_regression", 6, 3)  # their default sparsity
    conf["training"].update(task="noisy_linear_regression", task_kwargs={"noise_std": 0.5, "scale": 2.0})
    (run / "config.yaml").write_text(yaml.safe_dump(conf))
    task = load_checkpoint(run).config.task
    assert (task.name, task.noise_std, task.w_scale) == ("linear_regression", 0.5, 2.0)


def _resume_like_garg(run, steps: int = 15, lr: float | None = None, fresh: bool = False):
    """Garg et al.'s train.py resume path (src/train.py): their TransformerModel, Adam at
    training.learning_rate, optimizer.load_state_dict(state.pt's), then plain steps on MSE."""
    import yaml

    from probe.data.tasks import generator_for, sample_prompts
    from probe.io.checkpoint import fresh_adam_state

    conf = yaml.safe_load((run / "config.yaml").read_text())
    blob = torch.load(run / "state.pt", weights_only=True)
    m = conf["model"]
    model = GargTransformerModel(m["n_dims"], m["n_positions"], m["n_embd"], m["n_layer"], m["n_head"])
    model.load_state_dict(blob["model_state_dict"])
    rate = lr or conf["training"]["learning_rate"]
    opt = torch.optim.Adam(model.parameters(), lr=rate)
    opt.load_state_dict(fresh_adam_state(len(list(model.parameters())), rate) if fresh else blob["optimizer_state_dict"])
    task = load_checkpoint(REPO / "checkpoints" / "gpt2-default").config.task
    test = sample_prompts(task, 1024, generator=generator_for(123))
    error = lambda: float(((model(test.xs, test.ys) - test.ys) ** 2).mean())
    with torch.no_grad():
        before = error()
    for step in range(steps):
        p = sample_prompts(task, 64, generator=generator_for(7, step))
        opt.zero_grad()
        ((model(p.xs, p.ys) - p.ys) ** 2).mean().backward()
        opt.step()
    with torch.no_grad():
        return before, error()


@pytest.mark.slow
def test_resuming_an_export_in_gargs_way_does_not_make_the_model_worse(tmp_path):
    """The export continues at our schedule's last learning rate (5e-5 for the shipped default),
    so 15 of their Adam steps leave the error where it was; the peak rate with fresh moments (what
    the export used to write) makes it clearly worse: the check can fail."""
    from probe.cli import main

    assert main(["-q", "export", str(REPO / "checkpoints" / "gpt2-default"), "--out", str(tmp_path / "g")]) == 0
    before, after = _resume_like_garg(tmp_path / "g")
    assert after <= 1.01 * before
    _, worse = _resume_like_garg(tmp_path / "g", lr=1e-3, fresh=True)
    assert worse > 1.05 * before


def test_export_carries_a_runs_adam_moments_into_their_parameter_order(tmp_path):
    from probe.cli import main
    from probe.training.train import train

    cfg = build_cfg(steps=12, save_every=12, eval_every=12)
    train(cfg, tmp_path / "run", progress=False)
    assert main(["-q", "export", str(tmp_path / "run"), "--out", str(tmp_path / "g")]) == 0
    ours = torch.load(tmp_path / "run" / "train_state.pt", weights_only=True)["optimizer"]
    theirs = torch.load(tmp_path / "g" / "state.pt", weights_only=True)["optimizer_state_dict"]
    names = [n for n, _ in build_model(cfg.model).named_parameters()]
    order = [*names[:2], "_backbone.wte.weight", *names[2:]]  # their TransformerModel: wte before wpe
    assert len(theirs["param_groups"][0]["params"]) == len(order)
    for i, name in enumerate(names):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(theirs["state"][order.index(name)][key], ours["state"][i][key])
    assert order.index("_backbone.wte.weight") not in theirs["state"]  # no gradient ever: Adam starts it at zero


def test_a_config_whose_head_count_no_longer_matches_the_weights_is_refused(tmp_path):
    """n_head changes no weight shape, so only the recorded predictions can tell: a checkpoint saved
    with 2 heads and reloaded with a config saying 4 is refused, naming the check; unchanged it loads."""
    import json

    from probe.core.errors import CheckpointError
    from probe.io.formats import load_checkpoint
    from probe.models import build_model

    cfg = build_cfg(layers=2)
    torch.manual_seed(3)
    model = build_model(cfg.model)
    with torch.no_grad():
        for p in model.parameters():  # attention patterns far from uniform, so the head count matters
            p.normal_(0, 0.5)
    save_model(model, cfg, tmp_path / "ck")
    assert len(load_checkpoint(tmp_path / "ck").meta["signature"]) == 2 * cfg.model.n_positions
    payload = json.loads((tmp_path / "ck" / "config.json").read_text())
    payload["config"]["model"]["n_head"] = 4 if cfg.model.n_head != 4 else 2
    (tmp_path / "ck" / "config.json").write_text(json.dumps(payload))
    with pytest.raises(CheckpointError, match=r"do not reproduce the predictions recorded .*check n_head"):
        load_checkpoint(tmp_path / "ck")
