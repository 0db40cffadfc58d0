"""Which learner a model tracks off its training distribution (issue 64 item 2).

Learners that match a model equally well in distribution can part ways under a shift: GD with a
fixed step diverges on inputs scaled up where GD whose step adapts to S (eta = 1 / lambda_max)
does not; Newton started at a fixed scale alpha (as a planted model computes it) against the
spectral rule. So:

1. **Match in distribution.** On unshifted prompts of the checkpoint's task, every member of each
   candidate family (CANDIDATES: its hyper-parameter grid) is compared with the model's own
   prediction at every prefix t >= 1; the member with the least mean squared distance / d is that
   family's match (its fixed step, alpha rule or penalty, and its step count).
2. **Follow off distribution.** On the shifted prompts (probe/data/shifts.py), each matched member
   is asked the shift's queries beside the model; per family the mean squared distance / d between
   its predictions and the model's, and its own error / d, with 90% intervals over resamples of the
   prompts (paired across families), and the share of prompts on which it overflowed (`diverged`:
   its distance is then NaN, as far from the model as can be). The model *tracks* the family at the
   least distance; the paired difference to the runner-up says whether the two can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..core.seeds import Stream, stream_generator
from ..core.validate import check_model, positive_int
from ..data.config import TaskConfig
from ..data.tasks import sample_prompts
from ..learners import run_learner
from ..learners.iterative import NEWTON_ITERATIONS
from .evaluate import Prompts, predict, shifted_predictions
from .stats import percentile_interval, resamples

# GD steps on L = |y - X w|^2 / (2t) (paper convention), 8% apart; Newton's M_0 = a S / t
FIXED_ETAS = tuple(float(v) for v in np.geomspace(0.02, 0.5, 21))
FIXED_ALPHAS = tuple(float(v) for v in np.geomspace(0.01, 1.0, 11))
STEPS = tuple(range(17)) + tuple(2**k for k in range(5, 13))  # every count to 16, then 32 .. 4096
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "gd_fixed_step": ("gd", {"eta": FIXED_ETAS, "steps": STEPS}),
    "gd_adaptive_step": ("gd", {"eta": ("auto",), "steps": STEPS}),
    "newton_fixed_alpha": ("newton", {"alpha": FIXED_ALPHAS, "iterations": NEWTON_ITERATIONS}),
    "newton_spectral_alpha": ("newton", {"alpha": ("spectral",), "iterations": NEWTON_ITERATIONS}),
    "ridge": ("ridge", {"lam": (1e-3, 1e-2, 1e-1, 1.0, 10.0)}),
    "least_squares": ("least_squares", {}),
}
LEVEL = 0.90
REFINE = 1  # rounds of the fixed GD step's refinement (matched_members)
CLOSE = 0.1  # the closest family's distance over the model's mean squared prediction, above which none is close


@dataclass
class Tracking:
    """The comparison of one shift: `table` one row per family (member matched in distribution,
    distance to the model off distribution with its interval, the family's and the model's error
    / d); the family tracked, the runner-up, and their paired difference in distance with its
    interval (`separable`: the interval excludes 0)."""

    table: pd.DataFrame
    tracks: str
    runner_up: str
    difference: float
    low: float
    high: float

    @property
    def separable(self) -> bool:
        return self.low > 0


def matched_members(model: nn.Module, task: TaskConfig, n_prompts: int = 256, seed: int = 0, device: str = "cpu"):
    """Per family of CANDIDATES, the grid member closest to the model in distribution: {family:
    (learner, params, distance / d)} from `n_prompts` unshifted prompts (the probe-train stream)."""
    p = sample_prompts(task, n_prompts, generator=stream_generator(seed, Stream.PROBE_TRAIN))
    model_pred = predict(model, Prompts(p.xs, p.ys), device=device).double()[:, 1:]

    def closest(learner: str, grid: dict[str, Any]) -> tuple[dict[str, Any], float]:
        result = run_learner(learner, p.xs, p.ys, **grid)
        dist = ((result.preds[:, :, 1:] - model_pred) ** 2).mean((1, 2)) / task.n_dims  # (K,)
        best = int(torch.nan_to_num(dist, nan=float("inf")).argmin())
        return result.grid[best], float(dist[best])

    out = {}
    for family, (learner, grid) in CANDIDATES.items():
        member, dist = closest(learner, grid)
        for _ in range(REFINE if family == "gd_fixed_step" else 0):
            # in distribution a small fixed step is set by eta x steps: search every step count at
            # that product, eta within 25% of it (2% apart), so that the count is found too
            total = member["eta"] * member["steps"]
            tries = [
                closest(
                    learner, {"eta": tuple(e for e in total / s * np.geomspace(0.8, 1.25, 23) if e <= 1), "steps": (s,)}
                )
                for s in STEPS
                if s and total / s * 0.8 <= 1
            ]
            member, dist = min([(member, dist), *tries], key=lambda pair: pair[1])
        out[family] = (learner, {k: (v,) for k, v in member.items()}, dist)
    return out


def track_under_shift(
    model: nn.Module,
    task: TaskConfig,
    shift: str,
    n_prompts: int = 1280,
    seed: int = 0,
    device: str = "cpu",
    n_boot: int = 1000,
    matched: dict | None = None,
) -> Tracking:
    """The module docstring's comparison for one shift (NAME or NAME=VALUE); `matched` from
    `matched_members` where already computed (it does not depend on the shift)."""
    check_model(model)
    n_prompts, n_boot = positive_int(n_prompts, "prompts"), positive_int(n_boot, "bootstrap")
    matched = matched if matched is not None else matched_members(model, task, seed=seed, device=device)
    p, model_pred, defined = shifted_predictions(model, task, shift, n_prompts, seed, device=device)
    use = defined.clone()
    use[0] = False  # no example seen: every learner predicts 0
    queries = torch.nan_to_num(p.queries)
    d, y = task.n_dims, p.query_ys.double()[:, use]
    model_pred = model_pred.double()[:, use]
    distance, error, diverged = {}, {}, {}
    for family, (learner, params, _) in matched.items():
        result = run_learner(learner, p.xs, p.ys, queries, **params)
        assert result.query_preds is not None
        pred = torch.diagonal(result.query_preds[0], dim1=1, dim2=2)[:, use]  # (P, t): position t's own query
        distance[family] = ((pred - model_pred) ** 2).mean(1) / d  # per prompt
        diverged[family] = float((~torch.isfinite(pred).all(1)).double().mean())
        error[family] = ((pred - y) ** 2).mean(1) / d
    families = list(matched)
    per_prompt = torch.stack([distance[f] for f in families], 1)  # (P, F)
    draws = torch.cat([per_prompt[idx].mean(1) for idx in resamples(len(per_prompt), n_boot, seed, 100)])
    lo, hi = percentile_interval(draws, LEVEL)
    point = per_prompt.mean(0)
    order = torch.argsort(torch.nan_to_num(point, nan=float("inf")))
    first, second = int(order[0]), int(order[1])
    diff_lo, diff_hi = percentile_interval((draws[:, second] - draws[:, first]).unsqueeze(1), LEVEL)
    model_error = float(((model_pred - y) ** 2).mean() / d)
    model_size = float((model_pred**2).mean() / d)  # what a distance is relative to
    table = pd.DataFrame(
        {
            "shift": shift,
            "family": families,
            "learner": [matched[f][0] for f in families],
            "matched": [_member_words(matched[f][1]) for f in families],
            "distance_in_distribution": [matched[f][2] for f in families],
            "distance": point.numpy(),
            "distance_low": lo.numpy(),
            "distance_high": hi.numpy(),
            "relative_distance": point.numpy() / max(model_size, 1e-300),
            "diverged": [diverged[f] for f in families],
            "error": [float(error[f].mean()) for f in families],
            "model_error": model_error,
        }
    )
    return Tracking(
        table,
        families[first],
        families[second],
        float(point[second] - point[first]),
        float(diff_lo[0]),
        float(diff_hi[0]),
    )


def _member_words(params: dict[str, tuple]) -> str:
    """A matched member's hyper-parameters, e.g. 'eta=0.1112, steps=6' (GD's default convention left out)."""
    shown = {k: v[0] for k, v in params.items() if not (k == "convention" and v[0] == "paper")}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()) or "-"


def tracking_words(tracking: Tracking) -> str:
    """One line: which family the model tracks under the shift, and whether the runner-up is apart."""
    rows = tracking.table.set_index("family")
    shift = rows.iloc[0]["shift"]
    first = rows.loc[tracking.tracks]
    verdict = (
        f"apart from {tracking.runner_up} (paired difference {tracking.difference:.3g}, 90% interval "
        f"{tracking.low:.3g} to {tracking.high:.3g})"
        if tracking.separable
        else f"not separable from {tracking.runner_up} (paired interval {tracking.low:.3g} to {tracking.high:.3g})"
    )
    close = (
        ""
        if first["relative_distance"] <= CLOSE
        else f"; but no family is close (relative distance {first['relative_distance']:.2f})"
    )
    return (
        f"under {shift} the model tracks {tracking.tracks} ({first['matched']}; distance / d "
        f"{first['distance']:.3g}), {verdict}{close}"
    )
