"""Which spectral filter does each layer apply? (Fu et al. 2024, eq. 6, 8; Akyurek et al. 2023, eq. 16)

On a prompt with S_t = X_t^T X_t = V diag(lambda) V^T, the linear learners of the seeds return,
along each eigen-direction v_i, a fraction r(lambda_i) of the least-squares weights' component:

    GD from 0, k steps of size eta          1 - (1 - eta lambda)^k          ~ k eta lambda      (slope 1)
    Fu et al.'s Newton, M_0 = alpha S, k its.    1 - (1 - alpha lambda^2)^(2^k)  ~ 2^k alpha lambda^2 (slope 2)
    Newton-Schulz from M_0 = alpha I        1 - (1 - alpha lambda)^(2^k)                         (slope 1)
    S-preconditioned GD, k steps            1 - (1 - eta lambda^2)^k                             (slope 2)
    ridge, penalty c                        lambda / (lambda + c)                                (slope 1)
    least squares                           1

Two identities hold exactly (tests): Newton from alpha I *is* GD with 2^k steps of size alpha, and
Fu et al.'s Newton *is* S-preconditioned GD with 2^k steps. Behaviour therefore identifies a filter
class and its rate, never which of two equivalent procedures computes it; the classes of
spectral_references.py (`CLASSES`, with the reference families) are what this instrument can tell apart.

The measurement (`spectral_analysis`): for each predictor (a layer's induced weights, or a
reference learner's weights) and each prefix t >= d, a = V^T w and b = V^T w_OLS per direction;
pooled over prompts and prefixes in log-spaced bins of an eigenvalue variable, r = sum(a b) / sum(b^2)
(invariant to eigh's signs), each bin placed at the b^2-weighted mean of its variable. Two bin
variables: lambda / t (the own variable of a learner whose step is fixed on S/t: the planted models)
and lambda / lambda_max (of one whose step is set per prompt). The local exponent p is the slope of
log(-log(1 - r)) against log(variable) over the bins whose r lies in [r_low, r_high]; it is 1 for
the GD class and 2 for the preconditioned class in the small-r limit, biased by saturation over a
finite range (the references' own p, measured on the same prompts, show the bias).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from .spectral_bins import (
    VARIABLES,
    BinSums,
    Directions,
    bin_sums,
    components,
    directions,
    fit_errors,
    fit_window,
    local_exponent,
    make_bins,
    resample_weights,
    response,
)
from .spectral_blend import blend_fits
from .spectral_references import Family, Members, reference_families, reference_weights
from .spectral_verdicts import summarise, variable_verdict


@dataclass
class SpectralSettings(Section):
    """The spectral instrument (probe/analysis/spectral.py): recipe section [spectral], `icl-probe
    spectral` flags. It reads the induced stage's weights, so it needs similarity.simw."""

    SECTION = "spectral"
    enabled: bool = setting(True, "measure each layer's spectral response (needs similarity.simw)")
    bins: int = setting(12, "log-spaced eigenvalue bins per bin variable", minimum=3)
    min_count: int = setting(20, "eigen-directions a bin needs to be kept")
    r_low: float = setting(0.05, "lower end of the response range the local exponent is fitted over", high=1.0)
    r_high: float = setting(0.95, "upper end of that range", high=1.0)
    max_non_filter: float = setting(
        0.1,
        "largest non-filter share above the best reference member's own at which a layer still counts as a "
        "filter of S's spectrum",
        high=1.0,
    )

    def __post_init__(self) -> None:

        super().__post_init__()
        if not self.r_low < self.r_high < 1:
            raise ConfigError(
                f"spectral.r_low ({self.r_low}) must be below spectral.r_high ({self.r_high}), and r_high below 1"
            )


def spectral_cost(
    settings: SpectralSettings, prompts: int, boundaries: int, d: int, n_boot: int, n_points: int
) -> budget.Estimate:
    """What spectral_analysis asks for (budget.spectral_estimate, knob spectral.bins) on `prompts`
    prompts of `n_points` points: its predictors are the model's `boundaries` layer boundaries and
    every member of the reference families, whose weights it computes."""
    members = sum(budget.grid_points(family) for family in reference_families(d))
    estimate = budget.spectral_estimate(settings.bins, prompts, boundaries + members, n_boot)
    # every member's weights at every prompt and prefix (`reference_weights`): small batched d x d
    # solves, eigen-decompositions and filters, about REFERENCE_D3 d^3 flop-equivalents each
    weights = float(members) * prompts * n_points * REFERENCE_D3 * d**3
    return dataclasses.replace(estimate, flop=estimate.flop + weights)


# a reference member's weights at one prompt and prefix, in d^3 flop-equivalents (d = 20, measured 2026-11-29)
REFERENCE_D3 = 20


@dataclass
class NotMeasured:
    """The spectral instrument could not measure on the data at hand (`NotMeasurable`): why, and the
    setting that would change it. A report shows it in the stage's section and completes."""

    reason: str
    knob: str


@dataclass
class SpectralAnalysis:
    """Tables of `spectral_analysis`.

    curves: predictor, kind ("layer" / "fit"), family, class, variable, bin, u (the bin's b^2-weighted
        mean of its variable), r, ci_low, ci_high, directions. "fit" rows are each class's best member
        (`family`) times its gain, per layer.
    layers: one row per (layer, variable): p (local exponent) with p_low / p_high, bins_used, u range,
        non_filter (share of the weights' energy in S's eigenbasis the binned filter leaves
        unexplained; corrected for the induced weights' estimation noise where two halves were
        given, non_filter_uncorrected beside it), overshoot_bins (r > 1), best_class / best_family / best_k / gain / error,
        runner_up, difference (runner-up error - best) with its paired interval, separated, verdict (the
        variable's own reading by the summary's rules, spectral_verdicts.variable_verdict).
    summary: one row per layer: the verdict over both variables ("GD class", "ambiguous", ...).
    references: p per reference family (its best member's measured exponent: the estimator's bias).
    fits: layer, variable, family, class, k, gain, error: every family's best member per layer.
    counts: what was counted out (t < d prefixes, zero and top eigenvalues).
    """

    curves: pd.DataFrame
    layers: pd.DataFrame
    summary: pd.DataFrame
    references: pd.DataFrame
    fits: pd.DataFrame
    counts: dict[str, int]


@dataclass
class Measured:
    """One bin variable's measurement: per bin whether it is kept (`used`, K) and its position
    (`center`), the responses of the predictors r (A, K) and of the references r_ref (M, K), and
    their bootstrap resamples (S, A, K), (S, M, K), (S, K)."""

    variable: str
    sums: BinSums
    ref_sums: BinSums
    used: Tensor
    center: Tensor
    r: Tensor
    r_ref: Tensor
    r_boot: Tensor
    r_ref_boot: Tensor
    center_boot: Tensor


def measure(
    a_layer: Tensor,
    a_ref: Tensor,
    dirs: Directions,
    variable: str,
    s: SpectralSettings,
    boot: Tensor,
    halves: tuple[Tensor, Tensor] | None = None,
):
    """The binned responses in one variable, with resamples as sums over counted prompts (one
    matmul each)."""
    bins = make_bins(dirs, variable, s.bins, s.min_count)
    lay, ref = bin_sums(a_layer, dirs, bins, halves), bin_sums(a_ref, dirs, bins)
    bb_b = (boot @ lay.bb).clamp_min(1e-300)  # (S, K)
    return Measured(
        variable,
        lay,
        ref,
        lay.count >= s.min_count,
        lay.bbu.sum(0) / lay.bb.sum(0).clamp_min(1e-300),
        response(lay.ab, lay.bb),
        response(ref.ab, ref.bb),
        torch.einsum("sb,abk->sak", boot, lay.ab) / bb_b.unsqueeze(1),
        torch.einsum("sb,mbk->smk", boot, ref.ab) / bb_b.unsqueeze(1),
        (boot @ lay.bbu) / bb_b,
    )


def _quantiles(values: Tensor, dim: int = 0) -> tuple[Tensor, Tensor]:
    """The 5% and 95% quantiles over `dim`, NaN ignored."""
    lo, hi = torch.nanquantile(values, torch.tensor([0.05, 0.95], dtype=values.dtype), dim=dim)
    return lo, hi


def _curve_rows(m: Measured, name: str, r: Tensor, kind: str, lo=None, hi=None, family="", klass="") -> list[dict]:
    """One row per kept bin of one curve r (K,)."""
    return [
        {
            "predictor": name,
            "kind": kind,
            "family": family,
            "class": klass,
            "variable": m.variable,
            "bin": k,
            "u": float(m.center[k]),
            "r": float(r[k]),
            "ci_low": math.nan if lo is None else float(lo[k]),
            "ci_high": math.nan if hi is None else float(hi[k]),
            "directions": int(m.sums.count[k]),
        }
        for k in torch.nonzero(m.used).flatten().tolist()
    ]


def _variable_tables(m: Measured, members: Members, names: list[str], s: SpectralSettings):
    """Curves, per-layer rows, family fits and the references' exponents of one bin variable."""
    used, r, center = m.used, m.r, m.center
    lo, hi = _quantiles(m.r_boot)
    gain, err = fit_errors(r[:, used], m.r_ref[:, used])  # (A, M)
    _, err_b = fit_errors(m.r_boot[:, :, used], m.r_ref_boot[:, :, used])  # (S, A, M)
    in_range = fit_window(r, used, s.r_low, s.r_high)
    p = local_exponent(r, center, in_range)
    # each resample chooses its own bins by the same rule; one without two bins in range has no fit
    p_boot = local_exponent(m.r_boot, m.center_boot.unsqueeze(1), fit_window(m.r_boot, used, s.r_low, s.r_high))
    p_lo, p_hi = _quantiles(p_boot)
    p_lo, p_hi = (torch.where(p.isnan(), p, q) for q in (p_lo, p_hi))  # no interval without an estimate
    unfit = torch.isnan(p_boot).double().mean(0)  # (A,)
    overshot = ((m.r_boot >= 1) & used).any(-1).double().mean(0)  # (A,) resamples with a bin at r >= 1
    # the references' own exponent in the same bins: the estimator's bias over a finite range
    p_ref = local_exponent(m.r_ref, center, fit_window(m.r_ref, used, s.r_low, s.r_high))
    non_filter = _non_filter_share(m.sums, r), _non_filter_share(m.sums, r, corrected=False)
    ref_share = _non_filter_share(m.ref_sums, m.r_ref, corrected=False)  # (M,): a filter's within-bin variation
    explained = _explained(m.sums)
    cls_err, cls_err_b = members.class_min(err), members.class_min(err_b)
    blend = blend_fits(
        r[:, used],
        m.r_ref[:, used],
        m.r_boot[:, :, used],
        m.r_ref_boot[:, :, used],
        cls_err.amin(-1),
        cls_err_b.amin(-1),
        members,
    )
    curves, rows, fits = [], [], []
    for a, name in enumerate(names):
        curves += _curve_rows(m, name, r[a], "layer", lo[a], hi[a])
        order = torch.argsort(cls_err[a])
        best_c = int(order[0])
        second_c = int(order[1]) if len(members.classes) > 1 else best_c  # one class: nothing to separate from
        d_lo, d_hi = _quantiles(cls_err_b[:, a, second_c] - cls_err_b[:, a, best_c])
        all_lo, _ = _quantiles(cls_err_b[:, a, :] - cls_err_b[:, a, best_c : best_c + 1])  # (C,)
        apart = [k for c, k in enumerate(members.classes) if c != best_c and bool(all_lo[c] > 0)]
        best_m = members.of_class(err[a], best_c)
        fam = members.family[best_m]
        rows.append(
            {
                "predictor": name,
                "variable": m.variable,
                "own_variable_of_best": fam.variable == m.variable,
                **_response_row(m, r[a], (p[a], p_lo[a], p_hi[a]), in_range[a], (non_filter[0][a], non_filter[1][a])),
                "explained": float(explained[a]),
                "resamples_unfit": float(unfit[a]),
                "resamples_overshoot": float(overshot[a]),
                "best_class": members.classes[best_c],
                "best_family": fam.name,
                "best_axis": fam.axis or "",
                "best_k": members.k[best_m],
                "best_non_filter": float(ref_share[best_m]),
                "gain": float(gain[a, best_m]),
                "error": float(cls_err[a, best_c]),
                "runner_up": members.classes[second_c] if second_c != best_c else "",
                "runner_up_error": float(cls_err[a, second_c]),
                "difference": float(cls_err[a, second_c] - cls_err[a, best_c]),
                "diff_low": float(d_lo),
                "diff_high": float(d_hi),
                "separated": bool(d_lo > 0),
                "separated_from": " ".join(apart),  # every class whose paired interval to the best excludes 0
                **_blend_row(blend, a, members),
            }
        )
        for family, i in members.family_best(err[a]).items():
            f = members.family[i]
            fits.append(
                {
                    "predictor": name,
                    "variable": m.variable,
                    "family": family,
                    "class": f.klass,
                    "k": members.k[i],
                    "gain": float(gain[a, i]),
                    "error": float(err[a, i]),
                    "p": float(p_ref[i]),
                }
            )
        for c, klass in enumerate(members.classes):
            i = members.of_class(err[a], c)
            curves += _curve_rows(m, name, gain[a, i] * m.r_ref[i], "fit", family=members.family[i].name, klass=klass)
    return curves, rows, fits, _reference_exponents(m.variable, members, p_ref)


def _blend_row(blend, a: int, members: Members) -> dict:
    """One predictor's best two-class blend (probe/analysis/spectral_blend.py): w on the first class."""
    if blend.first[a] < 0:
        return {"blend": "", "blend_w": math.nan, "blend_w_low": math.nan, "blend_w_high": math.nan,
                "blend_error": math.nan, "blend_gain_low": math.nan, "mixed": False}  # fmt: skip
    return {
        "blend": f"{members.classes[blend.first[a]]}+{members.classes[blend.second[a]]}",
        "blend_w": float(blend.w[a]),
        "blend_w_low": float(blend.w_low[a]),
        "blend_w_high": float(blend.w_high[a]),
        "blend_error": float(blend.error[a]),
        "blend_gain_low": float(blend.gain_low[a]),
        "mixed": bool(blend.mixed[a]),
    }


def _step_words(fam: Family) -> str:
    """A family's step rule as a value: its fixed step or alpha, or its per-prompt rule's name."""
    values = [v for key in ("eta", "alpha", "penalty") for v in fam.grid.get(key, [])]
    return ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values)


def _response_row(m: Measured, r: Tensor, p: tuple, in_range: Tensor, non_filter: tuple[Tensor, Tensor]) -> dict:
    """One predictor's response in one variable: its exponent with interval, the bins and range it
    was fitted over, its smallest and largest response, overshooting bins and non-filter share."""
    used, inside = m.used, m.center[in_range]
    return {
        "p": float(p[0]),
        "p_low": float(p[1]),
        "p_high": float(p[2]),
        "bins_used": int(in_range.sum()),
        "u_low": float(inside.min()) if len(inside) else math.nan,
        "u_high": float(inside.max()) if len(inside) else math.nan,
        "min_r": float(r[used].min()) if used.any() else math.nan,
        "max_r": float(r[used].max()) if used.any() else math.nan,
        "overshoot_bins": int(((r > 1) & used).sum()),
        "non_filter": float(non_filter[0]),
        "non_filter_uncorrected": float(non_filter[1]),
    }


def _reference_exponents(variable: str, members: Members, p_ref: Tensor) -> list[dict]:
    """Per reference family the spread of its members' exponents (those with two bins in range)."""
    out = []
    for name in dict.fromkeys(f.name for f in members.family):
        idx = [i for i, f in enumerate(members.family) if f.name == name]
        vals = p_ref[idx][torch.isfinite(p_ref[idx])]
        f = members.family[idx[0]]
        out.append(
            {
                "family": name,
                "class": f.klass,
                "variable": variable,
                "own_variable": f.variable == variable,
                "step": _step_words(f),
                "members": len(idx),
                "members_dropped": members.dropped.get(name, 0),
                "p_median": float(vals.median()) if len(vals) else math.nan,
                "p_min": float(vals.min()) if len(vals) else math.nan,
                "p_max": float(vals.max()) if len(vals) else math.nan,
                "members_measured": len(vals),
            }
        )
    return out


def spectral_analysis(
    layer_weights,
    xs,
    ys,
    settings: SpectralSettings | None = None,
    n_boot: int = 500,
    seed: int = 0,
    families: list[Family] | None = None,
    names: list[str] | None = None,
    halves=None,
) -> SpectralAnalysis:
    """Response curves, exponents and filter-class fits of every predictor in `layer_weights`
    (A, B, n, d): a layer's induced weights (Fu et al. 2024, eq. 11-12) on prompts xs (B, n, d), ys (B, n).
    Intervals: 5-95% over `n_boot` resamples of the prompts. `families`: the references (default
    `reference_families(d, xs=xs)`: fixed steps stable on these prompts); `names` labels the
    predictors (default: layer 0..A-1); `halves`, two independent estimates of `layer_weights` of
    the same shape (induced from disjoint halves of the queries), correct the non-filter share for
    their estimation noise (`_non_filter_share`)."""
    s = settings or SpectralSettings()
    xs = torch.as_tensor(xs, dtype=torch.float64)
    ys = torch.as_tensor(ys, dtype=torch.float64)
    lw = torch.as_tensor(np.asarray(layer_weights), dtype=torch.float64)
    if lw.ndim != 4 or lw.shape[1:] != xs.shape:
        raise ConfigError(f"layer weights must have shape (A, {', '.join(map(str, xs.shape))}), got {tuple(lw.shape)}")
    names = names or [str(i) for i in range(lw.shape[0])]
    dirs = directions(xs, ys)
    ref_w, members = reference_weights(families or reference_families(xs.shape[-1], xs=xs), xs, ys)
    a_layer, a_ref = components(lw, dirs), components(ref_w, dirs)
    split = None
    if halves is not None:
        first, second = (torch.as_tensor(np.asarray(h), dtype=torch.float64) for h in halves)
        if first.shape != lw.shape or second.shape != lw.shape:
            raise ConfigError(f"the two halves' weights must have the layer weights' shape {tuple(lw.shape)}")
        split = components(first, dirs), components(second, dirs)
    boot = resample_weights(xs.shape[0], n_boot, seed)
    parts = [
        _variable_tables(measure(a_layer, a_ref, dirs, var, s, boot, split), members, names, s) for var in VARIABLES
    ]
    curves, layers, fits, refs = (pd.DataFrame([row for part in parts for row in part[i]]) for i in range(4))
    summary = summarise(layers, s.r_low, s.r_high, s.max_non_filter)
    layers["verdict"] = [variable_verdict(row, s.r_low, s.r_high, s.max_non_filter) for row in layers.itertuples()]
    return SpectralAnalysis(curves, layers, summary, refs, fits, dirs.counts)


def _explained(sums: BinSums) -> Tensor:
    """1 - sum((a - b)^2) / sum(b^2) over the binned directions (A,): how much closer the weights are to
    w_OLS than w = 0 is. At or below 0 the weights do not follow w_OLS at all (a read-out that does
    not predict y), whatever filter share they show."""
    left = sums.aa.sum((-2, -1)) - 2 * sums.ab.sum((-2, -1)) + sums.bb.sum((-2, -1))
    return 1 - left / sums.bb.sum((-2, -1)).clamp_min(1e-300)


def _non_filter_share(sums: BinSums, r: Tensor, corrected: bool = True) -> Tensor:
    """Share of sum(a^2) that a_i = r(bin) b_i leaves: sum(a^2) - 2 r sum(a b) + r^2 sum(b^2), pooled
    (A,). 0 for an exact spectral filter constant within each bin; off-diagonal mixing, within-bin
    variation of the filter and noise all raise it. With two independent estimates a', a'' of the
    weights (induced from disjoint halves of the queries; `corrected`), the residuals of the two are
    multiplied instead, sum((a' - r' b)(a'' - r'' b)) / sum(a' a''), r', r'' each half's response: the
    estimation noise of induced weights (which shrinks with the query count) has mean 0 in both
    products, so the share stops moving with the query count (it is no longer bounded below by 0)."""
    bb = sums.bb.sum(-2)  # (K,)
    if corrected and sums.cross is not None:
        both, first_b, second_b = (x.sum(-2) for x in sums.cross)  # (A, K) each
        left = both - first_b * second_b / bb.clamp_min(1e-300)
        return left.sum(-1) / both.sum(-1).clamp_min(1e-300)
    aa, ab = sums.aa.sum(-2), sums.ab.sum(-2)  # (A, K)
    left = aa - 2 * r * ab + r**2 * bb
    return left.sum(-1) / aa.sum(-1).clamp_min(1e-300)


def spectral_tables(spectral) -> dict[str, pd.DataFrame]:
    """The spectral instrument's tables, named as the report writes them (none when it did not run;
    one status row when it could not measure on the data at hand)."""
    if spectral is None:
        return {}
    if isinstance(spectral, NotMeasured):
        return {
            "spectral_status": pd.DataFrame(
                [{"status": "not measured", "reason": spectral.reason, "knob": spectral.knob}]
            )
        }
    names = ("curves", "layers", "summary", "references", "fits")
    return {f"spectral_{name}": getattr(spectral, name) for name in names}
