"""Bad input named in a review, each run exactly as it was written there: the command or call, its
exit code or exception type, and its message."""

import json
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import REPO, GargTransformerModel, build_cfg, write_garg_run

import probe
from probe.core.errors import CheckpointError, ConfigError, ProbeError


def test_load_checkpoint_with_the_icl_probe_format_on_a_garg_run_directory(tmp_path):
    """probe.load_checkpoint("garg_run_dir", format="icl-probe") raised a raw FileNotFoundError from
    os.stat (no config.json); it says the directory is in Garg et al.'s format."""
    run = write_garg_run(tmp_path / "garg_run_dir", GargTransformerModel(3, 8, 16, 2, 2), 3, 8, 16, 2, 2)
    with pytest.raises(ProbeError, match=r"is not an 'icl-probe' checkpoint .*it is a run directory in the 'garg' "
                                         r"format: pass format='garg' or leave format out") as err:
        probe.load_checkpoint(str(run), format="icl-probe")
    assert isinstance(err.value, CheckpointError)
    assert probe.load_checkpoint(str(run)).format == "garg"


@pytest.mark.slow
def test_inspect_json_on_a_garg_run_names_positions_and_task_points_apart(tmp_path):
    """`icl-probe inspect --json` on a Garg run whose model.n_positions is 16 and whose curriculum
    ends at 9 points printed "n_points": 16 while the task loads with 9."""
    run = write_garg_run(tmp_path / "garg", GargTransformerModel(3, 16, 16, 2, 2), 3, 16, 16, 2, 2)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["training"]["curriculum"]["points"].update(start=9, end=9)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [sys.executable, "-m", "probe", "inspect", str(run), "--json", "--prompts", "16"],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["n_positions"] == 16 and info["task_points"] == 9
    assert "n_points" not in info


@pytest.mark.slow
def test_heatmap_with_a_million_queries_says_its_size_before_any_work(ckpt, tmp_path):
    """`icl-probe heatmap CK --set prompts.queries=1000000` on a tiny checkpoint ran on for minutes
    saying nothing; its first line now names prompts.queries: an estimate with the expected time
    where the machine admits it, a refusal where its memory does not."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe", "heatmap", str(ckpt), "--out", str(tmp_path / "h"), "--set",
         "prompts.queries=1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        first = ""
        assert proc.stderr is not None
        for line in proc.stderr:
            if "prompts.queries" in line or "error" in line:
                first = line
                break
    finally:
        proc.kill()
        proc.wait()
    assert "prompts.queries = 1000000" in first, first
    assert ("estimate: about" in first and " on a 2-core CPU" in first) or "would need about" in first, first


def test_admitted_large_work_is_announced_with_its_time(caplog):
    from probe.core import budget

    with caplog.at_level("WARNING", logger="probe.core.budget"):
        budget.check([budget.Estimate("prompts.queries", 1000000, flop=2e13)])
    line = caplog.records[-1].getMessage()
    assert line.startswith("estimate: about 2.0e+13 floating-point operations, 50 s to 6 min on a 2-core CPU")
    assert "prompts.queries = 1000000 contributes 100%" in line
    caplog.clear()
    with caplog.at_level("WARNING", logger="probe.core.budget"):
        budget.check([budget.Estimate("prompts.queries", 10, flop=1e9)])
    assert caplog.records == []  # small work says nothing


def test_capture_with_inputs_on_the_meta_device():
    """capture(model, torch.zeros(2, 8, 3, device="meta"), torch.zeros(2, 8, device="meta")) raised
    torch's "Tensor.item() cannot be called on meta tensors"."""
    from probe.capture import capture
    from probe.models import build_model

    model = build_model(build_cfg().model).eval()
    with pytest.raises(ConfigError, match="xs is on the meta device, which holds shapes but no values"):
        capture(model, torch.zeros(2, 8, 3, device="meta"), torch.zeros(2, 8, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("induced", [8, 4])
def test_a_small_users_recipe_completes_with_starved_stages_not_measured(tmp_path, induced):
    """A d = 3, 8-point GPT-2 and a recipe whose [prompts] are curve 32, train 32, val 16, test 32,
    induced 8 (spectral never mentioned) exited 2 on the spectral stage's min_count; the report
    completes (exit 0), and a stage the prompts starve (induced 4 here: too few eigen-directions for
    one bin) is written as "not measured here" with its reason, a caveat and no evidence; the stage's
    own command still refuses."""
    from probe.cli import main

    ck = tmp_path / "tiny3"
    assert main(["-q", "train", "--recipe", "tiny", "--set", "model.n_dims=3", "--set", "task.n_dims=3", "--set",
                 "task.n_points=8", "--out", str(ck)]) == 0
    sets = [f"prompts.{k}={v}" for k, v in (("curve", 32), ("train", 32), ("val", 16), ("test", 32),
                                            ("induced", induced))]
    sets.append("steering.enabled=true")  # every stage on: quick runs all but steering
    args = ["-q", "report", str(ck), "--recipe", "quick", "--out", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    from probe.core.stages import by_block_key

    stages = [key for key, stage in by_block_key().items() if stage.keys == (key,)]  # the others: fields as keys
    assert all(summary.get(key) is not None for key in stages), "every stage wrote its block"
    spectral = summary["spectral"]
    page = (tmp_path / "r" / "index.html").read_text()
    if spectral["status"] == "not measured":
        assert "raise" in spectral["reason"] or "prompts.induced" in spectral["reason"]
        assert spectral["knob"] == "prompts.induced"
        assert "Spectral filter not measured here" in page
        rows = [r for q in summary["evidence"] for r in q["rows"] if r["instrument"] == "spectral filter"]
        assert rows and all(r["favours"] is None and r["status"] == "not measured" for r in rows)
        with pytest.raises(ConfigError, match="spectral.min_count"):
            from probe.analysis.pipeline import LayerSettings, analyse_spectrum
            from probe.core.settings import PromptSettings
            from probe.io.formats import load_checkpoint

            loaded = load_checkpoint(ck)
            analyse_spectrum(loaded.model, loaded.config.task, LayerSettings(PromptSettings(32, 32, 16, 32, induced)))
    assert induced == 8 or spectral["status"] == "not measured"  # induced 4 starves it on these prompts


@pytest.mark.slow
def test_stages_that_cannot_run_on_a_checkpoint_are_written_not_measured(tmp_path):
    """The smoke recipe switches every stage on; on the shipped LSTM the intervention stages have no
    residual stream to edit: the report completes, and each is written as "not measured here" with
    its reason and knob (summary and page), not skipped silently."""
    from probe.cli import main

    out = tmp_path / "r"
    assert main(["-q", "report", str(REPO / "checkpoints" / "lstm-default"), "--recipe", "smoke", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    skipped = {row["stage"]: row for row in summary["not_measured"]}
    assert set(skipped) == {"interventions", "steering"}
    for stage, row in skipped.items():
        assert row["status"] == "not measured" and row["knob"] == f"{stage}.enabled"
        assert "lstm model, with no attention heads or residual stream" in row["reason"]
        assert summary.get(stage) is None
    page = (out / "index.html").read_text()
    assert page.count("not measured here: this checkpoint is a lstm model") == 2
    from probe.reporting.schema import Summary

    assert Summary.from_json(summary).not_measured[0].stage == "interventions"


def test_off_distribution_shifts_on_a_relu_task_are_not_measured_with_why():
    """Garg et al.'s shifts are defined on isotropic linear regression: a report asked for them on a
    ReLU-network checkpoint records why, and runs nothing."""
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import resolve_recipe
    from probe.stages.ood import shifts_refusal

    relu = load_checkpoint(REPO / "checkpoints" / "gpt2-relu3")
    assert shifts_refusal(relu).startswith("Garg et al.'s shifts are defined on isotropic linear regression")
    assert "relu_network" in shifts_refusal(relu)
    assert shifts_refusal(load_checkpoint(REPO / "checkpoints" / "gpt2-default")) == ""
    built = run_stages(relu, resolve_recipe("smoke"), "cpu", StageCache(None), False, only={"ood"})
    assert built.not_measured == {"ood": shifts_refusal(relu)} and not built.tables
