"""Which learner a model tracks off its training distribution (issue 64 item 2).

Learners that match a model equally well in distribution can part ways under a shift: GD with a
fixed step diverges on inputs scaled up where GD whose step adapts to S (eta = 1 / lambda_max)
does not; Newton started at a fixed scale alpha (as a planted model computes it) against the
spectral rule. So:

1. **Match in distribution.** On unshifted prompts of the checkpoint's task, every member of each
   candidate family (CANDIDATES: its hyper-parameter grid) is compared with the model's own
   prediction at every prefix t >= 1; the member with the least mean squared distance / d is that
   family's match (its fixed step, alpha rule or penalty, and its step count). A fixed step or
   alpha is then refined around the grid's best (2% apart).
2. **Follow off distribution.** On the shifted prompts (probe/data/shifts.py), each matched member
   is asked the shift's queries beside the model. A prediction *diverges* when it is not finite or
   exceeds DIVERGED times the labels' root mean square; a prompt diverges when any of its positions
   does. Per family: the share of prompts on which it and the model disagree about diverging
   (`mismatch`), the mean squared distance / d to the model over the prompts on which neither
   diverges, and its own error / d, with 90% intervals over resamples of the prompts (paired across
   families). The model *tracks* the family with the least mismatch, then the least distance (a
   learner that diverges where the model does not, or the reverse, is further than any finite
   distance); the paired difference to the runner-up, in whichever of the two decided, says
   whether the two can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.plotting import pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.settings import SweepSettings
from ..core.stages import AnalysisStage, register_stage
from ..core.validate import check_model, positive_int
from ..data.config import TaskConfig
from ..data.metrics import error_per_dim
from ..data.shifts import parse_shift
from ..data.tasks import sample_prompts
from ..learners import run_learner
from ..learners.iterative import NEWTON_ITERATIONS
from ..models.sizes import shape_of
from .evaluate import Prompts, predict, shifted_predictions
from .stats import percentile_interval, resamples

# GD steps on L = |y - X w|^2 / (2t) (paper convention), 8% apart; Newton's M_0 = a S / t
FIXED_ETAS = tuple(float(v) for v in np.geomspace(0.02, 0.5, 21))
FIXED_ALPHAS = tuple(float(v) for v in np.geomspace(1e-3, 1.0, 31))  # planted Newton at d = 4: 0.0031
STEPS = tuple(range(17)) + tuple(2**k for k in range(5, 13))  # every count to 16, then 32 .. 4096
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "gd_fixed_step": ("gd", {"eta": FIXED_ETAS, "steps": STEPS}),
    "gd_adaptive_step": ("gd", {"eta": ("auto",), "steps": STEPS}),
    "newton_fixed_alpha": ("newton", {"alpha": FIXED_ALPHAS, "iterations": NEWTON_ITERATIONS}),
    "newton_spectral_alpha": ("newton", {"alpha": ("spectral",), "iterations": NEWTON_ITERATIONS}),
    "ridge": ("ridge", {"lam": (1e-3, 1e-2, 1e-1, 1.0, 10.0)}),
    "least_squares": ("least_squares", {}),
}
# the hypothesis each family stands for, and the pairs of hypotheses compared (best member of each side)
SIDES = {
    "gd_fixed_step": "gd",
    "gd_adaptive_step": "gd",
    "newton_fixed_alpha": "newton",
    "newton_spectral_alpha": "newton",
    "ridge": "ridge",
    "least_squares": "least_squares",
}
SIDE_PAIRS = (("newton", "gd"), ("ridge", "least_squares"))
LEVEL = 0.90
MATCH_PROMPTS = 256  # unshifted prompts on which each family's member is matched to the model
REFINE = 3  # rounds of refinement of a fixed step or alpha (matched_members), each 10x finer
NEAR = np.geomspace(0.8, 1.25, 23)  # the first round's factors, 2% apart
DIVERGED = 1e3  # a prediction beyond this many times the labels' root mean square has diverged
CLOSE = 0.1  # the closest family's distance over the model's mean squared prediction, above which none is close


@dataclass
class Comparison:
    """Two families under one shift: which is closer to the model, by the `criterion` that ranks
    them (mismatch in diverging first, then distance), the runner-up's excess in it with its paired
    90% interval (`separable`: the interval excludes 0)."""

    closer: str
    other: str
    criterion: str
    difference: float
    low: float
    high: float

    @property
    def separable(self) -> bool:
        return self.low > 0


@dataclass
class PerPrompt:
    """Per prompt and family (P, F): whether it and the model disagree about diverging, its squared
    distance / d to the model, and whether neither diverged (where the distance counts)."""

    families: list[str]
    mismatch: Tensor
    distance: Tensor
    both: Tensor
    n_boot: int
    seed: int
    preds: dict[str, Tensor]  # (P, t) each family's predictions, for the gap between two of them
    n_dims: int

    def gap(self, a: str, b: str) -> float:
        """Mean squared distance / d between families a and b, over the prompts where neither they
        nor the model diverged: how far apart the two hypotheses are under the shift."""
        i, j = self.families.index(a), self.families.index(b)
        common = self.both[:, [i]] * self.both[:, [j]]
        sq = ((torch.nan_to_num(self.preds[a]) - torch.nan_to_num(self.preds[b])) ** 2).mean(1, keepdim=True)
        return float(_masked_mean(sq / self.n_dims, common)[0])

    def key(self, i: int) -> tuple[float, float]:
        """Rank of family i: its mismatch share, then its mean distance (inf where none counts)."""
        return float(self.mismatch[:, i].mean()), _finite_or_inf(
            _masked_mean(self.distance[:, [i]], self.both[:, [i]])[0]
        )

    def compare(self, a: str, b: str) -> Comparison:
        """Family a against family b, paired over the same prompts and resamples."""
        i, j = sorted((self.families.index(a), self.families.index(b)), key=self.key)
        if self.key(i)[0] != self.key(j)[0]:
            per = self.mismatch[:, [j]] - self.mismatch[:, [i]]
            common = torch.ones_like(per)
            criterion = "mismatch"
        else:  # over the prompts on which neither family (nor the model) diverged
            per = self.distance[:, [j]] - self.distance[:, [i]]
            common = self.both[:, [i]] * self.both[:, [j]]
            criterion = "distance"
        n = len(per)
        draws = torch.cat([_masked_mean(per[idx], common[idx]) for idx in resamples(n, self.n_boot, self.seed, 100)])
        lo, hi = percentile_interval(draws, LEVEL, ignore_nan=True)
        point = float(_masked_mean(per, common)[0])
        return Comparison(self.families[i], self.families[j], criterion, point, float(lo[0]), float(hi[0]))


@dataclass
class Tracking:
    """The comparison of one shift: `table` one row per family (member matched in distribution,
    mismatch in diverging, distance to the model off distribution with its interval, the family's
    and the model's error / d); `best`, the family tracked against the runner-up (`Comparison`);
    `curves`, the error / d per number of examples of the model and each family; `per_prompt`, what
    further pairs are compared from (`compare`)."""

    table: pd.DataFrame
    best: Comparison
    curves: pd.DataFrame
    per_prompt: PerPrompt

    @property
    def tracks(self) -> str:
        return self.best.closer

    @property
    def runner_up(self) -> str:
        return self.best.other

    @property
    def separable(self) -> bool:
        return self.best.separable

    def compare(self, a: str, b: str) -> Comparison:
        return self.per_prompt.compare(a, b)


def matched_members(
    model: nn.Module, task: TaskConfig, n_prompts: int = MATCH_PROMPTS, seed: int = 0, device: str = "cpu"
):
    """Per family of CANDIDATES, the grid member closest to the model in distribution: {family:
    (learner, params, distance / d)} from `n_prompts` unshifted prompts (the probe-train stream)."""
    p = sample_prompts(task, n_prompts, generator=stream_generator(seed, Stream.PROBE_TRAIN))
    model_pred = predict(model, Prompts(p.xs, p.ys), device=device).double()[:, 1:]

    def closest(learner: str, grid: dict[str, Any]) -> tuple[dict[str, Any], float]:
        result = run_learner(learner, p.xs, p.ys, **grid)
        dist = error_per_dim(result.preds[:, :, 1:], model_pred, task.n_dims).mean((1, 2))  # (K,)
        best = int(torch.nan_to_num(dist, nan=float("inf")).argmin())
        return result.grid[best], float(dist[best])

    out = {}
    for family, (learner, grid) in CANDIDATES.items():
        member, dist = closest(learner, grid)
        for r in range(REFINE):
            tries = _refinements(family, member, NEAR ** (0.1**r))
            member, dist = min([(member, dist), *(closest(learner, g) for g in tries)], key=lambda pair: pair[1])
        out[family] = (learner, {k: (v,) for k, v in member.items()}, dist)
    return out


def _refinements(family: str, member: dict[str, Any], near: np.ndarray) -> list[dict[str, Any]]:
    """Grids around a matched fixed step or alpha. In distribution a small fixed GD step is set by
    eta x steps, so every step count is searched at that product (eta within 25% of it), so that the
    count is found too; Newton's alpha likewise at alpha x 2^k, at every iteration count k. `near`:
    the factors around the product."""
    if family == "gd_fixed_step":
        total = member["eta"] * member["steps"]
        if total == 0:  # zero steps: every step size predicts 0, nothing to refine
            return []
        return [
            {"eta": tuple(float(e) for e in total / s * near if e <= 1), "steps": (s,)}
            for s in STEPS
            if s and total / s * near[0] <= 1
        ]
    if family == "newton_fixed_alpha":  # alpha 2^k is Newton's eta x steps ((1 - alpha lambda^2)^(2^k) per eigenvalue)
        total = member["alpha"] * 2 ** member["iterations"]
        return [{"alpha": tuple(float(a) for a in total / 2**k * near), "iterations": (k,)} for k in NEWTON_ITERATIONS]
    return []


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
    bound = DIVERGED * float(y.pow(2).mean().sqrt())
    model_pred = model_pred.double()[:, use]
    model_off = _diverged(model_pred, bound)  # (P, t)
    families = list(matched)
    preds = {}
    for family in families:
        learner, params, _ = matched[family]
        result = run_learner(learner, p.xs, p.ys, queries, **params)
        assert result.query_preds is not None
        preds[family] = torch.diagonal(result.query_preds[0], dim1=1, dim2=2)[:, use]  # position t's own query
    off = torch.stack([_diverged(preds[f], bound).any(1) for f in families], 1)  # (P, F)
    mismatch = (off != model_off.any(1, keepdim=True)).double()
    both = (~off & ~model_off.any(1, keepdim=True)).double()  # neither diverged on the prompt
    sq = torch.stack(
        [error_per_dim(torch.nan_to_num(preds[f]), torch.nan_to_num(model_pred), d).mean(1) for f in families], 1
    )
    sq = torch.where(both > 0, sq, torch.zeros_like(sq))
    point_mismatch, point = mismatch.mean(0), _masked_mean(sq, both)
    draws = torch.cat([_masked_mean(sq[idx], both[idx]) for idx in resamples(n_prompts, n_boot, seed, 100)])
    lo, hi = percentile_interval(draws, LEVEL, ignore_nan=True)
    per_prompt = PerPrompt(families, mismatch, sq, both, n_boot, seed, preds, d)
    first, second = sorted(range(len(families)), key=per_prompt.key)[:2]
    model_ok = ~model_off.any(1)
    model_error = float(error_per_dim(model_pred[model_ok], y[model_ok], d).mean()) if model_ok.any() else float("nan")
    model_size = float(error_per_dim(model_pred[model_ok], 0.0, d).mean()) if model_ok.any() else float("nan")
    errors = {
        f: _masked_mean(error_per_dim(preds[f], y, d).mean(1).unsqueeze(1), (~off[:, [i]]).double())[0]
        for i, f in enumerate(families)
    }
    table = pd.DataFrame(
        {
            "shift": shift,
            "family": families,
            "learner": [matched[f][0] for f in families],
            "matched": [_member_words(matched[f][1]) for f in families],
            "distance_in_distribution": [matched[f][2] for f in families],
            "mismatch": point_mismatch.numpy(),
            "distance": point.numpy(),
            "distance_low": lo.numpy(),
            "distance_high": hi.numpy(),
            "relative_distance": point.numpy() / model_size if model_size > 0 else float("nan"),
            "diverged": off.double().mean(0).numpy(),
            "model_diverged": float(model_off.any(1).double().mean()),
            "error": [float(errors[f]) for f in families],
            "model_error": model_error,
        }
    )
    curves = _error_curves(shift, {"model": model_pred, **preds}, y, bound, torch.nonzero(use)[:, 0], d)
    return Tracking(table, per_prompt.compare(families[first], families[second]), curves, per_prompt)


def side_comparisons(tracking: Tracking) -> pd.DataFrame:
    """Per pair of SIDE_PAIRS (a, b): the closest family of each side, the paired comparison, and
    the side it favours: where separable and `resolved`, i.e. by distance, the model is nearer the
    closer family than the two families are to each other (its distance below their `gap`: else the
    model's own deviation, not the hypotheses, sets the comparison); by mismatch, the model is close
    to the closer family (relative distance at most CLOSE). The difference is oriented so that > 0 favours a; by distance, `position` is it over
    the squared gap between the two families (1: the model sits at a's side of the line between
    them, -1 at b's, 0 midway; |d_b|^2 - |d_a|^2 = gap^2 + 2 (m - a).(a - b))."""
    pp, rows = tracking.per_prompt, []
    shift = tracking.table["shift"].iloc[0]
    rows_of = tracking.table.set_index("family")
    for a, b in SIDE_PAIRS:
        best = {
            side: min((f for f in pp.families if SIDES[f] == side), key=lambda f: pp.key(pp.families.index(f)))
            for side in (a, b)
        }
        c = tracking.compare(best[a], best[b])
        sign = 1 if c.closer == best[a] else -1
        lo, hi = sorted((sign * c.low, sign * c.high))
        gap = pp.gap(best[a], best[b])
        near = rows_of.loc[c.closer]
        resolved = near["distance"] < gap if c.criterion == "distance" else near["relative_distance"] <= CLOSE
        rows.append(
            {
                "shift": shift,
                "a": a,
                "b": b,
                "family_a": best[a],
                "family_b": best[b],
                "favours": SIDES[c.closer] if c.separable and resolved else None,
                "criterion": c.criterion,
                "difference": sign * c.difference,
                "ci_low": lo,
                "ci_high": hi,
                "gap": gap,
                "position": sign * c.difference / gap if c.criterion == "distance" and gap > 0 else float("nan"),
                "distance": float(near["distance"]),
                "resolved": bool(resolved),
            }
        )
    return pd.DataFrame(rows)


@dataclass
class ShiftStudy:
    """Every shift of a report's [ood] section: the families' rows (`table`, with `tracks` and the
    comparison with the runner-up per shift), the error curves, and the side comparisons."""

    table: pd.DataFrame
    curves: pd.DataFrame
    sides: pd.DataFrame


def track_shifts(
    model: nn.Module,
    task: TaskConfig,
    shifts: tuple[str, ...],
    n_prompts: int = 512,
    seed: int = 0,
    device: str = "cpu",
    n_boot: int = 1000,
    progress: bool = False,
) -> ShiftStudy:
    """`track_under_shift` for every shift, the members matched in distribution once."""
    from ..core.progress import tqdm

    matched = matched_members(model, task, seed=seed, device=device)
    tables, curves, sides = [], [], []
    for shift in tqdm(shifts, desc="shifts", disable=not progress, leave=False):
        tr = track_under_shift(model, task, shift, n_prompts, seed, device, n_boot, matched)
        tables.append(
            tr.table.assign(
                tracks=tr.table.family == tr.tracks,
                runner_up=tr.runner_up,
                criterion=tr.best.criterion,
                difference=tr.best.difference,
                ci_low=tr.best.low,
                ci_high=tr.best.high,
                separable=tr.separable,
            )
        )
        curves.append(tr.curves)
        sides.append(side_comparisons(tr))
    return ShiftStudy(
        pd.concat(tables, ignore_index=True), pd.concat(curves, ignore_index=True), pd.concat(sides, ignore_index=True)
    )


def _diverged(pred: Tensor, bound: float) -> Tensor:
    """Predictions that are not finite or beyond `bound` in size (module docstring)."""
    return ~torch.isfinite(pred) | (pred.abs() > bound)


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over dim -2 (prompts) of `values` where `mask` is 1; NaN where no prompt is left."""
    total = mask.sum(-2)
    return torch.where(mask > 0, values, torch.zeros_like(values)).sum(-2) / torch.where(
        total > 0, total, torch.full_like(total, float("nan"))
    )


def _finite_or_inf(v: Tensor) -> float:
    return float(v) if bool(torch.isfinite(v)) else float("inf")


def _error_curves(shift: str, preds: dict[str, Tensor], y: Tensor, bound: float, positions: Tensor, d: int):
    """Per predictor and number of examples t, the error / d over the prompts on which it did not
    diverge at t, and the share on which it did."""
    rows = []
    for who, pred in preds.items():
        off = _diverged(pred, bound)
        err = torch.where(off, torch.zeros_like(pred), torch.nan_to_num(pred) - y) ** 2 / d
        kept = (~off).double().sum(0)
        mean = err.sum(0) / torch.where(kept > 0, kept, torch.full_like(kept, float("nan")))
        for j, t in enumerate(positions.tolist()):
            rows.append((shift, who, t, float(mean[j]), float(off[:, j].double().mean())))
    return pd.DataFrame(rows, columns=["shift", "predictor", "t", "error", "diverged"])


def _member_words(params: dict[str, tuple]) -> str:
    """A matched member's hyper-parameters, e.g. 'eta=0.1112, steps=6' (GD's default convention left out)."""
    shown = {k: v[0] for k, v in params.items() if not (k == "convention" and v[0] == "paper")}
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()) or "-"


def comparison_words(c: Comparison) -> str:
    """'apart from B (paired difference in ...)' or 'not separable from B (...)'."""
    what = "share of prompts diverging differently" if c.criterion == "mismatch" else "distance"
    if c.separable:
        return f"apart from {c.other} (paired difference in {what} {c.difference:.3g}, 90% interval {c.low:.3g} to {c.high:.3g})"
    return f"not separable from {c.other} (paired {what} interval {c.low:.3g} to {c.high:.3g})"


def tracking_words(tracking: Tracking) -> str:
    """One line: which family the model tracks under the shift, and whether the runner-up is apart."""
    rows = tracking.table.set_index("family")
    shift = rows.iloc[0]["shift"]
    first = rows.loc[tracking.tracks]
    verdict = comparison_words(tracking.best)
    relative = first["relative_distance"]
    close = (
        ""
        if relative <= CLOSE
        else f"; but no family is close (relative distance {relative:.2f})"
        if np.isfinite(relative)
        else ""
    )
    diverged = first["model_diverged"]
    model = (
        f"; the model diverges on {diverged:.0%} of prompts, {tracking.tracks} on {first['diverged']:.0%}"
        if diverged > 0
        else ""
    )
    return (
        f"under {shift} the model tracks {tracking.tracks} ({first['matched']}; distance / d "
        f"{first['distance']:.3g}), {verdict}{close}{model}"
    )


# ---------------------------------------------------------------- the report stage (probe/core/stages.py)


OOD_SHIFTS = ("scale_x=2", "scale_x=3", "scale_y=3", "half_subspace", "skewed", "random_quadrants", "noisy")


@dataclass
class OodSettings(Section):
    """Out-of-distribution comparison (this module, issue 64): recipe section [ood]. Runs on
    isotropic linear-regression checkpoints (the shifts' task)."""

    SECTION = "ood"
    enabled: bool = setting(True, "compare the model with its matched learners under distribution shifts in reports")
    shifts: tuple[str, ...] = setting(
        OOD_SHIFTS, "shifts, NAME or NAME=VALUE (icl-probe evaluate --shift)", nonempty=True
    )
    prompts: int = setting(512, "shifted prompts per shift (and unshifted prompts that match the learners)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for shift in self.shifts:
            try:
                parse_shift(shift)
            except ConfigError as err:
                raise ConfigError(f"ood.shifts: {err}") from None


@dataclass
class OodShift:
    """One shift of the out-of-distribution comparison: the family
    the model tracks (its matched member), the runner-up, their paired difference in `criterion`
    (mismatch in diverging, or distance / d) with its 90% interval, and the model's own error / d and
    share of prompts on which it diverged."""

    shift: str
    tracks: str
    matched: str
    distance: float | None
    relative_distance: float | None
    runner_up: str
    criterion: str
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    separable: bool
    model_error: float | None
    model_diverged: float


@dataclass
class OodSide:
    """Two hypotheses (a, b) under one shift: the closest family of each, the paired difference
    oriented so that > 0 favours a, the squared gap between the two families, and the side favoured
    (None: not separable, or not `resolved`: the model no nearer either than they are to each other)."""

    shift: str
    a: str
    b: str
    family_a: str
    family_b: str
    favours: str | None
    criterion: str
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    gap: float | None
    distance: float | None
    resolved: bool


@dataclass
class Ood:
    """Which matched learner the model tracks under each shift of the recipe's [ood] section."""

    shifts: list[OodShift]
    sides: list[OodSide]
    definition: str = (
        "each learner family's member closest to the model in distribution, asked the shifted prompts beside "
        "the model; ranked by the share of prompts on which it and the model disagree about diverging, then "
        "by mean squared distance / d to the model's predictions"
    )


def ood_block(table: pd.DataFrame, sides: pd.DataFrame) -> Ood:
    """The tracked family per shift (rows with `tracks`) and the side comparisons."""
    shifts = [
        OodShift(
            shift=r.shift,
            tracks=r.family,
            matched=r.matched,
            distance=r.distance,
            relative_distance=r.relative_distance,
            runner_up=r.runner_up,
            criterion=r.criterion,
            difference=r.difference,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            separable=bool(r.separable),
            model_error=r.model_error,
            model_diverged=r.model_diverged,
        )
        for r in table[table.tracks.astype(bool)].itertuples()
    ]
    names = [f.name for f in fields(OodSide)]
    rows = sides.astype(object).where(sides.notna(), None)
    return Ood(shifts, [OodSide(**{k: row[k] for k in names}) for row in rows.to_dict("records")])


def _run(c) -> dict[str, pd.DataFrame]:
    """The report stage: which matched learner the model tracks under each [ood] shift."""
    settings, seed = c.recipe.ood, c.recipe.prompts.seed
    study = track_shifts(
        c.ckpt.model,
        c.ckpt.config.task,
        settings.shifts,
        settings.prompts,
        seed,
        c.device,
        c.recipe.similarity.bootstrap,
        c.progress,
    )
    return {"ood": study.table, "ood_curves": study.curves, "ood_sides": study.sides}


def shifts_apply(ckpt) -> bool:
    """Garg et al.'s shifts are defined on isotropic linear regression (probe/data/shifts.py)."""
    task = ckpt.config.task
    return task.name == "linear_regression" and task.covariance == "isotropic"


def _estimates(recipe, ckpt) -> list[budget.Estimate]:
    """The shifted prompts (a forward per t where a shift replaces the queries), the families'
    match in distribution and the paired bootstrap."""
    ood, n = recipe.ood, ckpt.config.task.n_points
    shape = shape_of(ckpt.config.model)
    families = [SweepSettings(f, learner, grid=dict(grid)) for f, (learner, grid) in CANDIDATES.items()]
    return [
        budget.prompt_estimate("ood.prompts", ood.prompts * len(ood.shifts), shape, n, n, ood.prompts),
        *budget.learner_estimates(families, MATCH_PROMPTS, n, shape.d, "ood.match"),
        budget.bootstrap_estimate("similarity.bootstrap", recipe.similarity.bootstrap, ood.prompts, len(families)),
    ]


def _figures(tables: dict[str, pd.DataFrame], fig_dir: Path, recipe) -> dict[str, Path]:
    return {"ood_curves": ood_figure(tables["ood_curves"], fig_dir / "ood_curves")[0]}


def ood_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Error / d against the number of examples under each shift (one panel each): the model (black)
    beside each learner family's member matched in distribution;
    means over the prompts on which the predictor did not diverge."""
    plt = pyplot()
    shifts = list(dict.fromkeys(table["shift"]))
    cols = min(4, len(shifts))
    rows = -(-len(shifts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.8 * rows), squeeze=False, sharex=True)
    for ax, shift in zip(axes.flat, shifts):
        part = table[table["shift"] == shift]
        for i, (who, r) in enumerate(part.groupby("predictor", sort=False)):
            style = {"color": "black", "lw": 2.0, "zorder": 3} if who == "model" else {"color": f"C{i}", "lw": 1.0}
            ax.plot(r.t, r.error.clip(lower=1e-6), label=who, **style)
        ax.set(title=shift, yscale="log")
    for ax in axes.flat[len(shifts) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("examples t")
    for ax in axes[:, 0]:
        ax.set_ylabel("error / d")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_png(fig, stem)


def _findings(block: Ood, titles) -> str | None:
    """Which matched learner the model tracks under each shift, grouped by family."""
    groups: dict[str, list[str]] = {}
    for s in block.shifts:
        groups.setdefault(s.tracks, []).append(s.shift + ("" if s.separable else " (runner-up not apart)"))
    parts = "; ".join(f"{family} under {', '.join(shifts)}" for family, shifts in groups.items())
    diverged = [f"{s.shift} ({s.model_diverged:.0%})" for s in block.shifts if s.model_diverged > 0]
    tail = f" The model diverges under {', '.join(diverged)}." if diverged else ""
    return f"Off the training distribution the model tracks {parts}.{tail}"


def _page_tables(ood: Ood) -> dict[str, pd.DataFrame]:
    """Per shift the family tracked and its runner-up; per shift and question the sides."""
    num = lambda v: "-" if v is None else f"{v:.3g}"
    interval = lambda d, lo, hi: f"{num(d)} [{num(lo)}, {num(hi)}]"
    shifts = pd.DataFrame(
        [
            {
                "shift": s.shift,
                "tracks (matched member)": f"{s.tracks} ({s.matched})",
                "distance / d (relative)": f"{num(s.distance)} ({num(s.relative_distance)})",
                "runner-up": s.runner_up,
                "runner-up's excess": f"{interval(s.difference, s.ci_low, s.ci_high)} in {s.criterion}",
                "separable": "yes" if s.separable else "no",
                "model error / d": num(s.model_error),
                "model diverged": f"{s.model_diverged:.0%}",
            }
            for s in ood.shifts
        ]
    )
    sides = pd.DataFrame(
        [
            {
                "shift": s.shift,
                "a vs b": f"{s.a} ({s.family_a}) vs {s.b} ({s.family_b})",
                "difference (> 0: a nearer)": f"{interval(s.difference, s.ci_low, s.ci_high)} in {s.criterion}",
                "gap between them": num(s.gap),
                "model's distance": num(s.distance),
                "favours": s.favours or ("-" if s.resolved else "- (unresolved)"),
            }
            for s in ood.sides
        ]
    )
    return {
        "Per shift, the family the model tracks (its member matched in distribution) and the runner-up, with the "
        "paired difference in the criterion that ranked them (90% over resampled prompts)": shifts,
        "Hypotheses side by side (the evidence table's row): the closest family of each side, the paired difference "
        "(> 0: the first side nearer) and the squared gap between the two families; a side is favoured only where the "
        "interval excludes 0 and the model is nearer it than the two are to each other": sides,
    }


VALIDATED_ON = (
    "planted GD (GD with its fixed step: diverges where the model does under scale_x = 2 and 3, nearest under "
    "every other shift) and planted Newton (Newton with its fixed alpha: diverges where the model does under "
    "scale_x = 2 and 3): tests/test_shift_tracking.py"
)
OOD_BLIND = (
    "a family is represented by its member matched in distribution; members that agree there and differ off "
    "distribution (GD's eta x steps, Newton's alpha x 2^k) are told apart only where they diverge differently"
)


def _evidence(block: Ood, a: str, b: str) -> list[dict]:
    """The evidence table's row: per shift, the side the model stays nearer off its training
    distribution (`side_comparisons`); favours a side that some shift resolves and none opposes."""
    sides = [s for s in block.sides if {s.a, s.b} == {a, b}]
    if not sides:
        return []
    favoured = {s.favours for s in sides if s.favours is not None}
    favours = favoured.pop() if len(favoured) == 1 else None

    def words(s) -> str:
        sign = 1 if s.a == a else -1  # differences as a - b closeness (> 0 favours a)
        lo, hi = sorted((sign * (s.ci_low or 0), sign * (s.ci_high or 0)))
        unit = "mismatch share" if s.criterion == "mismatch" else "distance"
        verdict = s.favours or ("unresolved" if not s.resolved else "not separable")
        gap = "" if s.criterion == "mismatch" else f", gap {s.gap:.3g}, model at {s.distance:.3g}"
        return f"{s.shift}: {verdict} ({unit} {sign * (s.difference or 0):+.3g} [{lo:+.3g}, {hi:+.3g}]{gap})"

    effect = "; ".join(words(s) for s in sides)
    if len(favoured) > 1 or (favours is None and any(s.favours for s in sides)):
        effect = "shifts disagree: " + effect
    return [
        {
            "instrument": "off-distribution tracking",
            "favours": favours,
            "effect": effect,
            "validated_on": VALIDATED_ON if {a, b} == {"newton", "gd"} else "",
            "cannot_tell_apart": OOD_BLIND,
        }
    ]


DESCRIPTION = (
    "Off the training distribution (Garg et al.'s prompt families, probe/data/shifts.py): each learner family's "
    "member closest to the model on unshifted prompts (its fixed step, alpha rule or penalty) is asked the same "
    "shifted prompts as the model ([ood] prompts per shift), ranked by the share of prompts on which it and the "
    "model disagree about diverging, then by mean squared distance / d to the model's predictions: a learner "
    "that diverges where the model does not (or the reverse) is further than any finite distance. A prediction "
    "diverges beyond 10^3 times the labels' root mean square. Intervals: 90% over resampled prompts, paired "
    "between families."
)

OOD = register_stage(
    AnalysisStage(
        name="ood",
        settings=OodSettings,
        run=_run,
        block=Ood,
        summarise=lambda tables, recipe: ood_block(tables["ood"], tables["ood_sides"]),
        title="Off the training distribution",
        description=DESCRIPTION,
        figures=_figures,
        estimates=_estimates,
        findings=_findings,
        tables=_page_tables,
        evidence=_evidence,
        reads=("similarity",),
        applies=shifts_apply,
        captions=(
            (
                "ood_curves",
                "Error / d against the number of examples under each shift: the model (black) and each matched "
                "family, means over the prompts on which the predictor did not diverge.",
            ),
        ),
    )
)
