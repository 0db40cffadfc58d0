"""The report end to end on a tiny checkpoint: schema, determinism, atomicity, fail-fast errors."""

import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import TINY_REPORT as TINY

from probe.cli import main
from probe.io.outputs import write_marker


def _aligned(block):
    lengths = {len(v) for v in block.values() if isinstance(v, list)}
    return len(lengths) <= 1


def _refuse(constant):
    raise AssertionError(f"summary.json holds {constant}, which strict JSON parsers reject")


def test_summary_schema(report):
    s = json.loads((report / "summary.json").read_text(), parse_constant=_refuse)  # strict: no NaN / Infinity
    for key in ("checkpoint", "recipe", "versions", "git_commit", "seed", "created", "timings", "icl_error", "readout",
                "best_match", "trend", "span", "probes"):
        assert key in s, key
    assert set(s["checkpoint"]) >= {"path", "format", "sha256"} and len(s["checkpoint"]["sha256"]) == 64
    assert set(s["icl_error"]) >= {"n_examples", "model", "least_squares"} and _aligned(s["icl_error"])
    assert s["readout"]["layer"] == [0, 1, 2, 3] and _aligned({k: s["readout"][k] for k in ("layer", "error")})
    for learner in ("newton", "gd"):
        for metric in ("sime", "simw"):
            block = s["best_match"][learner][metric]
            assert set(block) >= {"layer", "k", "similarity", "ci_low", "ci_high"} and _aligned(block)
            assert all(lo <= sim + 1e-9 for lo, sim in zip(block["ci_low"], block["similarity"]))
        assert set(s["trend"][learner]) >= {"linear_r2", "exponential_r2", "verdict"}
    assert _aligned({k: s["span"][k] for k in ("layer", "n_examples", "residual", "random_null")})
    for target in ("xty", "w_ols"):
        for kind in ("linear", "mlp"):
            block = s["probes"][target][kind]
            assert set(block) >= {"layer", "r2", "control_r2"} and _aligned({k: block[k] for k in ("layer", "r2", "control_r2")})
    assert set(s["timings"]) >= {"evaluate", "layers", "probes", "figures", "interventions"}
    assert s["schema_version"] == 9 and not s["checkpoint"]["path"].startswith("/")
    spectral = s["spectral"]  # one verdict per layer, each bin variable's fits aligned with the layers
    assert spectral["layer"] == [0, 1, 2, 3] and _aligned({k: spectral[k] for k in ("layer", "verdict", "p")})
    assert set(spectral["by_variable"]) == {"lam_t", "lam_max"}
    assert all(len(fit["best_class"]) == 4 for fit in spectral["by_variable"].values())
    assert "2^k" in spectral["identities"] and spectral["counts"]["prompts"] == 12
    for v in s["verdicts"]:  # paired verdicts: Table 1's learners, and each causal map against its alternatives
        assert v["ci_low"] <= v["difference"] + 1e-12 and 0 <= v["resolution"] <= 2
        assert v["verdict"] in (f"{v['a']} closer", f"{v['b']} closer", "not separable at this resolution",
                                "cannot test here")
    table1 = [v for v in s["verdicts"] if v["claim"] == "final layer (Table 1)"]
    assert {v["metric"] for v in table1} == {"sime", "simw"}
    assert all(v["ci_low"] <= v["difference"] <= v["ci_high"] for v in table1)
    assert s["nulls"]["layer"] == [0, 1, 2, 3] and set(s["nulls"]["sime"]) == {"zero", "random_model"}
    for metric in ("sime", "simw"):
        block = s["best_match"]["newton"][metric]
        assert len(block["degenerate"]) == len(block["layer"]) and all(isinstance(v, bool) for v in block["degenerate"])
    assert set(s["interventions"]) >= {"ablation", "patching", "iteration", "verdicts"}


def test_report_files_and_html_linking_each_figure_once(report):
    html = (report / "index.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the report must not fetch anything"
    figs = sorted(p.name for p in (report / "figures").iterdir())
    assert "heatmap_newton.png" in figs and all(f.endswith(".png") for f in figs)  # each figure stored once
    linked = re.findall(r'<img src="figures/([^"]+)"', html)
    assert sorted(linked) == figs and "base64" not in html
    assert html.count("<figcaption>") == html.count("<img ")
    for name in ("icl_error", "readout", "heatmap_cells", "best_match", "table1", "span", "probes", "forgetting"):
        assert (report / "data" / f"{name}.csv").exists(), name
    assert json.loads((report / "recipe.json").read_text())["prompts"]["train"] == 48  # resolved recipe
    head = html[: html.index('<nav id="contents"')]
    assert '<section id="findings"' in head and "Layers vs Iterative Newton (SimE, a convergence rate)" in head  # the answer comes first
    anchors = re.findall(r'<a href="#([^"]+)">', html)
    assert anchors and all(f'<section id="{a}">' in html for a in anchors)


@pytest.mark.slow
def test_same_seed_same_numbers(ckpt, report, tmp_path):
    out = tmp_path / "r2"
    assert main(["-q", "report", str(ckpt), "--out", str(out), "--no-cache", *TINY]) == 0
    a, b = (json.loads((p / "summary.json").read_text()) for p in (report, out))
    for key in ("icl_error", "readout", "best_match", "trend", "span", "probes", "table1", "nulls", "interventions"):
        assert a[key] == b[key], key
    # regenerating is byte-identical apart from summary.json's timings and creation time (figures do not churn git)
    files = sorted(p.relative_to(report) for p in report.rglob("*") if p.is_file() and p.name != "summary.json")
    assert any(f.suffix == ".png" for f in files)
    for name in files:
        assert (report / name).read_bytes() == (out / name).read_bytes(), name
    volatile = ("timings", "created", "cached_stages")
    assert {k: v for k, v in a.items() if k not in volatile} == {k: v for k, v in b.items() if k not in volatile}


@pytest.mark.slow
def test_cached_rerun_matches(ckpt, tmp_path):
    args = ["-q", "report", str(ckpt), "--out", str(tmp_path / "c1"), *TINY]
    assert main(args) == 0
    args[4] = str(tmp_path / "c2")
    assert main(args) == 0
    a, b = (json.loads((tmp_path / p / "summary.json").read_text()) for p in ("c1", "c2"))
    assert b["cached_stages"] == ["evaluate", "readout", "induced", "layers", "spectral", "interventions", "probes", "order", "forgetting", "ood", "token_probes"] and a["best_match"] == b["best_match"]


def test_bad_input_fails_fast_with_a_message(ckpt, tmp_path, capsys):
    out = tmp_path / "never"
    assert main(["report", str(ckpt), "--out", str(out), "--set", "prompts.evaluat=10"]) == 2
    assert "Did you mean: curve (formerly evaluate)?" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[sweeps]]\nlabel = "n"\nlearner = "newtn"\n')
    assert main(["report", str(ckpt), "--out", str(out), "--recipe", str(bad)]) == 2
    assert "Unknown learner 'newtn'. Did you mean: newton?" in capsys.readouterr().err
    bad.write_text('[[sweeps]]\nlabel = "n"\nlearner = "newton"\n[[forgetting.learners]]\nlabel = "g[2]"\n'
                   'learner = "gd"\ngrid = { iters = [2] }\n')
    assert main(["report", str(ckpt), "--out", str(out), "--recipe", str(bad)]) == 2
    assert "forgetting learner 'g[2]': learner 'gd' has no hyper-parameter ['iters']" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--out", str(out)]) == 2
    assert "not a checkpoint in any known format" in capsys.readouterr().err
    assert main(["report", str(ckpt), "--recipe", "quik", "--out", str(out)]) == 2
    assert "Unknown recipe 'quik'. Did you mean: quick?" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_a_failing_stage_leaves_no_half_report(ckpt, report, tmp_path, monkeypatch):
    from probe.reporting import build

    out = tmp_path / "keep"
    out.mkdir()
    (out / "index.html").write_text("previous report")
    write_marker(out, "report", ["index.html"])  # an earlier report icl-probe wrote

    def boom(*args, **kwargs):
        raise RuntimeError("stage failed")

    monkeypatch.setattr(build, "comparison_figures", boom)  # the last figure the report's process draws
    with pytest.raises(RuntimeError, match="stage failed"):
        main(["-q", "report", str(ckpt), "--out", str(out), *TINY])
    assert (out / "index.html").read_text() == "previous report"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".keep")]


@pytest.mark.slow
def test_standalone_heatmap_agrees_with_the_report_on_the_shipped_default(tmp_path):
    small = ["--set", "prompts.train=256", "--set", "prompts.val=64", "--set", "prompts.test=128", "--set",
             "prompts.induced=16", "--set", "similarity.bootstrap=100"]
    off = ["--set", "prompts.curve=64", "--set", "probes.enabled=false", "--set", "forgetting.enabled=false",
           "--set", "interventions.enabled=false"]
    assert main(["-q", "heatmap", "--out", str(tmp_path / "h"), *small]) == 0
    assert main(["-q", "report", "--out", str(tmp_path / "r"), "--no-cache", *small, *off]) == 0
    import pandas as pd

    standalone = pd.read_csv(tmp_path / "h" / "best_match.csv")
    in_report = pd.read_csv(tmp_path / "r" / "data" / "best_match.csv")
    pd.testing.assert_frame_equal(standalone, in_report)


def test_standalone_span_equals_the_reports(ckpt, report, tmp_path):
    """icl-probe span with the report's settings runs the same learners and gives the same table."""
    assert main(["-q", "span", str(ckpt), "--out", str(tmp_path / "s"), *TINY]) == 0
    ours, reports = (pd.read_csv(p) for p in (tmp_path / "s" / "span.csv", report / "data" / "span.csv"))
    pd.testing.assert_frame_equal(ours, reports)


@pytest.mark.slow
def test_a_report_on_a_relu_attention_model(tmp_path):
    """The whole report runs on a ReLU-attention GPT-2 (capture, layers, probes, interventions
    through the resumed path and TransformerLens) and records the option."""
    from conftest import build_cfg, relu_attention_model

    from probe.io.checkpoint import save_model

    model, _ = relu_attention_model()
    cfg = build_cfg()
    cfg.model.attn_activation = "relu"
    save_model(model, cfg, tmp_path / "relu")
    assert main(["-q", "report", str(tmp_path / "relu"), "--out", str(tmp_path / "r"), "--no-cache", *TINY]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["checkpoint"]["model"]["attn_activation"] == "relu"
    assert summary["interventions"] and summary["best_match"]


def test_summary_json_reads_back_as_the_typed_summary(report):
    from probe.reporting.findings import findings
    from probe.reporting.layer_blocks import Match
    from probe.reporting.schema import Summary

    written = json.loads((report / "summary.json").read_text())
    summary = Summary.from_json(written)
    assert isinstance(summary.best_match["newton"]["sime"], Match) and summary.stages["probes"].fits["xty"]["mlp"].r2
    assert summary.probes is summary.stages["probes"]  # a registered block reads as an attribute
    with pytest.raises(AttributeError, match="no attribute 'probez'"):
        _ = summary.probez
    assert json.loads(json.dumps(summary.to_json())) == written  # nothing lost or added on the way back
    html = (report / "index.html").read_text()
    assert all(item.split(":")[0] in html for item in findings(summary, answers=False)[0])  # the page's findings
    assert all(f"<td>{q}</td>" in html for q in ("Iterative Newton or GD?", "GD or online GD?"))  # the answer block


def test_probe_section_states_convergence_and_names_unconverged_probes(report):
    """The page's probe section gives the share of converged probes and lists any that did not
    converge; summary.json carries the share per (target, kind)."""
    rows = pd.read_csv(report / "data" / "probes.csv")
    own = rows[rows.control == "none"]
    summary = json.loads((report / "summary.json").read_text())
    for (target, kind), group in own.groupby(["target", "kind"]):
        assert summary["probes"][target][kind]["converged_share"] == pytest.approx(group.converged.mean())
        assert summary["probes"][target][kind]["max_iterations"] == group.iterations.max()
    html = (report / "index.html").read_text()
    assert "Share of probes that converged" in html and "variable projection" in html
    assert ("did not reach the stopping rule" in html) == (not own.converged.all())


def test_changing_spectral_settings_reruns_the_spectral_stage_alone_from_the_cached_weights(ckpt, tmp_path):
    """The spectral stage needs the induced stage and reads its induced weights (arrays the stage
    cache keeps as .npy), not the learner sweeps: a new [spectral] bins value re-runs it from the
    cached read-outs and weights, with the numbers of a run without any cache; a new [similarity]
    value re-runs all three."""
    import copy
    import io

    import probe
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache

    model, stages = load_checkpoint(ckpt), {"spectral"}
    smoke = probe.recipe("smoke")
    cache = StageCache(tmp_path / "cache")
    first = run_stages(model, smoke, "cpu", cache, False, only=stages)
    assert first.cached == {"readout": False, "induced": False, "spectral": False}
    assert "spectral_summary" in first.tables and "best_match" not in first.tables  # no sweeps run
    assert first.data["induced_weights"].shape[:2] == (model.config.model.n_layer + 1, 12)
    assert sorted(p.name for p in (tmp_path / "cache").glob("*-induced-*/*.npy")) == [
        "induced_half_a.npy", "induced_half_b.npy", "induced_queries.npy", "induced_weights.npy", "induced_xs.npy",
        "induced_ys.npy",
    ]
    wider = copy.deepcopy(smoke)
    wider.spectral.bins = 8
    second = run_stages(model, wider, "cpu", cache, False, only=stages)
    assert second.cached == {"readout": True, "induced": True, "spectral": False}
    fresh = run_stages(model, wider, "cpu", StageCache(None), False, only=stages)
    for name in ("spectral_summary", "spectral_layers", "spectral_curves"):
        pd.testing.assert_frame_equal(second.tables[name], fresh.tables[name])
    assert not second.tables["spectral_curves"].equals(first.tables["spectral_curves"])  # 8 bins, not 12
    again = run_stages(model, wider, "cpu", cache, False, only=stages)
    assert again.cached == {"readout": True, "induced": True, "spectral": True}
    as_read = lambda frame: pd.read_csv(io.StringIO(frame.to_csv(index=False)))  # a cached table is read from CSV
    pd.testing.assert_frame_equal(again.tables["spectral_summary"], as_read(fresh.tables["spectral_summary"]))
    bootstrap = copy.deepcopy(wider)
    bootstrap.similarity.bootstrap = 30
    rerun = run_stages(model, bootstrap, "cpu", cache, False, only=stages).cached
    assert rerun == {"readout": False, "induced": False, "spectral": False}


def test_the_layer_analyses_as_stages_give_analyse_layers_numbers(ckpt):
    """The readout, induced and layers stages (read-outs, induced weights, matches) run apart and
    hand each other their data, and give the tables `analyse_layers` gives in one call."""
    import probe
    from probe.analysis.pipeline import LayerSettings, analyse_layers
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import adapt_recipe

    model = load_checkpoint(ckpt)
    recipe = adapt_recipe(probe.recipe("smoke"), model.config)
    built = run_stages(model, recipe, "cpu", StageCache(None), False, only={"layers"})
    assert list(built.timings) == ["readout", "induced", "layers"]
    whole = analyse_layers(model.model, model.config.task, LayerSettings.from_recipe(recipe))
    for name, frame in (("readout", whole.readout), ("best_match", whole.best), ("heatmap_cells", whole.cells),
                        ("table1", whole.table1), ("span", whole.span), ("nulls", whole.nulls)):
        pd.testing.assert_frame_equal(built.tables[name], frame)
    np.testing.assert_array_equal(built.data["induced_weights"], whole.induced.weights)


def test_a_stage_asked_for_alone_runs_with_the_stages_it_needs(ckpt):
    """`only={"interventions"}` runs the layers stage and the stages it needs first (the causal
    checks read its best matches), the spectral stage alone brings the read-outs and induced weights
    (not the sweeps), the order stage the read-outs; an unknown name is refused."""
    import probe
    from probe.core.errors import ConfigError
    from probe.core.stages import with_needs
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache

    assert with_needs({"interventions"}) == {"interventions", "layers", "induced", "readout"}
    assert with_needs({"spectral", "order"}) == {"spectral", "induced", "readout", "order"}
    assert with_needs(None) is None
    with pytest.raises(ConfigError, match="unknown analysis stage 'layer'"):
        with_needs({"layer"})
    built = run_stages(load_checkpoint(ckpt), probe.recipe("smoke"), "cpu", StageCache(None), False, only={"interventions"})
    assert list(built.timings) == ["readout", "induced", "layers", "interventions"]
    assert "patching" in built.tables or "ablation" in built.tables


@pytest.mark.slow
def test_figures_drawn_in_the_worker_are_the_figures_drawn_here_and_its_failures_raise(ckpt, tmp_path):
    """The figure worker (probe/reporting/figure_pool.py) draws each stage's PNGs byte for byte as
    the report's own process draws them; a stage it cannot draw (here: its figure folder is a
    file) raises at `wait`, not later, and the worker is shut down."""
    import probe
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import Context, report_stages, run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.figure_pool import FigurePool
    from probe.reporting.recipe import adapt_recipe

    model = load_checkpoint(ckpt)
    recipe = adapt_recipe(probe.recipe("smoke"), model.config)
    pool = FigurePool(tmp_path / "pooled", model, recipe, Context(model, recipe), worker=True)
    built = run_stages(model, recipe, "cpu", StageCache(None), False, only={"evaluate", "layers", "spectral"},
                       on_done=pool.submit)
    pooled = pool.wait()
    here = {}
    for stage in report_stages().values():
        if stage.name in built.timings:
            here.update(stage.figures(built.tables, tmp_path / "here", Context(model, recipe, earlier=built)))
    assert set(pooled) == set(here) and len(here) >= 5
    for name, path in here.items():
        assert pooled[name].read_bytes() == path.read_bytes(), name
    (tmp_path / "a-file").write_text("")
    broken = FigurePool(tmp_path / "a-file", model, recipe, Context(model, recipe), worker=True)
    broken.submit(report_stages()["evaluate"], built.tables)
    with pytest.raises((FileExistsError, NotADirectoryError)):
        broken.wait()
    with pytest.raises(RuntimeError, match="after shutdown"):
        broken.pool.submit(print)


def test_the_figure_worker_is_used_only_where_a_spawned_process_can_start(monkeypatch):
    """A spawned worker imports the main module again: a user's script (`python analysis.py`, which
    may call probe.report without a main guard) gets its figures drawn in its own process; the
    icl-probe command, `python -m` and notebooks get the worker."""
    import sys
    import types

    from probe.reporting.figure_pool import worker_safe

    def main_module(file, spec):
        module = types.ModuleType("__main__")
        if file is not None:
            module.__file__ = file
        module.__spec__ = spec
        monkeypatch.setitem(sys.modules, "__main__", module)

    main_module("/home/me/analysis.py", None)
    assert not worker_safe()
    main_module("/venv/bin/icl-probe", None)
    assert worker_safe()
    main_module("/lib/probe/__main__.py", types.SimpleNamespace(name="probe.__main__"))
    assert worker_safe()
    main_module(None, None)  # a notebook, python -c
    assert worker_safe()


@pytest.mark.slow
def test_a_cached_stages_figures_are_copied_not_drawn_again(ckpt, tmp_path, monkeypatch):
    """With a stage cache, each stage's PNGs are kept beside it: a second report with the same inputs
    copies them byte for byte without drawing any; a changed [spectral] setting redraws the spectral
    stage's figures alone (its tables changed), the others come from the cache again."""
    import hashlib

    import probe.reporting.figures as plots
    from probe.cli import main

    off = [arg for name in ("probes", "order", "forgetting", "ood", "token_probes", "steering", "interventions")
           for arg in ("--set", f"{name}.enabled=false")]  # fmt: skip
    args = lambda out, *extra: ["-q", "report", str(ckpt), "--recipe", "smoke", "--out", str(out),
                                "--cache-dir", str(tmp_path / "cache"), *off, *extra]  # fmt: skip
    digests = lambda out: {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "figures").glob("*.png")}
    assert main(args(tmp_path / "a")) == 0
    drawn = []
    for name in ("icl_error", "readout_error", "heatmap_pair", "spectral_curves", "spectral_exponents", "span"):
        original = getattr(plots, name)
        monkeypatch.setattr(plots, name, lambda *a, _f=original, _n=name, **k: drawn.append(_n) or _f(*a, **k))
    monkeypatch.setattr("probe.reporting.figure_pool.worker_safe", lambda: False)  # draw here, where it is counted
    assert main(args(tmp_path / "b")) == 0
    assert drawn == [] and digests(tmp_path / "b") == digests(tmp_path / "a") and len(digests(tmp_path / "a")) >= 4
    assert main(args(tmp_path / "c", "--set", "spectral.bins=8")) == 0
    assert set(drawn) == {"spectral_curves", "spectral_exponents"}
    changed = {n for n, d in digests(tmp_path / "c").items() if digests(tmp_path / "a").get(n) != d}
    assert changed and all(n.startswith("spectral") for n in changed)


def test_the_figure_cache_keeps_a_stage_with_no_figures_and_never_fails_a_report(tmp_path, caplog):
    """A stage that drew nothing is kept as nothing (and read back as nothing); a cache that cannot
    be written is logged, not raised."""
    from types import SimpleNamespace

    from probe.reporting.figure_pool import FigureCache
    from probe.reporting.recipe import resolve_recipe

    ckpt = SimpleNamespace(name="m", config={"d": 4})
    cache = FigureCache(tmp_path / "figures", ckpt, resolve_recipe("smoke"))
    stage = SimpleNamespace(name="spectral", sections=("prompts", "spectral"))
    key = cache.key(stage, {})
    assert cache.get(key, tmp_path / "out") is None
    cache.put(key, tmp_path / "out", {})
    assert cache.get(key, tmp_path / "out") == {}
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "out" / "a.png").write_bytes(b"png")
    (tmp_path / "blocked").write_text("")  # a file where the cache's folder should be
    blocked = FigureCache(tmp_path / "blocked", ckpt, resolve_recipe("smoke"))
    with caplog.at_level("WARNING", logger="probe.reporting.figure_pool"):
        blocked.put(key, tmp_path / "out", {"a": tmp_path / "out" / "a.png"})
    assert "not kept in the cache" in caplog.text
    other = cache.key(SimpleNamespace(name="order", sections=("prompts", "order")), {})
    assert other != key
