"""The one-import Python API: the model protocol checked at the boundary, and the
API's jobs equal to the command line's."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REPO, TINY_REPORT

import probe
from probe.core.errors import ConfigError
from probe.models.base import ModelOutput

SMOKE_VOLATILE = ("timings", "created", "cached_stages")


class Toy(torch.nn.Module):
    """A protocol model whose outputs can be broken one member at a time."""

    n_dims, n_layers, d_model, n_points = 3, 2, 5, 8

    def __init__(self, breaks: str = ""):
        super().__init__()
        self.breaks = breaks
        self.lin = torch.nn.Linear(4, self.d_model)
        self.head = torch.nn.Linear(self.d_model, 1)

    def run(self, xs, ys):
        tokens = torch.cat([xs, ys.unsqueeze(-1)], -1).repeat_interleave(2, dim=1)  # (B, 2n, 4)
        h = self.lin(tokens)
        resid = [h] * (self.n_layers + (0 if self.breaks == "resid_count" else 1))
        if self.breaks == "resid_shape":
            resid[1] = h[:, :-1]
        pred = self.head(h)[:, ::2, 0]
        if self.breaks == "pred":
            pred = pred[:, :1]
        return ModelOutput(pred=pred, resid=resid, final=h if self.breaks != "final" else h[..., :2])

    def readout(self, final):
        out = self.head(final)[..., 0]
        return out.unsqueeze(-1) if self.breaks == "readout" else out


@pytest.mark.parametrize("breaks,culprit", [
    ("resid_count", r"Toy.run\(...\).resid must hold n_layers \+ 1 = 3 tensors .* got 2 tensors"),
    ("resid_shape", r"Toy.run\(...\).resid\[1\] must have shape \(2, 6, 5\) .* got \(2, 5, 5\)"),
    ("pred", r"Toy.run\(...\).pred must be a tensor of shape \(2, 3\) .* got \(2, 1\)"),
    ("final", r"Toy.run\(...\).final must be a tensor of shape \(2, 6, 5\) .* got \(2, 6, 2\)"),
    ("readout", r"Toy.readout\(h\) must map \(B, 2n, d_model\) to \(B, 2n\) = \(2, 6\), got \(2, 6, 1\)"),
])
def test_every_protocol_violation_is_named_before_any_analysis(breaks, culprit, tmp_path):
    xs, ys = torch.randn(4, 8, 3), torch.randn(4, 8)
    with pytest.raises(ConfigError, match=culprit):
        probe.activations(Toy(breaks), xs, ys)
    with pytest.raises(ConfigError, match=culprit):
        probe.analyse(model=Toy(breaks), task=probe.load_checkpoint(probe.default_checkpoint()).config.task)
    acts = probe.activations(Toy(), xs, ys)  # the unbroken model passes
    assert acts.acts["resid"].shape == (3, 4, 16, 5)


def test_sizes_and_wrong_objects_are_named():
    bad = Toy()
    bad.n_layers = 0
    with pytest.raises(ConfigError, match=r"Toy.n_layers must be a positive integer, got 0"):
        probe.activations(bad, torch.randn(2, 8, 3), torch.randn(2, 8))
    ckpt = probe.load_checkpoint(probe.default_checkpoint())
    with pytest.raises(ConfigError, match=r"pass its .model \(ckpt.model\)"):
        probe.analyse(model=ckpt, task=ckpt.config.task)
    with pytest.raises(ConfigError, match="checkpoint must be a path or a LoadedCheckpoint"):
        probe.analyse(checkpoint=ckpt.model)
    with pytest.raises(ConfigError, match=r"recipe override prompts=5: give a mapping"):
        probe.analyse(prompts=5)


@pytest.mark.slow
def test_probe_report_on_the_smoke_recipe_equals_the_command_line(ckpt, tmp_path):
    from probe.cli import main

    assert main(["-q", "report", str(ckpt), "--recipe", "smoke", "--out", str(tmp_path / "cli"), "--no-cache"]) == 0
    result = probe.report(ckpt, recipe="smoke", out=tmp_path / "api")
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert {k: v for k, v in result.summary.items() if k not in SMOKE_VOLATILE} == {
        k: v for k, v in cli.items() if k not in SMOKE_VOLATILE
    }
    assert set(result.tables) >= {"best_match", "table1", "readout", "probes", "order"}
    assert all(path.is_file() for path in result.figures.values()) and result.figures


def test_probe_analyse_equals_the_reports_layers_stage(ckpt, report):
    """The session's tiny report (conftest TINY_REPORT on the quick recipe) and probe.analyse with
    the same overrides give the same best matches and Table 1."""
    sets = [TINY_REPORT[i + 1] for i in range(0, len(TINY_REPORT), 2)]
    sections: dict = {}
    for item in sets:
        key, value = item.split("=")
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = int(value)
    layers = probe.analyse(ckpt, recipe="quick", **{k: v for k, v in sections.items() if k in ("prompts", "similarity")})
    for name, frame in (("best_match", layers.best), ("table1", layers.table1), ("readout", layers.readout)):
        ref = pd.read_csv(report / "data" / f"{name}.csv")
        assert list(ref.columns) == list(frame.columns), name
        numeric = ref.select_dtypes("number").columns
        np.testing.assert_allclose(frame[numeric].to_numpy(float), ref[numeric].to_numpy(float), atol=1e-6, err_msg=name)


def test_probe_data_feeds_the_probe_the_report_fits():
    from probe.analysis.probes import AttentionPoolProbe
    from probe.data.tasks import generator_for, sample_prompts

    ckpt = probe.load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    p = sample_prompts(ckpt.config.task, 64, generator=generator_for(0))
    acts = probe.activations(ckpt, p.xs, p.ys)
    H, Y = probe.probe_data(acts, p.xs, p.ys, layer=4, t=8, target="xty")
    assert H.shape == (64, 16, 64) and Y.shape == (64, 4)
    np.testing.assert_allclose(Y, (p.xs[:, :8].double().transpose(1, 2) @ p.ys[:, :8].double().unsqueeze(-1))[..., 0])
    assert 0 < AttentionPoolProbe(kind="linear").fit(H, Y).score(H, Y) < 1
    with pytest.raises(ConfigError, match=r"t \(examples seen before a query\) must lie in 1..15, got 16"):
        probe.probe_data(acts, p.xs, p.ys, layer=4, t=16, target="xty")


def test_settings_from_a_recipe_are_the_command_lines():
    from probe.analysis.pipeline import LayerSettings
    from probe.reporting.recipe import resolve_recipe

    quick = probe.recipe("quick", probes={"max_iter": 7})
    assert quick.probes == resolve_recipe("quick", [{"probes": {"max_iter": 7}}]).probes
    assert quick.probes.max_iter == 7 and quick.prompts.train == 1024
    settings = LayerSettings.from_recipe(quick)
    assert settings.prompts == quick.prompts and settings.sweeps == tuple(quick.sweeps)


@pytest.mark.slow
def test_the_bridge_carries_the_task_and_names_its_token_positions():
    bridge = probe.to_bridge(REPO / "checkpoints" / "gpt2-default")
    assert bridge.task.n_dims == 4 and bridge.task.n_points == 16
    positions = bridge.token_positions(16)
    assert positions["x"].tolist() == list(range(0, 32, 2)) and positions["y"].tolist() == list(range(1, 32, 2))
    xs, ys = probe.prompts(REPO / "checkpoints" / "gpt2-default", 4)
    logits = bridge((xs, ys))
    preds = bridge.predictions(logits)
    assert torch.equal(preds[:, 5], logits[:, bridge.query_position(5), 0])  # y_6 after 5 examples
    model = probe.load_checkpoint(REPO / "checkpoints" / "gpt2-default").model
    assert probe.to_bridge(model).task is None
    assert "read at the x_i token" in bridge.predictions.__doc__


def test_the_bootstrap_bound_is_stated_the_same_everywhere():
    from probe.analysis.evaluate import error_curve
    from probe.core.settings import SimilaritySettings
    from probe.interventions.pipeline import InterventionSettings, run_interventions

    ckpt = probe.load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    bound = r"must be at least 20, got 5: a 90% interval from fewer resamples"
    with pytest.raises(ConfigError, match=bound):
        SimilaritySettings(bootstrap=5)
    with pytest.raises(ConfigError, match=bound):
        error_curve(ckpt.model, ckpt.config.task, n_prompts=8, n_boot=5)
    with pytest.raises(ConfigError, match=bound):
        run_interventions(ckpt.model, ckpt.config.task, InterventionSettings(prompts=8), n_boot=5)


def test_the_settings_classes_defaults_are_the_quick_recipes():
    """One source of defaults: a settings object made in Python with no arguments is the quick
    recipe's section (what `icl-probe report` runs by default)."""
    import dataclasses

    from probe.analysis.pipeline import LayerSettings

    quick = probe.recipe("quick")
    for section in ("prompts", "readout", "similarity", "probes", "forgetting", "order", "steering", "interventions"):
        ours = getattr(quick, section)
        assert type(ours)() == ours, section
    assert LayerSettings().sweeps == tuple(quick.sweeps)
    assert dataclasses.asdict(LayerSettings().prompts) == dataclasses.asdict(quick.prompts)


def test_no_api_function_is_shadowed_by_a_module_of_the_same_name():
    """`probe.report` must stay the function after every module of the package is imported (a
    subpackage of the same name would replace the attribute on import)."""
    import importlib
    import pkgutil

    modules = {m.name.split(".")[1] for m in pkgutil.iter_modules(probe.__path__, "probe.")}
    assert not set(probe.API) & modules
    for name in ("probe.reporting.build", "probe.study.run", "probe.capture.activations", "probe.analysis.pipeline"):
        importlib.import_module(name)
    assert all(callable(getattr(probe, name)) for name in probe.API)


def test_learners_describe_themselves_and_the_report_holds_no_learner_names():
    from probe.analysis.labels import LABELS, label, sweep_titles
    from probe.learners import LEARNERS
    from probe.reporting.html import learner_methods

    assert all(LEARNERS.get(n).label for n in LEARNERS.names())
    assert not set(LABELS) & set(LEARNERS.names())
    assert label("newton") == "Iterative Newton" and label("sgd[8]") == "SGD, 8 steps"
    # a sweep's name is recipe data: its `title`, else its label as words
    assert not any(name.startswith(("gd_", "ridge_", "sgd_", "adam_", "relu_")) for name in LABELS)
    quick = probe.recipe("quick")
    titles = sweep_titles(quick.sweeps)
    assert titles["gd_log"] == "GD (log grid)" and label("gd_log", titles) == "GD (log grid)"
    assert label("gd_log") == "gd log"
    methods = learner_methods(quick)
    assert "GD (log grid): paper convention" in methods[1] and methods[0].startswith("Iterative Newton: M_(k+1)")


def test_the_reports_trend_words_are_rendered_from_the_fit_not_from_a_sentence():
    """findings reads a trend's fields (shape from the two R^2, slope or growth, the sweep's axis),
    so a verdict string it does not parse can say anything."""
    from probe.reporting.findings import findings
    from probe.reporting.schema import Summary

    summary = Summary.from_json(json.loads((REPO / "reports" / "gpt2-default-quick" / "summary.json").read_text()))
    for fit in summary.trend.values():
        fit.verdict = "x: not parsed"
    text = " ".join(findings(summary)[0])
    newton, gd = summary.trend["newton"], summary.trend["gd_log"]
    assert f"Layers vs Iterative Newton (SimE, a convergence rate): linear, about {newton.slope:.1f} [" in text
    assert f"Layers vs GD (log grid) (SimE, a convergence rate): exponential, about x{gd.growth:.2f} [" in text


@pytest.mark.slow
def test_the_readmes_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's Python block, executed as it stands, from a folder holding the repository's
    checkpoints (it writes runs/smoke there)."""
    block = re.search(r"From Python, one import.*?```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    assert block, "the README's Python example is gone"
    (tmp_path / "checkpoints").symlink_to(REPO / "checkpoints")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102  (the README's own code, on purpose)
    assert not scope["report"].evidence.empty and (tmp_path / "runs" / "smoke" / "index.html").is_file()
    assert scope["spectrum"].layers.layer.tolist() == list(range(9))  # gpt2-default: 8 blocks, 9 layers
    assert not scope["layers"].best.empty


def test_a_repeated_call_with_cache_dir_is_read_from_the_cache(ckpt, tmp_path, monkeypatch):
    """probe.analyse / probe.spectral with cache_dir: the second call with the same checkpoint and
    settings computes nothing and returns the same numbers; other settings compute again."""
    from probe.analysis import pipeline

    small = {"prompts": {"train": 32, "val": 16, "test": 32, "induced": 8}, "similarity": {"bootstrap": 20}}
    first = probe.analyse(ckpt, recipe="smoke", cache_dir=tmp_path, **small)
    spectrum = probe.spectral(ckpt, recipe="smoke", cache_dir=tmp_path, **small)

    def recomputed(*args, **kwargs):
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(pipeline, "analyse_layers", recomputed)
    monkeypatch.setattr(pipeline, "analyse_spectrum", recomputed)
    again = probe.analyse(ckpt, recipe="smoke", cache_dir=tmp_path, **small)
    for name in ("best", "table1", "readout", "cells"):
        pd.testing.assert_frame_equal(getattr(again, name), getattr(first, name), check_dtype=False, obj=name)
    assert again.trends == first.trends
    np.testing.assert_array_equal(again.readouts.coef, first.readouts.coef)
    cached = probe.spectral(ckpt, recipe="smoke", cache_dir=tmp_path, **small)
    pd.testing.assert_frame_equal(cached.layers, spectrum.layers, check_dtype=False)
    with pytest.raises(AssertionError, match="recomputed despite the cache"):  # other settings: computed again
        probe.analyse(ckpt, recipe="smoke", cache_dir=tmp_path, **{**small, "similarity": {"bootstrap": 21}})
    with pytest.raises(ConfigError, match="cache_dir needs a checkpoint"):
        probe.analyse(model=object(), task=object(), cache_dir=tmp_path)
