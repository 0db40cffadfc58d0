"""The GPU path without a GPU: the learners keep every tensor on the prompts'
device and never wait on it (run on the `meta` device, where any host read raises), and the
device check's comparison (benchmarks/gpu.py) flags what it should. Tests marked `gpu` need CUDA."""

import importlib.util
import pathlib

import numpy as np
import pytest
import torch

from probe.learners import run_learner
from probe.learners.registry import LEARNERS

REPO = pathlib.Path(__file__).resolve().parents[1]
# learners whose batched code has no data-dependent host step (k-NN sorts and ReLU training loop
# by design; they are not in the report's hot loops)
ON_DEVICE = ("least_squares", "ridge", "gd", "newton", "newton_identity", "precond_gd", "cg", "bfgs", "lbfgs",
             "ogd", "online_least_squares", "sgd", "adam", "averaging")


@pytest.mark.parametrize("name", ON_DEVICE)
def test_learners_stay_on_the_prompts_device_without_host_reads(name):
    xs = torch.empty(4, 10, 3, device="meta", dtype=torch.float64)
    ys = torch.empty(4, 10, device="meta", dtype=torch.float64)
    queries = torch.empty(4, 5, 3, device="meta", dtype=torch.float64)
    result = LEARNERS.get(name).fn(xs, ys, queries)  # the meta device raises on any .item() or host copy
    assert result.preds.device.type == "meta"
    assert result.query_preds is None or result.query_preds.device.type == "meta"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_check_compares_every_number_and_flags_discrete_changes():
    check = _gpu_check()
    a = {"timings": {"layers": 1.0}, "readout": {"error": [0.5, 0.25]}, "best_match": {"newton": {"sime": {"k": [1, 3]}}},
         "verdicts": [{"verdict": "gd closer", "difference": 0.01}]}
    b = {"timings": {"layers": 9.0}, "readout": {"error": [0.5, 0.25 * (1 + 2e-4)]},
         "best_match": {"newton": {"sime": {"k": [1, 4]}}}, "verdicts": [{"verdict": "gd closer", "difference": 0.01}]}
    continuous, discrete = check.compare(a, b)
    assert {c["path"] for c in continuous} == {"readout.error.0", "readout.error.1", "verdicts.0.difference"}
    outside = [c for c in continuous if not c["within"]]
    assert [c["path"] for c in outside] == ["readout.error.1"]  # 2e-4 against the read-out's 1e-4
    assert discrete == [{"path": "best_match.newton.sime.k.1", "a": 3, "b": 4}]  # timings are not compared
    same, none = check.compare(a, a)
    assert none == [] and all(c["rel"] == 0 for c in same)


def test_the_device_check_keeps_optimiser_diagnostics_out_of_its_maximum():
    check = _gpu_check()
    a = {"probes": {"w_ols": {"linear": {"r2": [0.5], "max_grad_norm": 4e-6, "max_iterations": 106}}}}
    b = {"probes": {"w_ols": {"linear": {"r2": [0.5 * (1 + 1e-5)], "max_grad_norm": 1e-6, "max_iterations": 103}}}}
    continuous, discrete = check.compare(a, b)
    assert discrete == []
    assert sorted(c["path"] for c in continuous if c["diagnostic"]) == [
        "probes.w_ols.linear.max_grad_norm", "probes.w_ols.linear.max_iterations"]
    assert [c["path"] for c in check.results_only(continuous)] == ["probes.w_ols.linear.r2.0"]
    assert check.block_maxima(continuous) == {"probes": pytest.approx(1e-5, rel=1e-3)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ("gd", "newton", "least_squares", "ridge", "precond_gd"))
def test_learners_on_cuda_equal_cpu(name):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(16, 12, 4, generator=g, dtype=torch.float64)
    ys = torch.randn(16, 12, generator=g, dtype=torch.float64)
    cpu, cuda = run_learner(name, xs, ys), run_learner(name, xs.cuda(), ys.cuda())
    torch.testing.assert_close(cuda.preds.cpu(), cpu.preds, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("algorithm,layers", [("gd", 3), ("sgd", 3), ("adam", 4), ("newton", 3), ("newton-relu", 3),
                                             ("prng", 1), ("uniform", 1)])
def test_planted_tokens_are_built_on_the_prompts_device(algorithm, layers):
    """Every planted construction fills its tokens and divisors on the prompts' device (the H100 run
    found them built on the CPU); the meta device raises on any tensor from another device."""
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    model = plant(planted_config(algorithm, layers, 32 if algorithm == "prng" else 4, 10).model).to("meta")
    d = model.config.n_dims
    xs, ys = torch.empty(2, 10, d, device="meta"), torch.empty(2, 10, device="meta")
    h, t = model.tokens(xs, ys)
    assert h.device.type == "meta" and t.device.type == "meta"
    assert model.interleave_runs(h[:, :4], [0, 1, 2, 3], 10).device.type == "meta"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_ood_and_order_learners_run_on_the_reports_device_and_give_the_cpus_numbers(monkeypatch):
    """The [ood] stage's matched members and tracked shifts and the order stage's learners run on
    the report's device (they ran on the CPU beside a CUDA report), with the CPU's answers."""
    from probe.analysis import order, shift_tracking
    from probe.analysis.pipeline import ModelLens
    from probe.io.planted_io import planted_config
    from probe.models.planted import plant

    cfg = planted_config("gd", 3, 4, 10)
    model, task = plant(cfg.model), cfg.task
    seen = []

    def spy(name, xs, *args, **kwargs):
        seen.append(xs.device.type)
        return run_learner(name, xs, *args, **kwargs)

    monkeypatch.setattr(shift_tracking, "run_learner", spy)
    monkeypatch.setattr(order, "run_learner", spy)
    runs = {}
    for device in ("cpu", "cuda"):
        seen.clear()
        matched = shift_tracking.matched_members(model, task, n_prompts=64, device=device)
        tracking = shift_tracking.track_under_shift(
            model, task, "scale_x=3", 64, n_boot=50, matched=matched, device=device
        )
        g = torch.Generator().manual_seed(0)
        xs, ys = torch.randn(8, 10, 4, generator=g), torch.randn(8, 10, generator=g)
        learners = {
            "gd": {"learner": "gd", "grid": {"steps": [8]}},
            "ogd": {"learner": "ogd"},  # order-sensitive: its sensitivities are not round-off
        }
        table = order.order_table(model, ModelLens(model), xs, ys, [6], 4, learners, n_boot=50, device=device)
        assert set(seen) == {device}
        runs[device] = (matched, tracking.table, table)
    (m_cpu, t_cpu, o_cpu), (m_cuda, t_cuda, o_cuda) = runs["cpu"], runs["cuda"]
    assert {f: (v[0], v[1]) for f, v in m_cpu.items()} == {f: (v[0], v[1]) for f, v in m_cuda.items()}
    numeric = t_cpu.select_dtypes("number").columns
    assert t_cpu.drop(columns=numeric).equals(t_cuda.drop(columns=numeric))
    assert np.allclose(
        t_cpu[numeric].to_numpy(float), t_cuda[numeric].to_numpy(float), rtol=1e-6, atol=1e-12, equal_nan=True
    )
    assert np.allclose(o_cpu.sensitivity, o_cuda.sensitivity, rtol=1e-4, atol=1e-12, equal_nan=True)
    assert o_cpu.set_index("predictor").sensitivity["ogd"] > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_token_probes_on_cuda_equal_cpu():
    """The token probes of a GPT-2 model fit on the device (features, targets, ridge) with the CPU's
    answers: R^2 and its intervals to round-off, the chosen penalties equal."""
    from conftest import build_cfg

    from probe.analysis.token_probes import expand_targets, token_probe_study
    from probe.models import build_model

    cfg = build_cfg(layers=2, width=16, d=3, points=8)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    targets = expand_targets(["sx", "newton_mx", "w_ols"], (2,), "spectral")
    cpu, cuda = (token_probe_study(model, cfg.task, targets, 48, 24, n_boot=50, device=d) for d in ("cpu", "cuda"))
    assert cpu[["layer", "token", "target", "penalty"]].equals(cuda[["layer", "token", "target", "penalty"]])
    for column in ("r2", "r2_low", "r2_high", "gain"):
        np.testing.assert_allclose(cuda[column], cpu[column], rtol=1e-6, atol=1e-9)
