"""Attention-pooled probes (Akyurek et al. 2023, §5, eq. 20-22, App. C.8), fitted to a stationary point.

A probe for (layer l, prefix t, target) reads the hidden states h_1..h_P of the first t
examples' tokens (P = 2t), pools them with position weights alpha = softmax(s) and regresses the
target on the pooled features z = sum_p alpha_p h_p:

    linear:  target ~ z W + b
    mlp:     target ~ [z, gelu(z~ A + c)] W + b      (z~: z standardised per feature)

How each is fitted (no step budget decides the answer):

- Head in closed form. For fixed pooling the best head is a ridge regression with an
  unpenalised intercept, W = (Zc^T Zc + lam I)^-1 Zc^T Yc (Zc, Yc centred over prompts), the
  penalty lam chosen from `alphas` (fractions of the mean eigenvalue of Zc^T Zc) by the exact
  leave-one-out error of ridge (e_i / (1 - H_ii), as scikit-learn's RidgeCV).
- Pooling by variable projection (Golub & Pereyra 1973). With W eliminated, the training ridge
  objective f(s) = (|Yc - Zc W|^2 + lam |W|^2) / (N d) is a smooth function of the P scores
  alone, whose gradient is the partial gradient at the optimal head (envelope theorem); the states
  are centred over prompts once, so pooling them gives Zc directly (`ProbeSet`). Batched
  L-BFGS with strong-Wolfe steps (probe/analysis/lbfgs.py) runs on it from uniform pooling for
  NEWTON_AFTER iterations, then the probes still running take modified Newton steps on the exact
  Hessian (`ProbeSet.hessian`, P x P): at the optimum a quarter of a long prefix's positions get
  alpha ~ 0, scores drifting to -inf, where L-BFGS needed up to ~190 iterations and Newton ~20.
  Only where that Hessian is cheap (`newton_pays`); elsewhere L-BFGS throughout. A
  first round at the leave-one-out penalty of uniform pooling, capped at FIRST_ROUND_PENALTY
  (where capped, to a loose tolerance: a heavy penalty flattens f and can hold the pooling in a
  poor basin), then rounds at the penalty leave-one-out chooses at the current pooling (moving
  only for a gain above MIN_GAIN in R^2), until that choice stops changing (at most MAX_ROUNDS
  rounds in all). Converged: |grad_s f|_inf <= gtol or a relative decrease <= ftol (scipy's
  L-BFGS-B tests) in the last round, with the penalty no longer changing.
- The MLP probe is a two-layer GELU network whose hidden layer (width `hidden`) is drawn at random
  with the probe's seed and kept fixed (random features, Rahimi & Recht 2007), beside a linear
  skip; it pools with the linear probe's weights or uniformly (`fit_probe_head`) and its output
  layer is the same closed-form ridge, the hidden block's weight in it chosen by leave-one-out
  (`fit_head`). So it is convex given the pooling and its leave-one-out R^2 is never below the
  linear probe's by more than MIN_GAIN. This departs from the paper's end-to-end trained MLP: trained full-batch (L-BFGS, weight decay, the output
  layer eliminated as above), that network did not reach a stationary point within 500
  iterations on the default checkpoint (32% of 72 probes, 224 s) and overfitted.

Targets: the moment vector X^T y and the least-squares weights w_OLS of the prefix, each
coordinate standardised with the training prompts' mean and standard deviation per (prefix,
coordinate); R^2 is scikit-learn's r2_score (uniform average over coordinates). Every (layer,
prefix, target) probe of a grid is fitted at once: arrays carry a leading probe axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, validate_data
from torch import Tensor

from ..core import budget
from ..core.errors import ConfigError
from ..learners import prefix_moments
from ..learners.closed_form import least_squares_weights
from .pooling import PoolingFit, ProbeSet, fit_pooling
from .probe_heads import Chosen, Head, HeadFit, fit_head, fit_probe_head, random_layer, train_mlp_heads
from .ridge import ridge_penalties
from .stats import percentile_interval, r2_resamples, r2_score

# the heads' names, and the pooling's and ridge's, kept importable from here (the probes' one entry point)
__all__ = [
    "ALPHAS",
    "R2_DRAWS",
    "AttentionPoolProbe",
    "FittedProbes",
    "Head",
    "HeadFit",
    "ProbeSet",
    "fit_head",
    "fit_probe_grid",
    "fit_probe_grids",
    "fit_probes",
    "probe_dtype",
    "probe_targets",
    "random_layer",
    "ridge_penalties",
    "train_mlp_heads",
    "without_r2_draws",
]

ALPHAS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # ridge penalties, fractions of the mean eigenvalue
# a probe's defaults, written once: the MLP probes' width, and the pooling fit's L-BFGS limits
HIDDEN, MAX_ITER, GTOL, FTOL = 128, 500, 1e-6, 2.2e-9


def probe_targets(xs: Tensor, ys: Tensor, name: str) -> Tensor:
    """(B, n, k): the target after each prefix t (t examples seen): 'xty' X_t^T y_t and 'w_ols' the
    least-squares weights (k = d), 'xtx' the d (d + 1) / 2 entries of S_t / t = X_t^T X_t / t on and
    above the diagonal (the state Newton-type learners keep; Fu et al. 2024, eq. 5: M_0 = alpha S)."""
    xs, ys = xs.double(), ys.double()
    if name == "xty":
        return prefix_moments(xs, ys)[1]
    if name == "w_ols":
        return least_squares_weights(xs, ys)
    if name == "xtx":
        s = prefix_moments(xs, ys)[0]
        rows, cols = torch.triu_indices(xs.shape[-1], xs.shape[-1], device=xs.device)
        seen = torch.arange(xs.shape[1], device=xs.device, dtype=xs.dtype).clamp_min(1).view(1, -1, 1)
        return s[..., rows, cols] / seen
    raise ValueError(f"unknown probe target {name!r} (xty, w_ols, xtx)")


# ---------------------------------------------------------------- the grid of a report


def fit_probes(
    train_states: Tensor,
    train_targets: dict[str, Tensor],
    test_states: Tensor,
    test_targets: dict[str, Tensor],
    combos: Sequence[tuple[int, str]],
    kinds: str | Sequence[str] = ("linear", "mlp"),
    **options: Any,
) -> pd.DataFrame:
    """Fit a probe for every layer x (prefix, target) x kind at once; score on held-out prompts:
    `fit_probe_grid(...).score(test_states, test_targets)` (options: those of fit_probe_grid).

    Returns one row per probe: layer, prefix, target, kind, r2 (test) with r2_low, r2_high and
    R2_DRAWS (`_probe_rows`; `without_r2_draws` drops the last), nmse, loo_r2 (training,
    leave-one-out), penalty (the head's ridge penalty, absolute), hidden, iterations, grad_norm,
    converged (of the pooling, which the MLP probe shares), y_mass (attention on y tokens),
    last_example_mass, peak_position.
    """
    return fit_probe_grid(train_states, train_targets, combos, kinds, **options).score(test_states, test_targets)


@dataclass
class FittedProbes:
    """A grid of probes fitted on training prompts (`fit_probe_grid`), holding no states: score it
    on held-out prompts with `score`, after the training states are freed. Probes are layer-major:
    probe g reads layer g // len(combos) for combo g % len(combos)."""

    probes: ProbeSet  # layer and positions of every probe (its states dropped)
    fit: PoolingFit
    heads: list[tuple[str, Head, Tensor, Tensor, Tensor, HeadFit | None]]  # (kind, head, penalty, loo MSE, alpha, fit)
    y_train: Tensor  # (G, N, d) standardised training targets
    target_stats: dict[str, tuple[Tensor, Tensor]]  # the training targets' mean and std per name
    combos: list[tuple[int, str]]
    hidden: int
    layout: str
    dtype: torch.dtype
    device: str

    def score(
        self, test_states: Tensor, test_targets: dict[str, Tensor], n_boot: int = 1000, seed: int = 0
    ) -> pd.DataFrame:
        """The table of `fit_probes` on the held-out states and targets (R^2 intervals over
        `n_boot` resamples of the test prompts, `_probe_rows`)."""
        test_states = _by_position(test_states, self.layout, self.dtype).to(self.device)
        n_layers = test_states.shape[0]
        y_test = _stack_targets(self.target_stats, test_targets, self.combos).repeat(n_layers, 1, 1).to(self.device)
        every = torch.arange(len(self.probes.layer), device=self.device)
        frames = []
        for kind, head, penalty, loo, alpha, head_fit in self.heads:
            pred = head.predict(self.probes.pool(alpha, every, test_states)) + self.y_train.mean(1, keepdim=True)
            on_cpu = (pred.cpu(), y_test.cpu(), loo.cpu(), penalty.cpu(), self.y_train.cpu())
            fits = (
                self.fit.to("cpu"),
                None if head_fit is None else HeadFit(*(v.cpu() for v in vars(head_fit).values())),
            )
            frames.append(_probe_rows(kind, on_cpu, fits, alpha.cpu(), self.combos, self.hidden, n_boot, seed))
        return pd.concat(frames, ignore_index=True)

    def take(self, first: int, combos: list[tuple[int, str]], names: dict[str, str]) -> FittedProbes:
        """The grid of the combos first..first + len(combos) - 1 of every layer, as `combos`, their
        targets renamed by `names` (a grid's name -> the new grid's)."""
        width, n_layers = len(self.combos), len(self.probes.layer) // len(self.combos)
        rows = (torch.arange(n_layers).view(-1, 1) * width + first + torch.arange(len(combos))).flatten()
        rows = rows.to(self.probes.layer.device)
        heads = [
            (kind, head.rows(rows), penalty[rows], loo[rows], alpha[rows], None if fit is None else fit.take(rows))
            for kind, head, penalty, loo, alpha, fit in self.heads
        ]
        stats = {names[k]: v for k, v in self.target_stats.items() if k in names}
        return dataclasses.replace(
            self, probes=self.probes.take(rows), fit=self.fit.take(rows), heads=heads, y_train=self.y_train[rows],
            target_stats=stats, combos=list(combos),
        )  # fmt: skip


def fit_probe_grid(
    train_states: Tensor,
    train_targets: dict[str, Tensor],
    combos: Sequence[tuple[int, str]],
    kinds: str | Sequence[str] = ("linear", "mlp"),
    *,
    alphas: Sequence[float] = ALPHAS,
    hidden: int = HIDDEN,
    max_iter: int = MAX_ITER,
    gtol: float = GTOL,
    ftol: float = FTOL,
    pooling: str = "learned",
    seed: int = 0,
    device: str = "cpu",
    layout: str = "lnpd",
    precision: str = "float64",
    mlp_head: str = "trained",
    overwrite_states: bool = False,
) -> FittedProbes:
    """Fit a probe for every layer x (prefix, target) x kind at once on the training prompts.

    states (L+1, N, 2n, D) at all token positions, or (L+1, 2n, N, D) with layout "lpnd" (used in
    place, no copy: `by_position_streams`); targets name -> (N, n, d); combos [(t, target)].
    All training prompts fit the probes (penalties by leave-one-out). `precision` is the dtype of
    the states (pooling products); the heads and the objective are float64. `mlp_head`: "trained"
    (the MLP probes' hidden layer trained, `train_mlp_heads`) or "random" (random features only).
    `overwrite_states`: the fit may centre `train_states` in place (`ProbeSet`) instead of a copy;
    they are then no longer the caller's states.
    """
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    _check_grid_options(kinds, layout, pooling, mlp_head)
    if "mlp" in kinds:
        n_probes, n_prompts = train_states.shape[0] * len(combos), train_states.shape[1 if layout == "lnpd" else 2]
        budget.check([budget.mlp_probe_estimate("hidden", hidden, n_probes, n_prompts, train_states.shape[-1])])
    dtype = probe_dtype(precision)
    probes, y_train, stats = _grid_probes(train_states, train_targets, combos, layout, dtype, device, overwrite_states)
    del train_states
    fit = fit_pooling(probes, alphas, pooling == "learned", gtol, ftol, max_iter)
    heads: list[tuple[str, Head, Tensor, Tensor, Tensor, HeadFit | None]] = []
    linear: Chosen | None = None  # the linear head's penalty and error, which the MLP head on that pooling reuses
    for kind in kinds:
        head, penalty, loo, alpha = fit_probe_head(
            kind, probes, fit.scores, alphas, hidden, seed, linear, (fit.uniform_penalty, fit.uniform_loo)
        )
        head_fit = None
        if kind == "mlp" and mlp_head == "trained":
            trained = train_mlp_heads(
                probes, alpha, head, penalty, loo, alphas, seed, gtol=gtol, ftol=ftol, max_iter=max_iter
            )
            head, loo, head_fit = trained
        heads.append((kind, head, penalty, loo, alpha, head_fit))
        linear = (penalty, loo) if kind == "linear" else linear
    without_states = dataclasses.replace(probes, states=probes.states.new_empty(0, 0, 0, 0))
    return FittedProbes(without_states, fit, heads, y_train, stats, list(combos), hidden, layout, dtype, device)


def _grid_probes(
    states: Tensor, targets: dict[str, Tensor], combos, layout: str, dtype: torch.dtype, device: str, overwrite: bool
) -> tuple[ProbeSet, Tensor, dict[str, tuple[Tensor, Tensor]]]:
    """The grid's probe set (every layer x combo, layer-major) on `states` in the by-position layout,
    centred in place where `overwrite` or where the layout, dtype or device made a copy anyway; with
    the standardised training targets (G, N, d) and their statistics."""
    by_position = _by_position(states, layout, dtype).to(device)
    overwrite |= by_position.data_ptr() != states.data_ptr()  # a copy already: this call's own
    n_layers, _, n_train, _ = by_position.shape
    if n_train < 3:
        raise ConfigError(f"probes need at least 3 training prompts (leave-one-out), got {n_train}")
    stats = _target_stats(targets)
    y_train = _stack_targets(stats, targets, combos).repeat(n_layers, 1, 1).to(device)
    layer = torch.arange(n_layers, device=device).repeat_interleave(len(combos))
    n_used = torch.tensor([2 * t for t, _ in combos], device=device).repeat(n_layers)
    make = ProbeSet.centred_in_place if overwrite else ProbeSet
    return make(by_position, layer, n_used, y_train - y_train.mean(1, keepdim=True)), y_train, stats


def fit_probe_grids(
    train_states: Tensor,
    target_sets: dict[str, dict[str, Tensor]],
    combos: Sequence[tuple[int, str]],
    kinds: str | Sequence[str] = ("linear", "mlp"),
    **options: Any,
) -> dict[str, FittedProbes]:
    """`fit_probe_grid` for several sets of training targets on the same states (a model's own
    targets and its shuffled-target control) as one grid, so that every read of the states serves
    every set's probes: set name -> its grid, as `fit_probe_grid` fits it alone (each probe's fit,
    penalty rounds and head are its own; numbers equal to the round-off of the batched products)."""
    merged = {f"{i}:{name}": v for i, targets in enumerate(target_sets.values()) for name, v in targets.items()}
    every = [(t, f"{i}:{name}") for i in range(len(target_sets)) for t, name in combos]
    grid = fit_probe_grid(train_states, merged, every, kinds, **options)
    return {
        label: grid.take(i * len(combos), list(combos), {f"{i}:{name}": name for name in targets})
        for i, (label, targets) in enumerate(target_sets.items())
    }


def _check_grid_options(kinds: tuple[str, ...], layout: str, pooling: str, mlp_head: str) -> None:
    """Refuse a probe kind, states layout, pooling or MLP head `fit_probe_grid` does not know."""
    for kind in kinds:
        if kind not in ("linear", "mlp"):
            raise ConfigError(f"unknown probe kind {kind!r} (linear, mlp)")
    if layout not in ("lnpd", "lpnd"):
        raise ConfigError(f"states layout must be 'lnpd' or 'lpnd', got {layout!r}")
    if pooling not in ("learned", "uniform"):
        raise ConfigError(f"probe pooling must be 'learned' or 'uniform', got {pooling!r}")
    if mlp_head not in MLP_HEADS:
        raise ConfigError(f"probes.mlp_head must be one of {', '.join(MLP_HEADS)}, got {mlp_head!r}")


def _by_position(states: Tensor, layout: str, dtype: torch.dtype) -> Tensor:
    """States in the (L+1, 2n, N, D) layout and `dtype` (a copy only where either differs)."""
    if layout == "lnpd":
        return states.to(dtype).transpose(1, 2).contiguous()
    return states.to(dtype)


def _target_stats(train_targets: dict[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """Each target's training mean and standard deviation per (prefix, coordinate)."""
    return {
        k: (v.mean(0, keepdim=True), v.std(0, keepdim=True).nan_to_num(1.0).clamp_min(1e-8))
        for k, v in train_targets.items()
    }


def _stack_targets(stats: dict[str, tuple[Tensor, Tensor]], targets: dict[str, Tensor], combos) -> Tensor:
    """(M, N, d): the combos' targets, each standardised with the training statistics `stats`."""
    norm = lambda k, v: ((v - stats[k][0]) / stats[k][1]).double()
    return torch.stack([norm(tg, targets[tg])[:, t] for t, tg in combos])


def probe_dtype(precision: str) -> torch.dtype:
    """The states' dtype of a probe precision name."""
    if precision not in PRECISIONS:
        raise ConfigError(f"probe precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


R2_DRAWS = "r2_draws"  # the probe table's column of per-resample test R^2 (one array per row)


def without_r2_draws(table: pd.DataFrame) -> pd.DataFrame:
    """The probe table without its per-resample column (what CSVs and caches keep)."""
    return table.drop(columns=[R2_DRAWS], errors="ignore")


def _probe_rows(
    kind, arrays, fits: tuple[PoolingFit, HeadFit | None], alpha, combos, hidden, n_boot: int, seed: int
) -> pd.DataFrame:
    """The table of fit_probes for one kind, from the flat probe axis G = layers x combos; arrays:
    (test predictions, test truth, leave-one-out MSE, penalty, training targets); fits: the
    pooling's and (trained MLP heads) the heads' (`converged`: both, where the head is trained). R2_DRAWS: the
    test R^2 on each of `n_boot` resamples of the test prompts (the same resamples for every probe,
    so probes are paired), with its 90% interval r2_low, r2_high."""
    pred, truth, loo, penalty, y_train = arrays
    fit, head_fit = fits
    trained = [False] * len(pred) if head_fit is None else head_fit.trained.tolist()
    head_converged = trained if head_fit is None else head_fit.converged.tolist()
    r2 = r2_score(truth, pred).mean(-1)  # (G,): sklearn's multioutput="uniform_average"
    draws = r2_resamples(truth, pred, n_boot, seed).mean(-1)  # (n_boot, G)
    r2_lo, r2_hi = percentile_interval(draws)
    nmse = ((pred - truth) ** 2).mean((1, 2)) / truth.var(dim=(1, 2)).clamp_min(1e-12)
    loo_r2 = 1 - loo / y_train.var(dim=1, unbiased=False).mean(-1).clamp_min(1e-300)
    is_y = (torch.arange(alpha.shape[1]) % 2 == 1).double()
    rows = []
    for g in range(len(r2)):
        layer, (t, target) = divmod(g, len(combos))[0], combos[g % len(combos)]
        a = alpha[g]
        rows.append(
            {
                "layer": layer,
                "prefix": t,
                "target": target,
                "kind": kind,
                "r2": float(r2[g]),
                "r2_low": float(r2_lo[g]),
                "r2_high": float(r2_hi[g]),
                R2_DRAWS: draws[:, g].numpy(),
                "nmse": float(nmse[g]),
                "loo_r2": float(loo_r2[g]),
                "penalty": float(penalty[g]),
                "hidden": hidden if kind == "mlp" else 0,
                "iterations": int(fit.iterations[g]),
                "grad_norm": float(fit.grad_norm[g]),
                "converged": bool(fit.converged[g]) and (not trained[g] or head_converged[g]),
                "head": "linear" if kind == "linear" else "trained" if trained[g] else "random",
                "head_iterations": 0 if head_fit is None else int(head_fit.iterations[g]),
                "head_grad_norm": 0.0 if head_fit is None else float(head_fit.grad_norm[g]),
                "y_mass": float((a * is_y).sum()),
                "last_example_mass": float(a[2 * t - 2 : 2 * t].sum()),
                "peak_position": int(a.argmax()),
            }
        )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the estimator a user is shown


class AttentionPoolProbe(RegressorMixin, BaseEstimator):
    """One attention-pooled probe (Akyurek et al. 2023, eq. 20-22) as a scikit-learn estimator: fit(H (N, P, D), Y (N, d)).

    The engine the reports run (module docstring): Y standardised with its mean and standard
    deviation; pooling by variable projection with L-BFGS from uniform weights until
    |grad|_inf <= gtol or a relative decrease <= ftol (at most `max_iter` iterations per round);
    the head a ridge regression whose penalty (`alphas`, fractions of the mean eigenvalue) is
    chosen by leave-one-out; kind "mlp" adds a random GELU layer of width `hidden` (seeded by
    `random_state`) beside the linear features. `pooling="uniform"` keeps alpha_p = 1/P (the head
    is then scikit-learn's Ridge(alpha_) on H.mean(1), tested). With a report's [probes] settings
    and one (layer, prefix t, target), H being that layer's stream at the first 2t tokens, it
    reproduces the report's probe (tested). get_params / set_params / clone, score (R^2 averaged
    over targets), NotFittedError before fit, n_features_in_ = D. Fitted: attention_ (P,),
    coef_ (D, d) and intercept_ (d,) of the linear map from pooled features to standardised Y,
    alpha_ (absolute penalty), loo_r2_, grad_norm_, converged_; n_iter_, the iterations of the fit:
    the pooling's L-BFGS iterations (`pooling_n_iter_`: 0 where uniform pooling is already optimal, as
    with one position) plus one for the head's closed-form ridge solve, so at least 1.
    """

    def __init__(
        self,
        kind: str = "linear",
        alphas: tuple[float, ...] = ALPHAS,
        hidden: int = HIDDEN,
        max_iter: int = MAX_ITER,
        gtol: float = GTOL,
        ftol: float = FTOL,
        pooling: str = "learned",
        random_state: int = 0,
        mlp_head: str = "trained",
    ):
        self.kind, self.alphas, self.hidden, self.max_iter = kind, alphas, hidden, max_iter
        self.gtol, self.ftol, self.pooling, self.random_state = gtol, ftol, pooling, random_state
        self.mlp_head = mlp_head

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # Y may be (N, d)
        return tags

    def _as_states(self, H, reset: bool) -> torch.Tensor:
        """H (N, P, D) as a float64 tensor; a 2-D H (N, D) is one position per prompt (so that
        scikit-learn's generic checks, which make 2-D data, apply)."""
        if (H.ndim if isinstance(H, (np.ndarray, torch.Tensor)) else np.asarray(H).ndim) != 3:
            return torch.from_numpy(np.array(validate_data(self, H, dtype=np.float64, reset=reset))[:, None, :])
        h = np.asarray(H, dtype=np.float64)
        if 0 in h.shape:
            raise ValueError(f"AttentionPoolProbe expects H of shape (N, P, D) with N, P, D >= 1, got {h.shape}")
        if not np.isfinite(h).all():
            raise ValueError("AttentionPoolProbe: H contains NaN or infinity")
        if reset:
            self.n_features_in_ = h.shape[2]
        return torch.from_numpy(np.array(h))

    def fit(self, H, Y) -> AttentionPoolProbe:
        if Y is None:
            raise ValueError("AttentionPoolProbe requires y to be passed, but the target y is None")
        h = self._as_states(H, reset=True)
        y = check_array(Y, dtype=np.float64, ensure_2d=False, input_name="Y")
        self.single_target_ = y.ndim == 1
        y = y[:, None] if y.ndim == 1 else y
        if y.ndim != 2 or len(y) != len(h):
            raise ValueError(f"AttentionPoolProbe.fit expects Y (N, d) with N = {len(h)}, got shape {y.shape}")
        if self.kind not in ("linear", "mlp"):
            raise ValueError(f"AttentionPoolProbe kind must be 'linear' or 'mlp', got {self.kind!r}")
        if self.pooling not in ("learned", "uniform"):
            raise ValueError(f"AttentionPoolProbe pooling must be 'learned' or 'uniform', got {self.pooling!r}")
        if self.mlp_head not in MLP_HEADS:
            raise ValueError(f"AttentionPoolProbe mlp_head must be 'trained' or 'random', got {self.mlp_head!r}")
        if len(h) < 3:
            raise ValueError(f"AttentionPoolProbe needs 3 samples or more (leave-one-out), got {len(h)} sample")
        self.n_positions_ = h.shape[1]
        targets = torch.from_numpy(y)
        self.mean_, self.std_ = targets.mean(0), targets.std(0).nan_to_num(1.0).clamp_min(1e-8)
        y_std = ((targets - self.mean_) / self.std_)[None]  # (1, N, d): one probe
        probes = ProbeSet(
            h.transpose(0, 1)[None], torch.zeros(1, dtype=torch.long), torch.tensor([h.shape[1]]), y_std - y_std.mean(1)
        )
        fit = fit_pooling(probes, self.alphas, self.pooling == "learned", self.gtol, self.ftol, self.max_iter)
        self.head_, penalty, loo, alpha = fit_probe_head(
            self.kind, probes, fit.scores, self.alphas, self.hidden, self.random_state
        )
        self.head_trained_ = False
        if self.kind == "mlp" and self.mlp_head == "trained":
            self.head_, loo, head_fit = train_mlp_heads(
                probes,
                alpha,
                self.head_,
                penalty,
                loo,
                self.alphas,
                self.random_state,
                gtol=self.gtol,
                ftol=self.ftol,
                max_iter=self.max_iter,
            )
            self.head_trained_ = bool(head_fit.trained[0])
        self.head_.target_mean = self.head_.target_mean + y_std.mean(1, keepdim=True)
        self.attention_ = alpha[0].numpy()
        self.loo_r2_ = float(1 - loo[0] / y_std.var(dim=1, unbiased=False).mean())
        self.alpha_ = float(penalty[0])
        # one iteration of the fit: an L-BFGS iteration of the pooling, or the head's solve (always one)
        self.pooling_n_iter_ = int(fit.iterations[0])
        self.n_iter_ = self.pooling_n_iter_ + 1
        self.grad_norm_, self.converged_ = float(fit.grad_norm[0]), bool(fit.converged[0])
        return self

    def _pooled(self, H) -> torch.Tensor:
        check_is_fitted(self)
        h = self._as_states(H, reset=False)
        if h.shape[1:] != (self.n_positions_, self.n_features_in_):
            raise ValueError(
                f"H has {tuple(h.shape[1:])} (positions, width) but the probe was fitted on "
                f"{(self.n_positions_, self.n_features_in_)}"
            )
        return torch.einsum("p,npd->nd", torch.from_numpy(self.attention_), h)[None]

    def predict(self, H) -> np.ndarray:
        check_is_fitted(self)
        out = self.head_.predict(self._pooled(H))[0]
        pred = (out * self.std_ + self.mean_).numpy()
        return pred[:, 0] if self.single_target_ else pred

    @property
    def coef_(self) -> np.ndarray:
        """(D, d): pooled features -> standardised targets (linear probes)."""
        check_is_fitted(self, "head_")
        if self.kind != "linear":
            raise AttributeError("coef_ is defined for linear probes only")
        return self.head_.weight[0].numpy()

    @property
    def intercept_(self) -> np.ndarray:
        check_is_fitted(self, "head_")
        return (self.head_.target_mean - self.head_.feature_mean @ self.head_.weight)[0, 0].numpy()


PRECISIONS = {"float64": torch.float64, "float32": torch.float32}
# the MLP probe's hidden layer: trained (probe/analysis/mlp_head.py) or random features
MLP_HEADS = ("trained", "random")
