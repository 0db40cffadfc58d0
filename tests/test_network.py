"""The batched direct-training baseline for ReLU-network tasks (Wu et al. 2024, App. G)."""

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.metrics import r2_score

from probe.data.config import TaskConfig
from probe.data.tasks import generator_for, sample_prompts
from probe.learners import run_learner
from probe.learners.network import init_networks, layer_sizes, network_forward


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_batched_training_matches_one_network_with_torch_optim(optimizer):
    task = TaskConfig(name="relu_network", n_dims=3, n_points=7, relu_depth=3, relu_width=5)
    p = sample_prompts(task, 4, generator=generator_for(0))
    xs, ys = p.xs.double(), p.ys.double()
    steps = [0, 1, 5, 12]
    res = run_learner("relu_gd", xs, ys, steps=steps, lr=0.05, depth=3, width=6, optimizer=optimizer, seed=3)
    init = init_networks((4, 7), layer_sizes(3, 3, 6), seed=3)
    for b, t in [(0, 1), (2, 4), (3, 6)]:
        layers = []
        for j in range(0, len(init), 2):
            lin = torch.nn.Linear(init[j].shape[-1], init[j].shape[-2], dtype=torch.float64)
            with torch.no_grad():
                lin.weight.copy_(init[j][b, t])
                lin.bias.copy_(init[j + 1][b, t])
            layers += [lin, torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers[:-1])
        opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(net.parameters(), lr=0.05)
        for k in range(max(steps) + 1):
            if k in steps:
                with torch.no_grad():
                    expected = net(xs[b, t : t + 1]).item()
                assert res.preds[steps.index(k), b, t].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
            loss = 0.5 * ((net(xs[b, :t]).squeeze(-1) - ys[b, :t]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_network_forward_by_hand():
    params = [torch.tensor([[[1.0, -1.0]]]), torch.tensor([[0.5]]), torch.tensor([[[2.0]]]), torch.tensor([[1.0]])]
    x = torch.tensor([[[3.0, 1.0], [0.0, 2.0]]])
    # hidden = relu(x1 - x2 + 0.5) -> [2.5, 0]; out = 2 h + 1
    assert network_forward(params, x).tolist() == [[6.0, 1.0]]


def test_r2_curve_matches_sklearn():
    from probe.analysis.stats import r2_score as r2_ours

    g = np.random.default_rng(0)
    y, pred = g.standard_normal((50, 6)), g.standard_normal((50, 6))
    ours = r2_ours(torch.tensor(y), torch.tensor(pred)).numpy()
    np.testing.assert_allclose(ours, [r2_score(y[:, t], pred[:, t]) for t in range(6)])
    # a constant truth: sklearn's convention (1 when predicted exactly, else 0)
    const = np.ones((5, 2))
    np.testing.assert_allclose(r2_ours(torch.tensor(const), torch.tensor(const + [[0.0, 1.0]])).numpy(),
                               [r2_score(const[:, t], const[:, t] + [0.0, 1.0][t]) for t in range(2)])


def test_evaluate_cli_on_a_relu_task_with_shifts(tmp_path, capsys):
    import pandas as pd
    from conftest import REPO

    from probe.cli import main

    run = tmp_path / "relu"
    assert main(["-q", "train", "--recipe", str(REPO / "recipes" / "tiny.toml"), "--set", "task.name=relu_network",
                 "--set", "train.steps=5", "--out", str(run)]) == 0
    assert main(["-q", "evaluate", str(run), "--prompts", "32", "--epochs", "5", "--mixture", "0.5,0.5",
                 "--param-mean", "0.5", "--out", str(tmp_path / "e")]) == 0
    frame = pd.read_csv(tmp_path / "e" / "icl_r2.csv")
    assert list(frame.columns) == ["n_examples", "model", "model_lo", "model_hi", "direct", "direct_best_epoch",
                                   "least_squares", "knn3"]
    assert (frame.direct_best_epoch >= frame.direct - 1e-12).all()
    assert "R^2:" in capsys.readouterr().out
    options = json.loads((tmp_path / "e" / "evaluate_summary.json").read_text())["options"]
    assert options == {"mixture": "0.5,0.5", "param_mean": 0.5, "epochs": 5}
    assert main(["evaluate", str(REPO / "checkpoints" / "gpt2-default"), "--mixture", "0.5,0.5"]) == 2
    assert "apply to ReLU-network tasks only" in capsys.readouterr().err


def test_r2_curve_checks_its_knobs_before_any_work_as_the_error_curve_does():
    """Too many prompts, or direct networks trained for too many epochs, are refused naming the knob
    (before, the prompts reached torch's allocator); the report's up-front check counts the direct
    networks of a ReLU-network checkpoint."""
    from conftest import build_cfg

    from probe.analysis.evaluate import direct_network_estimates, r2_curve
    from probe.core.errors import ConfigError
    from probe.models import build_model
    from probe.reporting.recipe import resolve_recipe
    from probe.stages.evaluate import EvaluateStage

    cfg = build_cfg()
    cfg.task = replace(cfg.task, name="relu_network")
    model = build_model(cfg.model).eval()
    with pytest.raises(ConfigError, match=r"^prompts = 1000000000 would need about .* lower prompts"):
        r2_curve(model, cfg.task, n_prompts=10**9)
    with pytest.raises(ConfigError, match=r"^epochs = 10000000000 makes this need about .*; lower epochs"):
        r2_curve(model, cfg.task, n_prompts=64, epochs=10**10)
    with pytest.raises(ConfigError, match="direct_prompts must be"):
        r2_curve(model, cfg.task, n_prompts=64, direct_prompts=0)
    # by hand: d = 3, width max(32, 16), depth 3: 3*32 + 32*32 + 2*32 + 32 + 1 = 1217 parameters per network
    memory, work = direct_network_estimates(cfg.task, networks=2, points=8, epochs=5)
    assert work.flop == 6.0 * 5 * 2 * 8 * 8 * 1217
    assert memory.nbytes == 8.0 * 2 * 8 * (2 * 8 * 32 * 2 + 4 * 1217)
    recipe = resolve_recipe("smoke")
    ckpt = SimpleNamespace(config=cfg)
    assert [(e.knob, e.value) for e in EvaluateStage().estimates(recipe, ckpt)] == [("prompts.curve", recipe.prompts.curve)] * 3
    cfg.task = replace(cfg.task, name="linear_regression")
    assert [e.knob for e in EvaluateStage().estimates(recipe, ckpt)] == ["prompts.curve"]
