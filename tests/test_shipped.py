"""The shipped checkpoints load, meet their quality bar, and reproduce the evaluations stored beside them."""

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from probe.analysis.evaluate import error_curve
from probe.io.formats import load_checkpoint

SHIPPED = sorted(p.parent.parent.name for p in (REPO / "checkpoints").glob("*/eval/icl_error.csv"))


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_evaluate_reproduces_stored_numbers(name):
    ckpt = load_checkpoint(REPO / "checkpoints" / name)
    stored = pd.read_csv(REPO / "checkpoints" / name / "eval" / "icl_error.csv")
    fresh = error_curve(ckpt.model, ckpt.config.task, n_prompts=1280, seed=0)
    pd.testing.assert_frame_equal(fresh, stored, check_exact=False, rtol=1e-4, atol=1e-7)
    if ckpt.config.task.name == "relu_network":
        # R^2 of the model itself (the direct-training columns take minutes; tests/test_network.py covers them)
        from probe.analysis.evaluate import eval_prompts, predict
        from probe.analysis.stats import r2_score

        stored_r2 = pd.read_csv(REPO / "checkpoints" / name / "eval" / "icl_r2.csv")
        prompts = eval_prompts(ckpt.config.task, 1280, 0)
        fresh_r2 = r2_score(prompts.ys, predict(ckpt.model, prompts)).numpy()
        np.testing.assert_allclose(fresh_r2, stored_r2.model, rtol=1e-4, atol=1e-6)


def test_default_checkpoint_meets_the_quality_bar():
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    assert ckpt.config.model.n_layer >= 8
    stored = pd.read_csv(REPO / "checkpoints" / "gpt2-default" / "eval" / "icl_error.csv").set_index("n_examples")
    assert stored.model[2 * ckpt.config.task.n_dims + 1] < 0.01
    assert sum(p.stat().st_size for p in (REPO / "checkpoints" / "gpt2-default").rglob("*") if p.is_file()) < 10 * 2**20


def test_shipped_set_is_complete():
    assert {"gpt2-default", "lstm-default", "gpt2-illcond"} <= set(SHIPPED)


# across machines (another CPU's float32 kernels in the model's forward) the spectral block's fits, slopes
# and interval ends of log(-log(1 - r)), move by up to 2e-5 relative (measured: the committing machine
# against an AVX-512 Xeon); every other number of the default report agrees to 1e-6
CROSS_MACHINE = {"spectral": 1e-4}


def _numbers_differ(a, b, path: str = "") -> list[str]:
    """Paths where two summary.json trees differ (numbers beyond 1e-6 relative, or the block's
    CROSS_MACHINE tolerance), ignoring the fields that record when, where and how fast a report
    was made."""
    if isinstance(a, dict) and isinstance(b, dict):
        skip = {"created", "timings", "git_commit", "versions", "cached_stages"}
        keys = (set(a) | set(b)) - skip
        return [d for k in sorted(keys) for d in (_numbers_differ(a.get(k), b.get(k), f"{path}/{k}"))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _numbers_differ(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return []
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        tol = CROSS_MACHINE.get(path.split("/")[1] if path.count("/") else "", 1e-6)
        return [] if abs(a - b) <= tol * max(1.0, abs(a)) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.slow
def test_the_committed_default_report_is_reproduced(tmp_path):
    """`icl-probe report` on the shipped default, rebuilt here, gives the committed example's
    summary.json to 1e-6 in every number, probes included (the spectral block to CROSS_MACHINE's).
    Rebuilt as scripts/regenerate_reports.sh builds it, in a process on two OpenMP threads: the
    probe fits' round-off depends on the thread count (the random-weights control's MLP probe at
    the last layer moves by 1.3e-6 in R^2 on one thread, as the test workers run)."""
    import json
    import os
    import subprocess
    import sys

    committed = REPO / "reports" / "gpt2-default-quick" / "summary.json"
    command = [sys.executable, "-m", "probe", "-q", "report", str(REPO / "checkpoints" / "gpt2-default"),
               "--out", str(tmp_path / "r"), "--no-cache"]  # fmt: skip
    run = subprocess.run(command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "2"}, capture_output=True,
                         text=True, timeout=1800, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    fresh = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert _numbers_differ(json.loads(committed.read_text()), fresh) == []


def test_a_stored_shift_evaluation_is_reproduced():
    """checkpoints/<name>/eval-shift-*/ (`icl-probe evaluate --shift`): the input-scale-3 one again."""
    from probe.analysis.evaluate import shifted_error_curve

    stored = pd.read_csv(REPO / "checkpoints" / "gpt2-default" / "eval-shift-scale_x-3" / "icl_error.csv")
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-default")
    fresh = shifted_error_curve(ckpt.model, ckpt.config.task, "scale_x", 3.0, 1280, 0)
    cols = ["model", "model_lo", "model_hi", "least_squares", "knn3", "averaging"]
    np.testing.assert_allclose(fresh[cols].to_numpy(), stored[cols].to_numpy(), rtol=1e-6, atol=1e-9)
    assert (stored["shift"] == "scale_x=3").all()


def _normalised_upper_band(name: str):
    """(checkpoint, its task, the upper band of its stored normalised error MSE / var(y) from 2d+1
    examples on): var(y) = trace(Sigma) = (d/2) kappa + d/2 for the ill-conditioned task."""
    ckpt = load_checkpoint(REPO / "checkpoints" / name)
    task = ckpt.config.task
    stored = pd.read_csv(REPO / "checkpoints" / name / "eval" / "icl_error.csv").set_index("n_examples")
    variance = (task.n_dims // 2) * task.kappa + (task.n_dims - task.n_dims // 2)
    return ckpt, task, stored.model_hi[2 * task.n_dims + 1 :] * task.n_dims / variance


def test_the_retrained_ill_conditioned_d4_checkpoint_meets_issue_57s_bar():
    """gpt2-illcond-24k: var(y) = 2 x 100 + 2 x 1 = 202, normalised error error / d x 4 / 202 at most
    0.01 at 2d+1 examples and beyond (gpt2-illcond, 12,000 steps, is at 0.012)."""
    _, task, normalised = _normalised_upper_band("gpt2-illcond-24k")
    assert (task.n_dims, task.covariance, task.kappa) == (4, "ill_conditioned", 100.0)
    assert (normalised < 0.01).all()


def test_the_ill_conditioned_d8_checkpoint_meets_issue_57s_bar():
    """gpt2-d8-illcond: kappa = 100, so var(y) = trace(Sigma) = 4 x 100 + 4 x 1 and the normalised
    error MSE / var(y) is error / d x d / 404: at most 0.01 at 2d+1 examples and beyond."""
    ckpt, task, normalised = _normalised_upper_band("gpt2-d8-illcond")
    assert (ckpt.config.model.n_layer, task.n_dims, task.covariance, task.kappa) == (12, 8, "ill_conditioned", 100.0)
    assert (normalised < 0.01).all()


def test_the_d8_checkpoint_meets_issue_57s_bar():
    """gpt2-d8: 12 layers, d = 8, normalised error (MSE / var(y) = error / d for isotropic x and w)
    at most 0.01 at 2d+1 examples and beyond."""
    ckpt = load_checkpoint(REPO / "checkpoints" / "gpt2-d8")
    d = ckpt.config.task.n_dims
    assert (ckpt.config.model.n_layer, d, ckpt.config.task.covariance) == (12, 8, "isotropic")
    stored = pd.read_csv(REPO / "checkpoints" / "gpt2-d8" / "eval" / "icl_error.csv").set_index("n_examples")
    assert (stored.model_hi[2 * d + 1 :] < 0.01).all()
