import csv
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, build_cfg

from probe.core.errors import CheckpointError, ConfigError
from probe.models import build_model
from probe.training.train import held_out_error, learning_rate, train


def _losses(path):
    with open(path / "train_log.csv") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_a_few_steps_lower_the_loss(tmp_path):
    cfg = build_cfg(d=2, points=6, steps=100, batch_size=64, log_every=1, save_every=100, eval_every=100,
                    lr=3e-3, eval_prompts=256)
    torch.manual_seed(cfg.train.seed)
    before = held_out_error(build_model(cfg.model), cfg, "cpu")["error_mean"]
    after = held_out_error(train(cfg, tmp_path / "run", progress=False), cfg, "cpu")["error_mean"]
    assert after < 0.95 * before
    losses = [l for _, l in _losses(tmp_path / "run")]
    assert sum(losses[-20:]) < sum(losses[:20])


@pytest.mark.slow
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
    import probe.training.train as tr

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
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "model.safetensors").exists()
    from probe.io.formats import load_checkpoint

    assert load_checkpoint(out).meta["train_step"] == 6


class _Killed(BaseException):
    """A kill: not an Exception, so nothing in the code under test can swallow it."""


def _final_state(out):
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


@pytest.mark.slow
def test_kill_at_every_write_boundary_resumes_consistently(tmp_path, monkeypatch):
    """Kill before each file write of the run (weights, config, train_state, snapshots, logs); a
    resume must then finish with exactly the uninterrupted run's weights and losses."""
    import probe.io.checkpoint as ck
    import probe.training.train as tr

    cfg = build_cfg(steps=12, log_every=1, save_every=4, eval_every=4)
    train(cfg, tmp_path / "full", progress=False, keep_every=4)
    reference, losses = _final_state(tmp_path / "full"), _losses(tmp_path / "full")

    original = ck.atomic_write
    writes = []

    def counting(path, write):
        writes.append(path.name)
        original(path, write)

    monkeypatch.setattr(ck, "atomic_write", counting)
    monkeypatch.setattr(tr, "atomic_write", counting)
    train(cfg, tmp_path / "count", progress=False, keep_every=4)
    n_writes = len(writes)
    assert n_writes >= 9  # 3 saves x (weights, config, state) + snapshots
    for kill_at in range(1, n_writes):
        out = tmp_path / f"kill{kill_at}"
        calls = [0]

        def dying(path, write, kill_at=kill_at, calls=calls):
            calls[0] += 1
            if calls[0] == kill_at:
                raise _Killed
            original(path, write)

        monkeypatch.setattr(ck, "atomic_write", dying)
        monkeypatch.setattr(tr, "atomic_write", dying)
        with pytest.raises(_Killed):
            train(cfg, out, progress=False, keep_every=4)
        monkeypatch.setattr(ck, "atomic_write", original)
        monkeypatch.setattr(tr, "atomic_write", original)
        if (out / "train_state.pt").exists():
            train(cfg, out, resume=True, progress=False, keep_every=4)
        else:  # killed before the first commit: nothing to resume, a fresh run is the fix
            assert not out.exists() or not list(out.glob("*.pt"))
            import shutil

            shutil.rmtree(out, ignore_errors=True)
            train(cfg, out, progress=False, keep_every=4)
        final = _final_state(out)
        assert all(torch.equal(final[k], reference[k]) for k in reference), f"kill at write {kill_at}"
        assert _losses(out) == losses, f"kill at write {kill_at}"
        for snap in (tmp_path / "full" / "snapshots").iterdir():
            assert (out / "snapshots" / snap.name / "model.safetensors").is_file()


def test_resume_refuses_old_state_whose_weights_ran_ahead(tmp_path):
    """A train_state.pt from before states carried weights, with model.safetensors from a later
    step (the kill the hostile pass found), is refused rather than mixed."""
    cfg = build_cfg(steps=8, save_every=4, eval_every=4)
    train(cfg, tmp_path / "run", progress=False)
    state = torch.load(tmp_path / "run" / "train_state.pt", weights_only=True)
    del state["model"]
    state["step"] = 4
    torch.save(state, tmp_path / "run" / "train_state.pt")
    with pytest.raises(CheckpointError, match="from step 8 but train_state.pt from step 4"):
        train(cfg, tmp_path / "run", resume=True, progress=False)


def test_training_writes_only_its_own_files_and_one_run_at_a_time(tmp_path):
    """Logs are replaced, never edited in place (a hard-linked copy of the run keeps its logs when
    the run resumes); a symlinked log or snapshots/ is refused before any step; a second writer
    of the same run directory is refused while the first holds it."""
    from probe.core.errors import OutputError
    from probe.training.train import LOCK, run_lock

    cfg = build_cfg(steps=20, log_every=1, save_every=10, eval_every=10)
    train(cfg, tmp_path / "run", progress=False)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("train_log.csv", "eval_log.csv"):
        os.link(tmp_path / "run" / name, copy / name)
    before = {name: (copy / name).read_text() for name in ("train_log.csv", "eval_log.csv")}
    longer = build_cfg(steps=30, log_every=1, save_every=10, eval_every=10)
    train(longer, tmp_path / "run", resume=True, progress=False)
    assert {name: (copy / name).read_text() for name in before} == before
    assert len(_losses(tmp_path / "run")) == 30
    assert not (tmp_path / "run" / LOCK).exists()  # released and removed at the end

    outside = tmp_path / "elsewhere.csv"
    outside.write_text("the user's file\n")
    (tmp_path / "run" / "train_log.csv").unlink()
    (tmp_path / "run" / "train_log.csv").symlink_to(outside)
    with pytest.raises(OutputError, match="train_log.csv is a symbolic link"):
        train(build_cfg(steps=40, log_every=1, save_every=10, eval_every=10), tmp_path / "run", resume=True,
              progress=False)
    assert outside.read_text() == "the user's file\n"

    busy = r"another `icl-probe train` \(pid \d+\) is writing this run"
    with run_lock(tmp_path / "busy"), pytest.raises(OutputError, match=busy):
        train(cfg, tmp_path / "busy", progress=False)
    train(cfg, tmp_path / "busy", progress=False)  # free again


def test_eval_log_steps_are_steps_done_like_snapshots(tmp_path):
    """eval_log's step is the number of steps taken, as in snapshots/step_<k>/ and train_state.pt,
    also after a resume (no row lost or repeated)."""
    cfg = build_cfg(steps=20, log_every=1, save_every=10, eval_every=10)
    train(cfg, tmp_path / "run", progress=False, keep_every=10)
    longer = build_cfg(steps=30, log_every=1, save_every=10, eval_every=10)
    train(longer, tmp_path / "run", resume=True, progress=False, keep_every=10)
    with open(tmp_path / "run" / "eval_log.csv") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    snapshots = sorted(int(p.name.removeprefix("step_")) for p in (tmp_path / "run" / "snapshots").iterdir())
    assert steps == snapshots == [10, 20, 30]


def test_estimated_adam_moments_resume_at_adam_s_usual_step_size():
    """Zero moments make Adam's first step move every weight by its learning rate; the estimated
    moments (mean g, mean g^2 over batches) make it lr * |mean g| / rms g at most (on the trained
    default about 0.25 lr: its gradients are mostly noise), equal to a hand computation of Adam's
    update from the same moments."""
    import copy

    from probe.training.train import estimated_adam_state

    torch.manual_seed(0)
    cfg = build_cfg(layers=2)
    model = build_model(cfg.model)
    state = estimated_adam_state(model, cfg, step=1000, batches=8)
    assert set(state["state"]) == set(range(len(list(model.parameters()))))
    lr = 1e-3

    def first_step(load: bool) -> list[torch.Tensor]:
        net = build_model(cfg.model)
        net.load_state_dict(model.state_dict())
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
        if load:
            opt.load_state_dict(copy.deepcopy(state))  # Adam updates loaded moments in place
            for group in opt.param_groups:
                group["lr"] = lr
        before = [p.detach().clone() for p in net.parameters()]
        for p in net.parameters():
            p.grad = torch.zeros_like(p)  # a zero gradient: the step is the moments' alone
        opt.step()
        return [(p.detach() - b) for p, b in zip(net.parameters(), before)]

    moved = first_step(load=True)
    for delta, s in zip(moved, state["state"].values()):
        m, v, t = 0.9 * s["exp_avg"], 0.999 * s["exp_avg_sq"], 1001
        expected = -lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
        torch.testing.assert_close(delta, expected, rtol=1e-3, atol=1e-7)  # float32 weights
    for s in state["state"].values():  # |mean g| <= rms g: a resumed step never exceeds lr (zero moments: ~lr)
        assert bool((s["exp_avg"].abs() <= s["exp_avg_sq"].sqrt() * (1 + 1e-5) + 1e-12).all())


def test_train_refuses_held_out_prompts_it_cannot_hold_before_any_work(tmp_path, capsys):
    from probe.cli import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--recipe", "tiny", "--set", "train.eval_prompts=1000000000", "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and "train.eval_prompts = 1000000000 would need about" in err and "lower train.eval_prompts" in err
    assert not out.exists()


def test_keep_at_keeps_snapshots_at_the_listed_steps_also_across_a_resume(tmp_path):
    """--keep-at 3,7,12: snapshots at exactly those step counts (not at every save), the last one
    written by a resumed run; a step outside 1..train.steps is refused with a message."""
    cfg = build_cfg(steps=8, log_every=1, save_every=4, eval_every=4)
    train(cfg, tmp_path / "run", progress=False, keep_at=(3, 7))
    longer = build_cfg(steps=12, log_every=1, save_every=4, eval_every=4)
    train(longer, tmp_path / "run", resume=True, progress=False, keep_at=(3, 7, 12))
    kept = sorted(int(p.name.removeprefix("step_")) for p in (tmp_path / "run" / "snapshots").iterdir())
    assert kept == [3, 7, 12]
    with pytest.raises(ConfigError, match=r"--keep-at: 0 is not a step count between 1 and train.steps = 8"):
        train(cfg, tmp_path / "bad", progress=False, keep_at=(0, 4))


def test_keep_at_flag_parses_a_comma_list_and_refuses_other_text():
    import argparse

    from probe.cli.train import _step_list

    assert _step_list("500,900,1600") == (500, 900, 1600)
    with pytest.raises(argparse.ArgumentTypeError, match="not a comma-separated list of step counts"):
        _step_list("500;900")
    with pytest.raises(argparse.ArgumentTypeError, match="positive whole numbers"):
        _step_list("0,5")
