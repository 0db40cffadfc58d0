"""Which learner a model tracks off its training distribution.

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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from ..core.seeds import Stream, stream_generator
from ..core.validate import check_model, positive_int
from ..data.config import TaskConfig
from ..data.metrics import error_per_dim
from ..data.tasks import sample_prompts
from ..learners import run_learner
from ..learners.iterative import NEWTON_ITERATIONS
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
MATCH_MEMBERS = 64  # grid members run at once while matching (a 525-member GD grid held 4.7 GB at paper scale)
REFINE = 3  # rounds of refinement of a fixed step or alpha (matched_members), each 10x finer
NEAR = np.geomspace(0.8, 1.25, 23)  # the first round's factors, 2% apart
DIVERGED = 1e3  # a prediction beyond this many times the labels' root mean square has diverged
CLOSE = 0.1  # the closest family's distance over the model's mean squared prediction, above which none is close
TIE_SHARE = 0.01  # a distance difference under this share of the two families' own squared gap is a tie
ZERO_SHARE = 1e-3  # a family whose mean squared prediction is under this share of the labels' predicts ~0


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
    tie: str = ""  # why the two tie though the interval excludes 0 (`PerPrompt.tie`), else empty

    @property
    def separable(self) -> bool:
        return self.low > 0 and not self.tie


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
    label_power: float = 0.0  # mean y^2 / d of the shifted queries, the zero predictor's error (0: not checked)

    def tie(self, a: str, b: str, difference: float) -> str:
        """Why families a and b tie by distance although their paired interval may exclude 0: both
        sit at the zero predictor (mean squared prediction / d under ZERO_SHARE of the labels'), or
        the difference is under TIE_SHARE of the squared gap between their own predictions."""
        power = {
            f: float(
                _masked_mean(
                    (torch.nan_to_num(self.preds[f]) ** 2).mean(1, keepdim=True) / self.n_dims,
                    self.both[:, [self.families.index(f)]],
                )[0]
            )
            for f in (a, b)
        }
        if all(v < ZERO_SHARE * self.label_power for v in power.values()):
            return f"{a} and {b} both predict ~0 (mean squared prediction / d {power[a]:.2g} and {power[b]:.2g})"
        gap = self.gap(a, b)
        if not difference > TIE_SHARE * gap:
            return f"their difference {difference:.3g} is under {TIE_SHARE:.0%} of the gap between them ({gap:.3g})"
        return ""

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
        tie = self.tie(self.families[i], self.families[j], point) if criterion == "distance" else ""
        return Comparison(self.families[i], self.families[j], criterion, point, float(lo[0]), float(hi[0]), tie)


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
    model_pred = predict(model, Prompts(p.xs, p.ys), device=device).double()[:, 1:].to(device)
    xs, ys = p.xs.to(device), p.ys.to(device)  # the learners run on the report's device

    def closest(learner: str, grid: dict[str, Any]) -> tuple[dict[str, Any], float]:
        found: tuple[dict[str, Any], float] = ({}, float("inf"))
        for part in grid_chunks(grid, MATCH_MEMBERS):  # in grid order: the first of equal distances wins
            result = run_learner(learner, xs, ys, **part)
            dist = error_per_dim(result.preds[:, :, 1:], model_pred, task.n_dims).mean((1, 2))  # (K,)
            best = int(torch.nan_to_num(dist, nan=float("inf")).argmin())
            if not found[0] or float(dist[best]) < found[1]:
                found = (result.grid[best], float(dist[best]))
        return found

    out = {}
    for family, (learner, grid) in CANDIDATES.items():
        member, dist = closest(learner, grid)
        for r in range(REFINE):
            tries = _refinements(family, member, NEAR ** (0.1**r))
            member, dist = min([(member, dist), *(closest(learner, g) for g in tries)], key=lambda pair: pair[1])
        out[family] = (learner, {k: (v,) for k, v in member.items()}, dist)
    return out


def grid_chunks(grid: dict[str, Any], most: int) -> list[dict[str, Any]]:
    """The grid split along its first key of several values into grids of at most about `most`
    members each (the whole grid where it is that small)."""
    sizes = {k: len(v) for k, v in grid.items() if isinstance(v, (tuple, list))}
    total = int(np.prod(list(sizes.values()))) if sizes else 1
    key = next((k for k, n in sizes.items() if n > 1), None)
    if total <= most or key is None:
        return [grid]
    per = max(1, most * sizes[key] // total)
    return [{**grid, key: tuple(grid[key][i : i + per])} for i in range(0, sizes[key], per)]


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
    on_device = p.xs.to(device), p.ys.to(device), queries.to(device)  # once, for every family's learner
    preds = {family: _own_query_predictions(matched[family], *on_device)[:, use] for family in families}
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
    per_prompt = PerPrompt(families, mismatch, sq, both, n_boot, seed, preds, d, float(y.pow(2).mean()) / d)
    first, second = sorted(range(len(families)), key=per_prompt.key)[:2]
    model_error, model_size = _model_error_and_size(model_pred, y, ~model_off.any(1), d)
    errors = {
        f: _masked_mean(error_per_dim(preds[f], y, d).mean(1).unsqueeze(1), (~off[:, [i]]).double())[0]
        for i, f in enumerate(families)
    }
    table = pd.DataFrame(
        {
            "shift": shift,
            **_matched_columns(matched),
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


def _own_query_predictions(member: tuple[str, dict, float], xs: Tensor, ys: Tensor, queries: Tensor) -> Tensor:
    """A matched member's prediction at each prefix t for position t's own query (P, n), on the CPU;
    the learner runs on the prompts' device (the report's)."""
    learner, params, _ = member
    result = run_learner(learner, xs, ys, queries, **params)
    assert result.query_preds is not None
    return torch.diagonal(result.query_preds[0], dim1=1, dim2=2).cpu()


def _model_error_and_size(model_pred: Tensor, y: Tensor, ok: Tensor, d: int) -> tuple[float, float]:
    """The model's error / d and its predictions' size / d over the prompts where it did not diverge
    (`ok`); NaN where it diverged on every prompt."""
    if not ok.any():
        return float("nan"), float("nan")
    return float(error_per_dim(model_pred[ok], y[ok], d).mean()), float(error_per_dim(model_pred[ok], 0.0, d).mean())


def _matched_columns(matched: dict) -> dict[str, list]:
    """The tracking table's columns naming each family's matched member."""
    return {
        "family": list(matched),
        "learner": [member[0] for member in matched.values()],
        "matched": [_member_words(member[1]) for member in matched.values()],
        "distance_in_distribution": [member[2] for member in matched.values()],
    }


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
                tie=tr.best.tie,
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
    if c.tie:
        return f"tied with {c.other}: {c.tie}"
    if c.separable:
        return f"apart from {c.other} (paired difference in {what} {c.difference:.3g}, 90% interval {c.low:.3g} to {c.high:.3g})"
    return f"not separable from {c.other} (paired {what} interval {c.low:.3g} to {c.high:.3g})"


def tracking_words(tracking: Tracking) -> str:
    """One line: which family the model tracks under the shift, and whether the runner-up is apart."""
    rows = tracking.table.set_index("family")
    shift = rows.iloc[0]["shift"]
    first = rows.loc[tracking.tracks]
    verdict = comparison_words(tracking.best)
    if tracking.best.tie:
        return f"under {shift} the model tracks no family: {tracking.tracks} {verdict}"
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
