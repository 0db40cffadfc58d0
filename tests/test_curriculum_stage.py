"""A snapshot seen at its own curriculum stage (probe/io/curriculum_stage.py): the same network as a
d = k model, checked against the original on zero-padded prompts."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, build_cfg

from probe.core.config import CurriculumConfig, Stage, load_recipe
from probe.core.errors import ConfigError
from probe.io.checkpoint import save_model
from probe.io.curriculum_stage import at_curriculum_stage
from probe.io.formats import load_checkpoint
from probe.io.run_config import RunConfig
from probe.models import build_model

D8_SNAPSHOT = REPO / "checkpoints/gpt2-d8-seed1/snapshots/step_2900"


def test_stage_at_follows_the_d8_recipe_by_hand():
    """recipes/gpt2-d8.toml: dims 4 + 1 per 1,500 steps up to 8, points 12 + 2 per 600 up to 36."""
    cfg = RunConfig.from_dict(load_recipe(REPO / "recipes/gpt2-d8.toml"))
    assert cfg.stage_at(0) == (4, 12)
    assert cfg.stage_at(500) == (4, 12)
    assert cfg.stage_at(2900) == (5, 20)  # 2900 // 1500 = 1, 2900 // 600 = 4
    assert cfg.stage_at(5200) == (7, 28)
    assert cfg.stage_at(6000) == (8, 32)
    assert cfg.stage_at(7200) == (8, 36)
    assert cfg.stage_at(30000) == (8, 36)


def _snapshot(tmp_path, family: str, encoding: str, step: int):
    cfg = build_cfg(family=family, d=6, points=10, width=16, layers=2)
    cfg.model.encoding = encoding
    cfg.curriculum = CurriculumConfig(
        dims=Stage(start=2, end=6, inc=1, interval=100), points=Stage(start=4, end=10, inc=2, interval=100)
    )
    torch.manual_seed(3)
    path = tmp_path / f"{family}-{encoding}"
    save_model(build_model(cfg.model), cfg, path, {"train_step": step})
    return load_checkpoint(path)


@pytest.mark.parametrize(("family", "encoding"), [("gpt2", "garg"), ("gpt2", "akyurek"), ("lstm", "garg")])
def test_staged_model_is_the_snapshot_on_zero_padded_prompts(tmp_path, family, encoding):
    ckpt = _snapshot(tmp_path, family, encoding, step=250)  # dims 4, points 8
    staged = at_curriculum_stage(ckpt)
    assert (staged.config.model.n_dims, staged.config.task.n_dims, staged.config.task.n_points) == (4, 4, 8)
    assert staged.config.curriculum.dims is None and staged.config.curriculum.points is None
    assert staged.meta["curriculum_stage"] == {"train_step": 250, "dims": 4, "points": 8, "of_dims": 6}
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(5, 8, 4, generator=g), torch.randn(5, 8, generator=g)
    padded = torch.cat([xs, torch.zeros(5, 8, 2)], dim=-1)
    with torch.no_grad():
        ours, theirs = staged.model.run(xs, ys), ckpt.model.run(padded, ys)
    torch.testing.assert_close(ours.pred, theirs.pred, atol=1e-6, rtol=1e-6)
    for a, b in zip(ours.resid, theirs.resid):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_staged_fingerprint_differs_and_the_final_stage_is_the_checkpoint(tmp_path):
    early = _snapshot(tmp_path, "gpt2", "garg", step=250)
    assert at_curriculum_stage(early).fingerprint != early.fingerprint
    late = _snapshot(tmp_path / "late", "gpt2", "garg", step=900)  # dims 6, points 10: the run's own
    assert at_curriculum_stage(late) is late


def test_snapshot_without_train_step_is_refused(tmp_path):
    cfg = build_cfg(d=4)
    save_model(build_model(cfg.model), cfg, tmp_path / "m")
    with pytest.raises(ConfigError, match="records no meta.train_step"):
        at_curriculum_stage(load_checkpoint(tmp_path / "m"))


def test_shipped_d8_snapshot_at_its_stage():
    """The d = 8 replication run's step-2,900 snapshot trained on d = 5, 20 points."""
    ckpt = load_checkpoint(D8_SNAPSHOT)
    staged = at_curriculum_stage(ckpt)
    assert (staged.config.task.n_dims, staged.config.task.n_points) == (5, 20)
    g = torch.Generator().manual_seed(1)
    xs, ys = torch.randn(3, 20, 5, generator=g), torch.randn(3, 20, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(
            staged.model(xs, ys), ckpt.model(torch.cat([xs, torch.zeros(3, 20, 3)], -1), ys), atol=1e-6, rtol=1e-6
        )


def test_study_models_at_their_stage_may_differ_in_d():
    from probe.study.run import check_models

    snapshots = [REPO / f"checkpoints/gpt2-d8-seed1/snapshots/step_{s}" for s in (500, 2900, 7200)]
    fields = check_models(snapshots, "train_step", curriculum_stage=True)
    assert [(f["n_dims"], f["n_points"]) for f in fields.values()] == [(4, 12), (5, 20), (8, 36)]
    assert {f["n_dims"] for f in check_models(snapshots, "train_step").values()} == {8}


def test_committed_stage_study_measures_each_snapshot_at_its_stage():
    """reports/study-training-dynamics-d8-stage: every row's d and points are its step's stage."""
    import pandas as pd

    table = pd.read_csv(REPO / "reports/study-training-dynamics-d8-stage/study.csv")
    cfg = load_checkpoint(D8_SNAPSHOT).config
    stages = table.groupby("train_step")[["n_dims", "n_points"]].agg(set)
    assert list(stages.index) == [500, 900, 1600, 2900, 5200]
    for step, row in stages.iterrows():
        assert (row.n_dims, row.n_points) == ({cfg.stage_at(step)[0]}, {cfg.stage_at(step)[1]})


def test_icl_sentence_names_each_models_2d_plus_1_when_d_varies():
    import pandas as pd

    from probe.study.findings import icl_sentence

    rows = [
        {
            "model": m,
            "analysis": "evaluate",
            "metric": "error_at_2d1",
            "shift": "",
            "n_examples": n,
            "value": v,
            "ci_low": v - 0.01,
            "ci_high": v + 0.01,
            "train_step": step,
        }
        for m, n, v, step in [("a", 9, 0.5, 500), ("b", 11, 0.04, 2900)]
    ]
    text = icl_sentence(pd.DataFrame(rows), "train_step")
    assert text.startswith("error / d at 2d+1 examples, each model's own d by training step")
    assert "500 (at 9): 0.5 " in text and "2900 (at 11): 0.04 " in text
    same = icl_sentence(pd.DataFrame(rows).assign(n_examples=9), "train_step")
    assert "at 2d+1 = 9 examples" in same and "(at 9)" not in same
