import numpy as np
import torch
from conftest import build_cfg

from probe.analysis.evaluate import error_curve, eval_prompts
from probe.data.config import TaskConfig
from probe.models import build_model


def test_least_squares_column_equals_numpy_lstsq():
    task = TaskConfig(n_dims=3, n_points=8)
    model = build_model(build_cfg().model)
    frame = error_curve(model, task, n_prompts=40, seed=3, n_boot=50)
    prompts = eval_prompts(task, 40, 3)
    xs, ys = prompts.xs.double().numpy(), prompts.ys.double().numpy()
    err = np.zeros((40, 8))
    for b in range(40):
        for t in range(8):
            w = np.linalg.lstsq(xs[b, :t], ys[b, :t], rcond=None)[0] if t else np.zeros(3)
            err[b, t] = (xs[b, t] @ w - ys[b, t]) ** 2 / 3
    np.testing.assert_allclose(frame.least_squares, err.mean(0), rtol=1e-6, atol=1e-9)
    assert list(frame.columns) == [
        "n_examples", "model", "model_lo", "model_hi", "least_squares", "knn3", "averaging",
        "zero", "trivial_margin", "trivial_margin_lo", "trivial_margin_hi",
    ]
    np.testing.assert_allclose(frame.zero, (ys**2).mean(0) / 3, rtol=1e-6)
    assert (frame.model_lo <= frame.model).all() and (frame.model <= frame.model_hi).all()


def test_model_column_is_the_mean_squared_error_over_d():
    class Zero(torch.nn.Module):
        def forward(self, xs, ys):
            return torch.zeros_like(ys)

    task = TaskConfig(n_dims=4, n_points=5)
    frame = error_curve(Zero(), task, n_prompts=30, seed=0, n_boot=20)
    ys = eval_prompts(task, 30, 0).ys.double()
    np.testing.assert_allclose(frame.model, (ys**2 / 4).mean(0).numpy(), rtol=1e-6)
