"""The output policy (probe.io.outputs) and the verified stage cache, on the good paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from probe.core.errors import OutputError
from probe.io.outputs import MARKER, OutputTarget, clean_stale, safe_name
from probe.reporting.cache import StageCache


def _publish(target: OutputTarget, files: dict[str, str]):
    staged = target.stage()
    for name, text in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text(text)
    return target.publish(staged)


def test_rerun_replaces_own_output_and_drops_stale_files(tmp_path):
    out = tmp_path / "rep"
    _publish(OutputTarget(out, "report"), {"a.txt": "1", "figures/old.png": "x"})
    assert (out / MARKER).is_file()
    _publish(OutputTarget(out, "report"), {"a.txt": "2"})
    assert (out / "a.txt").read_text() == "2" and not (out / "figures" / "old.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_force_writes_beside_user_files_and_keeps_them(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="did not write"):
        OutputTarget(out, "report")
    _publish(OutputTarget(out, "report", force=True), {"a.txt": "1"})
    _publish(OutputTarget(out, "report", force=True), {"b.txt": "2"})
    assert (out / "notes.txt").read_text() == "keep me"
    assert (out / "b.txt").is_file() and not (out / "a.txt").exists()  # only our own earlier file went


def test_published_files_get_the_usual_modes(tmp_path):
    out = _publish(OutputTarget(tmp_path / "rep", "report"), {"a.txt": "1"})
    mask = os.umask(0)
    os.umask(mask)
    assert (out / "a.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


def test_safe_name_never_leaves_its_directory():
    for hostile in ("../../x", "/etc/passwd", "..", "a/b", "\x00", ""):
        name = safe_name(hostile)
        assert "/" not in name and name not in ("", ".", "..")


def test_stale_staging_directories_of_dead_processes_are_removed(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=False, capture_output=True, text=True)
    dead = int(proc.stdout)
    stale = tmp_path / f".rep.icl-tmp-{dead}-abcd"
    stale.mkdir()
    live = tmp_path / f".rep.icl-tmp-{os.getpid()}-abcd"
    live.mkdir()
    clean_stale(tmp_path)
    assert not stale.exists() and live.exists()


def test_planted_force_over_trained_run_leaves_no_stale_training_state(tmp_path):
    from conftest import build_cfg

    from probe.cli import main
    from probe.training.train import train

    train(build_cfg(steps=2, save_every=1, eval_every=1), tmp_path / "run", progress=False)
    assert main(["-q", "planted", "--algorithm", "gd", "--layers", "2", "--dims", "3", "--out",
                 str(tmp_path / "run"), "--force"]) == 0
    assert not (tmp_path / "run" / "train_state.pt").exists() and not (tmp_path / "run" / "train_log.csv").exists()
    assert main(["-q", "train", "--out", str(tmp_path / "run"), "--resume"]) == 2


def _stage():
    calls.append(1)
    return {"t": pd.DataFrame({"a": [1.0, 2.0]})}, {"x": 1}


calls: list[int] = []


@pytest.mark.parametrize("damage", ["edit", "truncate", "delete", "bad-json", "edit-data"])
def test_damaged_cache_entry_is_recomputed_not_published(tmp_path, damage, caplog):
    calls.clear()
    cache = StageCache(tmp_path)
    tables, _data, hit = cache.get_or_run("k", _stage)
    assert not hit and len(calls) == 1
    entry = next(p for p in tmp_path.iterdir() if not p.name.startswith("."))
    if damage == "edit":
        (entry / "t.csv").write_text("a\n999\n")
    elif damage == "truncate":
        (entry / "t.csv").write_text("a\n1")
    elif damage == "delete":
        (entry / "t.csv").unlink()
    elif damage == "edit-data":  # a verdict edited in the entry's JSON is never published
        meta = json.loads((entry / "done.json").read_text())
        meta["data"] = {"verdict": "edited"}
        (entry / "done.json").write_text(json.dumps(meta))
    else:
        (entry / "done.json").write_text("{")
    tables, _data, hit = cache.get_or_run("k", _stage)
    assert not hit and len(calls) == 2 and tables["t"].a.tolist() == [1.0, 2.0]
    assert "recomputing" in caplog.text
    assert cache.get_or_run("k", _stage)[2] is True  # repaired


def test_two_caches_never_share_a_temp_directory(tmp_path):
    a, b = StageCache(tmp_path), StageCache(tmp_path)
    a.get_or_run("k", _stage)
    b.get_or_run("k2", _stage)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_committed_outputs_can_be_regenerated_in_place():
    """The README's commands write into the committed reports and evaluations: they carry markers."""
    from conftest import REPO

    for report in (REPO / "reports").glob("*-quick"):
        OutputTarget(report, "report", inputs=(REPO / "checkpoints" / "gpt2-default",))
    for ev in (REPO / "checkpoints").glob("*/eval"):
        OutputTarget(ev, "evaluate", inputs=(ev.parent,))


def test_force_over_a_run_directory_keeps_files_the_run_did_not_write(tmp_path):
    from conftest import build_cfg

    from probe.cli import main
    from probe.training.train import train

    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    train(build_cfg(steps=2, save_every=1, eval_every=1), run, progress=False)
    marker = json.loads((run / MARKER).read_text())
    assert "notes.txt" not in marker["files"] and "train_state.pt" in marker["files"]
    assert main(["-q", "planted", "--algorithm", "gd", "--layers", "2", "--dims", "3", "--out", str(run), "--force"]) == 0
    assert (run / "notes.txt").read_text() == "mine" and not (run / "train_state.pt").exists()


def test_the_stage_key_covers_config_files_and_stage_code(tmp_path):
    """Editing a checkpoint's config.json (the task's noise) or any weight file beside the weights
    changes its fingerprint, so no stage is reused under a new summary; logs and optimizer state do
    not. The report's own stage code (report/build.py) is in the code digest, its wording is not."""
    from conftest import build_cfg

    from probe.io.checkpoint import save_model
    from probe.io.formats import load_checkpoint
    from probe.models import build_model
    from probe.reporting import cache

    cfg = build_cfg()
    save_model(build_model(cfg.model), cfg, tmp_path / "ck")
    first = load_checkpoint(tmp_path / "ck").fingerprint
    (tmp_path / "ck" / "train_log.csv").write_text("step,loss\n1,2\n")
    (tmp_path / "ck" / "train_state.pt").write_bytes(b"x")
    assert load_checkpoint(tmp_path / "ck").fingerprint == first
    payload = json.loads((tmp_path / "ck" / "config.json").read_text())
    payload["config"]["task"]["noise_std"] = 0.5
    (tmp_path / "ck" / "config.json").write_text(json.dumps(payload))
    second = load_checkpoint(tmp_path / "ck").fingerprint
    assert second != first
    (tmp_path / "ck" / "icl_head.safetensors").write_bytes(b"head")
    assert load_checkpoint(tmp_path / "ck").fingerprint != second
    assert not "reporting/build.py".startswith(cache.PRESENTATION) and "reporting/html.py".startswith(cache.PRESENTATION)


def test_publishing_is_one_atomic_exchange(tmp_path, monkeypatch):
    """A kill at any step of publishing leaves --out complete: before the exchange it is the
    earlier output, after it the new one (the earlier one is deleted last)."""
    from probe.io import outputs
    from probe.io.outputs import OutputTarget

    out = tmp_path / "rep"

    def build(text: str, stop_at=None) -> None:
        target = OutputTarget(out, "evaluate")
        staged = target.stage()
        (staged / "icl_error.csv").write_text(text)
        (staged / "evaluate_summary.json").write_text(text)
        if stop_at is not None:
            monkeypatch.setattr(outputs.shutil, "rmtree", stop_at)
        try:
            target.publish(staged)
        finally:
            monkeypatch.undo()

    build("old")
    assert outputs.exchange(tmp_path, tmp_path) in (True, False)  # the call exists on this system

    class Killed(Exception):
        pass

    def kill(*args, **kwargs):
        raise Killed

    with pytest.raises(Killed):  # killed right after the exchange, before the earlier output is deleted
        build("new", stop_at=kill)
    assert (out / "icl_error.csv").read_text() == (out / "evaluate_summary.json").read_text() == "new"
    monkeypatch.setattr(outputs.os, "replace", kill)
    monkeypatch.setattr(outputs, "exchange", lambda a, b: (_ for _ in ()).throw(Killed()))
    target = OutputTarget(out, "evaluate")
    staged = target.stage()
    (staged / "icl_error.csv").write_text("newer")
    with pytest.raises(Killed):  # killed at the exchange itself: nothing moved
        target.publish(staged)
    monkeypatch.undo()
    assert (out / "icl_error.csv").read_text() == "new" and json.loads((out / ".icl-probe-output.json").read_text())


@pytest.mark.slow
def test_a_report_from_another_checkpoint_is_never_replaced_even_with_force(tmp_path, monkeypatch, capsys):
    """runA/final and runB/final share the default report name: the second report names both
    checkpoints and refuses, with or without --force, and the first report is left as it was; the
    same checkpoint may still replace its own report."""
    import shutil

    from conftest import REPO

    from probe.cli import main

    for run, algorithm in (("runA", "gd"), ("runB", "sgd")):
        shutil.copytree(REPO / "checkpoints" / "planted" / algorithm, tmp_path / run / "final")
    monkeypatch.chdir(tmp_path)
    assert main(["-q", "report", "runA/final", "--recipe", "smoke"]) == 0
    before = (tmp_path / "runs" / "final-smoke" / "summary.json").read_bytes()
    for extra in ([], ["--force"]):
        assert main(["-q", "report", "runB/final", "--recipe", "smoke", *extra]) != 0
        err = capsys.readouterr().err
        assert "made from another checkpoint (runA/final), not runB/final" in err and "--force does not" in err
    assert (tmp_path / "runs" / "final-smoke" / "summary.json").read_bytes() == before
    assert main(["-q", "report", "runA/final", "--recipe", "smoke"]) == 0


def test_the_fingerprint_is_the_files_not_this_versions_config_fields(tmp_path, monkeypatch):
    """A run-config field added in a later version (its default in no file) must not change a
    checkpoint's fingerprint: it did, and every report made before refused `--force` as "made
    from another checkpoint"."""
    from conftest import build_cfg

    from probe.io import checkpoint
    from probe.io.checkpoint import save_model
    from probe.io.formats import load_checkpoint
    from probe.models import build_model

    cfg = build_cfg()
    save_model(build_model(cfg.model), cfg, tmp_path / "ck")
    before = load_checkpoint(tmp_path / "ck").fingerprint
    from probe.core.config import to_dict

    newer = lambda c: {**to_dict(c), "new_field": "its default"}  # what a later version would write
    monkeypatch.setattr(checkpoint, "to_dict", newer, raising=False)
    assert load_checkpoint(tmp_path / "ck").fingerprint == before
