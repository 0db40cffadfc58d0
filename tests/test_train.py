import csv
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, build_cfg
from probe.errors import CheckpointError, ConfigError
from probe.models import build_model
from probe.train import held_out_error, learning_rate, train


def _losses(path):
    with open(path / "train_log.csv") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def test_a_few_steps_lower_the_loss(tmp_path):
    cfg = build_cfg(d=2, points=6, steps=100, batch_size=64, log_every=1, save_every=100, eval_every=100,
                    lr=3e-3, eval_prompts=256)
    torch.manual_seed(cfg.train.seed)
    before = held_out_error(build_model(cfg.model), cfg, "cpu")["error_mean"]
    after = held_out_error(train(cfg, tmp_path / "run", progress=False), cfg, "cpu")["error_mean"]
    assert after < 0.95 * before
    losses = [l for _, l in _losses(tmp_path / "run")]
    assert sum(losses[-20:]) < sum(losses[:20])


def test_killed_and_resumed_run_reproduces_losses(tmp_path):
    cfg = build_cfg(steps=30, log_every=1, save_every=10, eval_every=10)
    train(cfg, tmp_path / "full", progress=False)
    # "kill" after 20 steps: train a run whose schedule is the same but stops at step 20
    partial = build_cfg(steps=30, log_every=1, save_every=10, eval_every=10)
    train(partial, tmp_path / "cut", progress=False)
    # simulate the kill by rolling the second run back to its step-20 state
    import shutil

    shutil.rmtree(tmp_path / "cut")
    _train_until(partial, tmp_path / "cut", stop_after=20)
    train(partial, tmp_path / "cut", resume=True, progress=False)
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "full")


def _train_until(cfg, out, stop_after):
    """Run training and interrupt it (as a kill would) right after step `stop_after` is saved."""
    import probe.train as tr

    original = tr.save_training_state

    class Killed(Exception):
        pass

    def save_then_die(model, optimizer, cfg_, out_, step, elapsed):
        original(model, optimizer, cfg_, out_, step, elapsed)
        if step >= stop_after:
            raise Killed

    tr.save_training_state = save_then_die
    try:
        with pytest.raises(Killed):
            train(cfg, out, progress=False)
    finally:
        tr.save_training_state = original


def test_refuses_to_overwrite_and_resume_needs_state(tmp_path):
    cfg = build_cfg(steps=10, save_every=10, eval_every=10)
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="already holds a training run; pass --resume"):
        train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(CheckpointError, match="has no train_state.pt to resume from"):
        train(cfg, tmp_path / "empty", resume=True, progress=False)


def test_learning_rate_schedule():
    cfg = build_cfg(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    assert learning_rate(cfg, 0) == pytest.approx(0.1)
    assert learning_rate(cfg, 9) == pytest.approx(1.0)
    assert learning_rate(cfg, 10) == pytest.approx(1.0)
    assert learning_rate(cfg, 100) == pytest.approx(0.1)


@pytest.mark.slow
def test_two_process_gloo_ddp(tmp_path):
    """torchrun with 2 CPU processes trains and writes one run directory."""
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "probe", "-q", "train", "--recipe", str(REPO / "recipes" / "tiny.toml"),
           "--set", "train.steps=6", "--set", "train.save_every=6", "--set", "train.eval_every=6", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "model.safetensors").exists()
    from probe.checkpoint import load_checkpoint

    assert load_checkpoint(out).meta["train_step"] == 6
