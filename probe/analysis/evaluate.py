"""In-context error of a model against the number of examples, beside baselines (Garg et al.).

The metric is squared error divided by d (1.0 is the trivial zero predictor on isotropic
linear regression), averaged over prompts, with a bootstrap 5%-95% band for the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..core import budget
from ..core.progress import tqdm
from ..core.seeds import Stream
from ..core.validate import check_bootstrap, positive_int
from ..data.config import TaskConfig
from ..data.metrics import error_per_dim
from ..data.tasks import Prompts, generator_for, sample_prompts
from ..learners import run_learner
from ..models.sizes import forward_batch, shape_of
from .stats import bootstrap_mean, bootstrap_r2, r2_score

EVAL_STREAM = Stream.EVALUATION  # keeps evaluation prompts apart from the training stream
DIRECT_PROMPTS, DIRECT_EPOCHS = 256, 100  # r2_curve's direct networks: prompts trained on, Adam epochs


def eval_prompts(task: TaskConfig, n_prompts: int, seed: int, n_points: int | None = None) -> Prompts:
    """The fixed evaluation prompts for (task, seed): the same on every call and machine."""
    return sample_prompts(task, n_prompts, n_points, generator=generator_for(seed, EVAL_STREAM))


@torch.no_grad()
def predict(
    model: nn.Module, prompts: Prompts, batch_size: int = 256, device: str = "cpu", progress: bool = False
) -> torch.Tensor:
    """Model predictions (P, n) in batches, on `device`, returned on the CPU."""

    model = model.to(device).eval()
    if all(hasattr(model, name) for name in ("n_layers", "d_model")):  # the model protocol
        batch_size = forward_batch(model, prompts.xs.shape[1], batch_size)
    out = []
    starts = range(0, prompts.xs.shape[0], batch_size)
    for s in tqdm(starts, desc="predict", disable=not progress, leave=False):
        out.append(
            model(prompts.xs[s : s + batch_size].to(device), prompts.ys[s : s + batch_size].to(device)).float().cpu()
        )
    return torch.cat(out)


def curve_prompts(
    model: nn.Module,
    task: TaskConfig,
    n_prompts: int,
    seed: int,
    n_points: int | None,
    n_boot: int,
    extra: Sequence[budget.Estimate] = (),
) -> Prompts:
    """A curve's evaluation prompts, once its knobs are checked (counts, then memory and work on this
    machine, probe/core/budget.py): the model's forward over the prompts, the bootstrap of its band,
    and the curve's own `extra` estimates."""
    n_prompts, n_boot = positive_int(n_prompts, "prompts"), check_bootstrap(n_boot, "bootstrap")
    points = n_points or task.n_points
    budget.check(
        [
            budget.prompt_estimate("prompts", n_prompts, shape_of(model), points),
            budget.bootstrap_estimate("bootstrap", n_boot, n_prompts, points * 4),
            *extra,
        ]
    )
    return eval_prompts(task, n_prompts, seed, n_points)


def direct_network_estimates(
    task: TaskConfig, networks: int, points: int, epochs: int, knobs: tuple[str, str] = ("direct_prompts", "epochs")
) -> list[budget.Estimate]:
    """What r2_curve's direct networks ask for (learners/network.py: one network per prompt and
    prefix, each evaluated on all `points` points of its prompt, float64, Adam): the kept
    activations, parameters, gradients and moments, and a forward and backward pass per epoch,
    named by `knobs` (the knob that sets the networks' count, the one that sets the epochs)."""
    width, depth, d = max(32, task.relu_width), task.relu_depth, task.n_dims
    params = d * width + (depth - 2) * width * width + (depth - 1) * width + width + 1
    nbytes = 8.0 * networks * points * (2 * points * width * (depth - 1) + 4 * params)
    return [
        budget.Estimate(knobs[0], networks, nbytes),
        budget.Estimate(knobs[1], epochs, flop=6.0 * epochs * networks * points * points * params),
    ]


def error_curve(
    model: nn.Module,
    task: TaskConfig,
    n_prompts: int = 1280,
    seed: int = 0,
    n_points: int | None = None,
    device: str = "cpu",
    n_boot: int = 1000,
    progress: bool = False,
) -> pd.DataFrame:
    """One row per number of in-context examples t = 0..n-1: model error/d with its band and baselines.
    The prompts and resamples asked for are checked against the machine first (probe/core/budget.py)."""
    prompts = curve_prompts(model, task, n_prompts, seed, n_points, n_boot)
    d = task.n_dims
    sq = lambda pred: error_per_dim(pred.double(), prompts.ys.double(), d)  # (P, n)
    model_err = sq(predict(model, prompts, device=device, progress=progress))
    lo, hi = bootstrap_mean(model_err, n_boot=n_boot, seed=seed)
    baselines = {
        "least_squares": run_learner("least_squares", prompts.xs, prompts.ys).preds[0],
        "knn3": run_learner("knn", prompts.xs, prompts.ys, k=(3,)).preds[0],
        "averaging": run_learner("averaging", prompts.xs, prompts.ys).preds[0],
    }
    frame = pd.DataFrame(
        {
            "n_examples": np.arange(prompts.xs.shape[1]),
            "model": model_err.mean(0).numpy(),
            "model_lo": lo.numpy(),
            "model_hi": hi.numpy(),
        }
    )
    for name, pred in baselines.items():
        frame[name] = sq(pred).mean(0).numpy()
    zero_err = sq(torch.zeros_like(prompts.ys))
    frame["zero"] = zero_err.mean(0).numpy()
    lo_m, hi_m, margin = trivial_margin(model_err, sq(baselines["averaging"]), zero_err, n_boot, seed)
    frame["trivial_margin"], frame["trivial_margin_lo"], frame["trivial_margin_hi"] = margin, lo_m, hi_m
    return frame


def paired_error_difference(
    model_a: nn.Module,
    model_b: nn.Module,
    task: TaskConfig,
    n_prompts: int = 1280,
    seed: int = 0,
    device: str = "cpu",
    n_boot: int = 1000,
) -> pd.DataFrame:
    """Two models of one task on the same prompts: per number of examples t, the mean over prompts
    of error/d(a) - error/d(b) with its 90% paired bootstrap interval, and which is lower ("a",
    "b", or None where the interval reaches 0)."""
    prompts = curve_prompts(model_a, task, n_prompts, seed, None, n_boot)
    sq = lambda model: error_per_dim(predict(model, prompts, device=device).double(), prompts.ys.double(), task.n_dims)
    diff = sq(model_a) - sq(model_b)  # (P, n), paired: the same prompts
    lo, hi = bootstrap_mean(diff, n_boot=n_boot, seed=seed)
    frame = pd.DataFrame(
        {
            "n_examples": np.arange(prompts.xs.shape[1]),
            "difference": diff.mean(0).numpy(),
            "ci_low": lo.numpy(),
            "ci_high": hi.numpy(),
        }
    )
    frame["lower"] = [("a" if h < 0 else "b" if lw > 0 else None) for lw, h in zip(frame.ci_low, frame.ci_high)]
    return frame


def trivial_margin(model_err: Tensor, averaging_err: Tensor, zero_err: Tensor, n_boot: int, seed: int):
    """How far the model's error / d sits below the better (on average, per position) of the zero
    predictor and the averaging estimator x_q . X^T y / t, the two predictors that need no learning
    in context beyond a mean: per position the mean margin and its paired 90% interval over
    resampled prompts (P, n) -> three (n,) arrays. A margin whose interval excludes 0 from above is a
    model that learns in context at that position (the evidence table's precondition)."""
    better = torch.where(averaging_err.mean(0) < zero_err.mean(0), averaging_err, zero_err)  # (P, n)
    diff = better - model_err
    lo, hi = bootstrap_mean(diff, n_boot=n_boot, seed=seed + 1)
    return lo.numpy(), hi.numpy(), diff.mean(0).numpy()


def r2_curve(
    model: nn.Module,
    task: TaskConfig,
    n_prompts: int = 1280,
    seed: int = 0,
    n_points: int | None = None,
    device: str = "cpu",
    epochs: int = DIRECT_EPOCHS,
    lr: float = 0.01,
    n_boot: int = 1000,
    direct_prompts: int = DIRECT_PROMPTS,
    progress: bool = False,
) -> pd.DataFrame:
    """R^2 of in-context predictions against the number of examples (Wu et al. 2024, App. G), beside
    training the task's N-layer ReLU network directly on each prompt's examples for `epochs`
    full-batch Adam steps (all prompts' networks at once): `direct` after the last epoch and
    `direct_best_epoch`, the best epoch per position, as that paper reports. The direct networks
    (width max(32, task width); that paper used 200) train on the first `direct_prompts` prompts,
    their cost being a network per prompt and prefix. Every knob is checked first, as error_curve's."""
    epochs, direct_prompts = positive_int(epochs, "epochs"), positive_int(direct_prompts, "direct_prompts")
    m, points = min(direct_prompts, positive_int(n_prompts, "prompts")), n_points or task.n_points
    prompts = curve_prompts(
        model, task, n_prompts, seed, n_points, n_boot, direct_network_estimates(task, m, points, epochs)
    )
    ys = prompts.ys.double()
    pred = predict(model, prompts, device=device, progress=progress).double()
    lo, hi = bootstrap_r2(ys, pred, n_boot, seed)
    direct = run_learner(
        "relu_gd",
        prompts.xs[:m].to(device),
        prompts.ys[:m].to(device),
        steps=range(1, epochs + 1),
        lr=lr,
        depth=task.relu_depth,
        width=max(32, task.relu_width),
        seed=seed,
    ).preds.cpu()
    r2_direct = r2_score(ys[:m], direct)  # (epochs, n)
    frame = pd.DataFrame(
        {
            "n_examples": np.arange(ys.shape[1]),
            "model": r2_score(ys, pred).numpy(),
            "model_lo": lo.numpy(),
            "model_hi": hi.numpy(),
            "direct": r2_direct[-1].numpy(),
            "direct_best_epoch": r2_direct.max(0).values.numpy(),
            "least_squares": r2_score(ys, run_learner("least_squares", prompts.xs, prompts.ys).preds[0]).numpy(),
            "knn3": r2_score(ys, run_learner("knn", prompts.xs, prompts.ys, k=(3,)).preds[0]).numpy(),
        }
    )
    return frame


def plot_error_curve(frame: pd.DataFrame, path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(frame.n_examples, frame.model, label="model", color="C0", lw=2)
    ax.fill_between(frame.n_examples, frame.model_lo, frame.model_hi, color="C0", alpha=0.25)
    baselines = [c for c in frame.columns if c not in ("n_examples", "model", "model_lo", "model_hi")]
    for i, name in enumerate(baselines):
        ax.plot(frame.n_examples, frame[name], label=name.replace("_", " "), ls="--", color=f"C{i + 1}")
    ax.set_xlabel("in-context examples")
    r2 = "direct" in frame.columns
    ax.set_ylabel("R^2" if r2 else "squared error / d")
    if r2:
        ax.set_ylim(-0.5, 1.02)
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@torch.no_grad()
def shifted_predictions(
    model: nn.Module,
    task: TaskConfig,
    shift: str,
    n_prompts: int = 1280,
    seed: int = 0,
    n_points: int | None = None,
    value: float | None = None,
    device: str = "cpu",
):
    """The shifted prompts (probe/data/shifts.py), the model's prediction for each position's
    query (P, n), and which positions the shift defines a query for (n,). Shifts that replace the
    query put q_t after (x_1, y_1, ..., x_t, y_t): models with a key/value cache run each prompt once
    and each query as one token after the cached prefix (probe/analysis/states.py, equal to the
    full sequence up to float round-off); others run the model once per t on the whole sequence."""
    from ..data.shifts import parse_shift, shifted_prompts

    name, parsed = parse_shift(shift)
    value = parsed if value is None else value
    n_prompts = positive_int(n_prompts, "prompts")
    points = n_points or task.n_points
    budget.check([budget.prompt_estimate("prompts", n_prompts, shape_of(model), points)])
    p = shifted_prompts(task, name, n_prompts, seed, n_points, value)
    n = p.xs.shape[1]
    defined = ~p.queries.isnan().any(-1).any(0)  # (n,)
    if p.queries is p.xs:
        return p, predict(model, Prompts(p.xs, p.ys), device=device), defined
    if getattr(model, "key_value_cache", False):
        from .states import query_predictions

        queries = torch.nan_to_num(p.queries)  # undefined positions: any query, masked below
        preds = query_predictions(model, p.xs, p.ys, queries, device, per_prefix=True)[..., 0].float()
        return p, torch.where(defined, preds, torch.full_like(preds, float("nan"))), defined
    preds = torch.full((n_prompts, n), float("nan"))
    for t in range(n):
        if defined[t]:
            xs = torch.cat([p.xs[:, :t], p.queries[:, t : t + 1]], 1)
            ys = torch.cat([p.ys[:, :t], p.query_ys[:, t : t + 1]], 1)
            preds[:, t] = predict(model, Prompts(xs, ys), device=device)[:, t]
    return p, preds, defined


def shifted_error_curve(
    model: nn.Module,
    task: TaskConfig,
    shift: str,
    value: float | None = None,
    n_prompts: int = 1280,
    seed: int = 0,
    n_points: int | None = None,
    device: str = "cpu",
    n_boot: int = 1000,
) -> pd.DataFrame:
    """`error_curve` under one of Garg et al.'s prompt shifts (probe/data/shifts.py): per number
    of examples t, the squared error / d of the model's prediction for the shift's query after
    the first t examples, with its band, beside least squares, 3-NN and averaging asked the same
    query on the same examples. Shifts that replace the query run the model once per t on the
    prompt (x_1, y_1, ..., x_t, y_t, q_t); positions where the shift defines no test are NaN."""
    from ..data.shifts import parse_shift

    name, parsed = parse_shift(shift)
    value = parsed if value is None else value
    n_boot = check_bootstrap(n_boot, "bootstrap")
    p, preds, defined = shifted_predictions(model, task, shift, n_prompts, seed, n_points, value, device)
    n, d = p.xs.shape[1], task.n_dims
    queries = torch.nan_to_num(p.queries)
    sq = lambda pred: error_per_dim(pred.double(), p.query_ys.double(), d)
    model_err = sq(preds)
    lo, hi = bootstrap_mean(model_err, n_boot=n_boot, seed=seed)
    frame = pd.DataFrame(
        {"n_examples": np.arange(n), "model": model_err.mean(0).numpy(), "model_lo": lo.numpy(), "model_hi": hi.numpy()}
    )
    baselines = {
        "least_squares": run_learner("least_squares", p.xs, p.ys, queries),
        "knn3": run_learner("knn", p.xs, p.ys, queries, k=(3,)),
        "averaging": run_learner("averaging", p.xs, p.ys, queries),
    }
    for column, result in baselines.items():
        assert result.query_preds is not None  # queries were given
        diagonal = torch.diagonal(result.query_preds[0], dim1=1, dim2=2)  # (P, n): position t's own query
        frame[column] = sq(diagonal).mean(0).numpy()
    frame.loc[~defined.numpy(), frame.columns[1:]] = np.nan
    return frame.assign(shift=name if value is None else f"{name}={value:g}")
