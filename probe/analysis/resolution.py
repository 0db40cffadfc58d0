"""Resolution ceilings: how far apart two reference learners can put a model's similarity scores.

For learners a and b and a task condition (d, condition number of the input covariance, label
noise), on the same prompts: a model that *is* learner a after k_a iterations scores 1 against a
and, against b, the best similarity over b's grid, ceiling(k_a) = max_{k_b} mean_P Sim(a_{k_a},
b_{k_b}). So no model can put more than resolution(k_a) = 1 - ceiling(k_a) between the two: a
paired difference in a report (probe/analysis/verdicts.py) is read against it. Tabulated per
metric: SimE over t >= 1 (Fu et al. 2024, eq. 10), SimE over t >= d only, SimW (Fu et al. 2024, eq. 11-12):
the smallest and largest resolution over a's grid (k_a >= 1) and the one at a's last grid value.
SimE on t >= d only runs with label noise: without it, learners that solve the examples exactly
(least squares; any converged iterate) err at round-off there, and the cosine of round-off says
nothing.

The trend: b's matched count k_b against k_a, fitted linear and exponential (Fu et al. 2024, §4: GD needs
exponentially many steps per Newton iteration). It measures a rate: a model running GD whose step
count doubles per layer shows the same trend as one running Newton. `evidence` names, per pair and condition, the
metric with the largest resolution and the trend's shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.errors import ConfigError
from ..core.progress import tqdm
from ..data.config import TaskConfig
from ..data.tasks import generator_for, sample_prompts
from ..learners import run_learner
from ..learners.iterative import LOG_STEPS
from .matching import learner_weights
from .similarity import sime, simw

# learner -> (grid axis, grid): the quick recipe's sweeps (analyses/quick.toml)
LEARNER_GRIDS: dict[str, tuple[str | None, dict]] = {
    "newton": ("iterations", {"iterations": list(range(25))}),
    "gd": ("steps", {"steps": list(LOG_STEPS), "eta": ["auto"]}),
    "least_squares": (None, {}),
    "ogd": (None, {}),
}
PAIRS = (("newton", "gd"), ("newton", "least_squares"), ("gd", "least_squares"), ("gd", "ogd"))
METRICS = ("sime", "sime_t_ge_d", "simw")


@dataclass
class ResolutionGrid:
    """The conditions `resolution_table` runs: every d x kappa x noise."""

    dims: tuple[int, ...] = (4, 8, 20)
    kappas: tuple[float, ...] = (1.0, 10.0, 100.0)
    noises: tuple[float, ...] = (0.0, 0.5)
    prompts: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        """Every condition is a valid task (TaskConfig's rules: d, kappa and noise each), before any work."""
        for d, kappa, noise in itertools.product(self.dims, self.kappas, self.noises):
            try:
                _task(d, kappa, noise)
            except ConfigError as err:
                raise ConfigError(f"resolution condition d = {d}, kappa = {kappa}, noise = {noise}: {err}") from None


def _task(d: int, kappa: float, noise: float) -> TaskConfig:
    covariance = "isotropic" if kappa == 1 else "ill_conditioned"
    return TaskConfig(n_dims=d, n_points=2 * d + 1, covariance=covariance, kappa=kappa, noise_std=noise)


def _similarities(name: str, a, b, ys: torch.Tensor, queries: torch.Tensor, d: int) -> torch.Tensor:
    """(K_a, K_b, P) similarity of every grid value of a with every one of b."""
    if name == "sime":
        return sime(a.preds, b.preds, ys)
    if name == "sime_t_ge_d":
        return sime(a.preds[..., d:], b.preds[..., d:], ys[..., d:], include_first=True)
    return simw(learner_weights(a, queries), learner_weights(b, queries))


@dataclass
class TrendShape:
    """Shape of b's matched count against a's: "flat", "linear" or "exponential", its rate (slope,
    or growth factor per iteration) and both fits' R^2; `words` renders it (nothing parses them)."""

    shape: str
    rate: float | None = None
    linear_r2: float | None = None
    exponential_r2: float | None = None

    @property
    def words(self) -> str:
        if self.shape == "flat":
            return "flat"
        r2 = f"R^2 {self.exponential_r2:.2f} vs linear {self.linear_r2:.2f}"
        if self.shape == "exponential":
            return f"exponential, x{self.rate:.2f} per iteration ({r2})"
        return (
            f"linear, {self.rate:.1f} per iteration (R^2 {self.linear_r2:.2f} vs exponential {self.exponential_r2:.2f})"
        )


def _trend(ks_a: list, ks_b: list) -> TrendShape:
    """Shape of b's matched count against a's (k_a >= 1, before b's grid end)."""
    pairs = [(x, y) for x, y in zip(ks_a, ks_b) if x >= 1 and y > 0]
    if len(pairs) < 3 or len({y for _, y in pairs}) < 2:
        return TrendShape("flat")
    x, y = (np.array(v, dtype=float) for v in zip(*pairs))
    linear = np.polyval(np.polyfit(x, y, 1), x)
    slope, intercept = np.polyfit(x, np.log(y), 1)
    exponential = np.exp(intercept + slope * x)
    r2 = lambda fit: 1 - ((y - fit) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-300)
    lin, exp = float(r2(linear)), float(r2(exponential))
    if exp > lin:
        return TrendShape("exponential", float(np.exp(slope)), lin, exp)
    return TrendShape("linear", float(np.polyfit(x, y, 1)[0]), lin, exp)


def resolution_table(grid: ResolutionGrid, device: str = "cpu", progress: bool = False) -> pd.DataFrame:
    """One row per (d, kappa, noise, pair, metric): resolution_min / _max / _last over a's grid
    (k_a >= 1; module docstring), the k_a of the minimum, the trend of b's matched count (on SimE)
    and the evidence that separates the pair."""
    rows = []
    conditions = [(d, k, s) for d in grid.dims for k in grid.kappas for s in grid.noises]
    for d, kappa, noise in tqdm(conditions, desc="resolution", disable=not progress, leave=False):
        task = _task(d, kappa, noise)
        p = sample_prompts(task, grid.prompts, generator=generator_for(grid.seed))
        q = sample_prompts(
            TaskConfig(**{**task.__dict__, "n_points": 4 * d}), grid.prompts, generator=generator_for(grid.seed, 1)
        ).xs  # fresh queries for SimW, from the prompts' own input distribution
        xs, ys, queries = p.xs.to(device), p.ys.to(device), q.to(device)
        results = {name: run_learner(name, xs, ys, queries, **LEARNER_GRIDS[name][1]) for name in LEARNER_GRIDS}
        for a_name, b_name in PAIRS:
            a, b = results[a_name], results[b_name]
            axis_a, grid_a = LEARNER_GRIDS[a_name]
            axis_b, grid_b = LEARNER_GRIDS[b_name]
            ks_a = grid_a.get(axis_a, [0]) if axis_a else [0]
            ks_b = grid_b.get(axis_b, [0]) if axis_b else [0]
            block = []
            for metric in METRICS if noise > 0 else [m for m in METRICS if m != "sime_t_ge_d"]:
                means = _similarities(metric, a, b, ys, queries, d).double().mean(-1).cpu()  # (K_a, K_b)
                ceiling, matched = means.max(-1)
                res = (1 - ceiling).numpy()
                use = [i for i, k in enumerate(ks_a) if k >= 1] or [0]
                worst = min(use, key=lambda i: res[i])
                block.append(
                    {
                        "d": d,
                        "kappa": kappa,
                        "noise": noise,
                        "a": a_name,
                        "b": b_name,
                        "metric": metric,
                        "resolution_min": float(res[use].min()),
                        "resolution_max": float(res[use].max()),
                        "resolution_last": float(res[-1]),
                        "k_a_at_min": ks_a[worst],
                        "matched_k_b": [ks_b[int(i)] for i in matched],
                    }
                )
            trend = _trend(ks_a, block[0]["matched_k_b"]) if axis_a and axis_b else TrendShape("no grid")
            best = max(block, key=lambda r: r["resolution_max"])
            evidence = f"{best['metric']} (resolution up to {best['resolution_max']:.3f})"
            if trend.shape == "exponential":
                evidence += f"; the trend: {b_name}'s matched count grows x{trend.rate:.2f} per iteration"
            for row in block:
                rows.append(
                    {
                        **row,
                        "matched_k_b": " ".join(map(str, row["matched_k_b"])),
                        "trend": "no grid" if trend.shape == "no grid" else trend.words,
                        "trend_shape": trend.shape,
                        "trend_rate": trend.rate,
                        "evidence": evidence,
                    }
                )
    return pd.DataFrame(rows)


def pair_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per learner pair over all conditions: each metric's resolution range (the smallest minimum and
    the largest maximum over a's grid), and how often b's matched count grows exponentially."""
    rows = []
    for (a, b), part in table.groupby(["a", "b"], sort=False):
        row: dict = {"a": a, "b": b}
        for metric, m in part.groupby("metric", sort=False):
            row[f"{metric}_resolution"] = f"{m.resolution_min.min():.4f}-{m.resolution_max.max():.4f}"
        trends = part.drop_duplicates(["d", "kappa", "noise"])
        growing = trends[trends.trend_shape == "exponential"]
        if len(growing):
            factors = growing.trend_rate.astype(float)
            row["trend"] = (
                f"exponential in {len(growing)} of {len(trends)} conditions (x{factors.min():.2f}-x{factors.max():.2f} "
                "per iteration)"
            )
        else:
            row["trend"] = "no grid" if (trends.trend_shape == "no grid").all() else "not exponential"
        rows.append(row)
    return pd.DataFrame(rows)
