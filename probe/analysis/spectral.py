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

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError, NotMeasurable
from ..learners.iterative import prefix_eigh
from .spectral_blend import blend_fits
from .spectral_references import Family, Members, reference_families, reference_weights
from .stats import resamples


@dataclass
class SpectralSettings(Section):
    """The spectral instrument (probe/analysis/spectral.py): recipe section [spectral], `icl-probe
    spectral` flags. It reads the layers stage's induced weights, so it needs similarity.simw."""

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


VARIABLES = {"lam_t": "lambda / t", "lam_max": "lambda / lambda_max"}


def spectral_cost(settings: SpectralSettings, prompts: int, boundaries: int, d: int, n_boot: int) -> budget.Estimate:
    """What spectral_analysis asks for (budget.spectral_estimate, knob spectral.bins) on `prompts`
    prompts: its predictors are the model's `boundaries` layer boundaries and every member of the
    reference families."""
    members = sum(budget.grid_points(family) for family in reference_families(d))
    return budget.spectral_estimate(settings.bins, prompts, boundaries + members, n_boot)


@dataclass
class Directions:
    """Every eigen-direction of every prompt's S_t (t >= d), flattened to N = B * n' * d entries:
    prompt index, the two bin variables, b = V^T w_OLS, V (for projecting weights), and which
    directions are counted out (zero eigenvalues, the top eigenvalue for lambda / lambda_max)."""

    prompt: Tensor  # (N,) long
    u: dict[str, Tensor]  # variable -> (N,)
    b: Tensor  # (N,)
    basis: Tensor  # (B, n', d, d)
    prefixes: Tensor  # (n',) the t used
    keep: dict[str, Tensor]  # variable -> (N,) bool
    counts: dict[str, int] = field(default_factory=dict)


def directions(xs: Tensor, ys: Tensor, rtol: float = 1e-10) -> Directions:
    """The eigen-directions of S_t for t = d..n-1 (no w_OLS below d) and w_OLS's components."""
    xs, ys = torch.as_tensor(xs, dtype=torch.float64), torch.as_tensor(ys, dtype=torch.float64)
    n_prompts, n, d = xs.shape
    if n <= d:
        raise ConfigError(
            f"the spectral analysis needs prompts of more than d = {d} points (w_OLS from t >= d), got {n}"
        )
    lam, v, c, t = prefix_eigh(xs, ys)
    lam, v, c, t = lam[:, d:], v[:, d:], c[:, d:], t[d:]
    top = lam.amax(-1, keepdim=True)
    nonzero = lam > rtol * top.clamp_min(1e-300)
    b = torch.where(nonzero, c / lam.clamp_min(1e-300), torch.zeros_like(c))
    is_top = torch.zeros_like(nonzero)
    is_top.scatter_(-1, lam.argmax(-1, keepdim=True), True)
    u = {"lam_t": lam / t.view(1, -1, 1), "lam_max": lam / top.clamp_min(1e-300)}
    keep = {"lam_t": nonzero, "lam_max": nonzero & ~is_top}
    prompt = torch.arange(n_prompts).view(-1, 1, 1).expand_as(lam)
    flat = lambda x: x.reshape(-1)
    counts = {
        "prompts": n_prompts,
        "prefixes_skipped": d,  # t = 0..d-1: S_t is singular, no w_OLS
        "directions": int(lam.numel()),
        "zero_eigenvalues": int((~nonzero).sum()),
        "top_eigenvalues": int((is_top & nonzero).sum()),
    }
    return Directions(
        flat(prompt),
        {k: flat(x) for k, x in u.items()},
        flat(b),
        v,
        t,
        {k: flat(x) for k, x in keep.items()},
        counts,
    )


def components(weights: Tensor, dirs: Directions) -> Tensor:
    """a = V^T w per direction: weights (A, B, n, d) -> (A, N) (prefixes t >= d)."""
    w = torch.as_tensor(weights, dtype=torch.float64)[:, :, -dirs.basis.shape[1] :]
    return torch.einsum("bnij,abni->abnj", dirs.basis, w).reshape(w.shape[0], -1)


@dataclass
class Bins:
    """One bin variable's binning: per direction its bin (-1: counted out), and the edges."""

    variable: str
    index: Tensor  # (N,) long
    edges: np.ndarray  # (K + 1,)

    @property
    def n(self) -> int:
        return len(self.edges) - 1


def make_bins(dirs: Directions, variable: str, n_bins: int, min_count: int) -> Bins:
    """Log-spaced bins between the 0.5th percentile of the variable and its largest kept value;
    bins with fewer than `min_count` directions are merged away (their directions counted out)."""
    u, keep = dirs.u[variable], dirs.keep[variable]
    vals = u[keep].clamp_min(1e-300)
    if vals.numel() == 0:
        raise ConfigError(f"no eigen-direction to bin on {VARIABLES[variable]}")
    lo = float(torch.quantile(vals.log(), 0.005).exp())
    hi = float(vals.max()) * (1 + 1e-9)
    edges = np.geomspace(max(lo, 1e-300), hi, n_bins + 1)
    idx = torch.bucketize(u.clamp_min(1e-300), torch.as_tensor(edges, dtype=u.dtype)) - 1
    idx = torch.where(keep & (idx >= 0) & (idx < n_bins), idx, torch.full_like(idx, -1))
    counts = torch.bincount(idx[idx >= 0], minlength=n_bins)
    sparse = counts < min_count
    if bool(sparse.all()):
        raise NotMeasurable(
            f"spectral.min_count = {min_count}: no bin of {VARIABLES[variable]} holds that many eigen-directions "
            f"(the fullest holds {int(counts.max())} of {int(keep.sum())}); lower spectral.min_count or measure on "
            "more prompts (prompts.induced)",
            knob="prompts.induced",
        )
    idx = torch.where((idx >= 0) & sparse[idx.clamp_min(0)], torch.full_like(idx, -1), idx)
    return Bins(variable, idx, edges)


@dataclass
class BinSums:
    """Per prompt and bin: sum(a b) (A, B, K), sum(a^2) (A, B, K), sum(b^2) (B, K), sum(b^2 u) (B, K),
    directions (K,); with two independent estimates a', a'' of the weights (`halves`), sum(a' a''),
    sum(a' b) and sum(a'' b) (each A, B, K)."""

    ab: Tensor
    aa: Tensor
    bb: Tensor
    bbu: Tensor
    count: Tensor
    cross: tuple[Tensor, Tensor, Tensor] | None = None


def bin_sums(a: Tensor, dirs: Directions, bins: Bins, halves: tuple[Tensor, Tensor] | None = None) -> BinSums:
    n_prompts, k = int(dirs.prompt.max()) + 1, bins.n
    ok = bins.index >= 0
    cell = dirs.prompt[ok] * k + bins.index[ok]  # (N',) flat (prompt, bin)
    b, u = dirs.b[ok], dirs.u[bins.variable][ok]

    def total(values: Tensor) -> Tensor:  # (..., N') -> (..., B, K)
        out = values.new_zeros(*values.shape[:-1], n_prompts * k)
        out.index_add_(-1, cell, values)
        return out.view(*values.shape[:-1], n_prompts, k)

    a = a[:, ok]
    cross = None
    if halves is not None:
        first, second = halves[0][:, ok], halves[1][:, ok]
        cross = total(first * second), total(first * b), total(second * b)
    return BinSums(
        total(a * b), total(a * a), total(b * b), total(b * b * u), torch.bincount(bins.index[ok], minlength=k), cross
    )


def resample_weights(n_prompts: int, n_boot: int, seed: int) -> Tensor:
    """Bootstrap resamples of the prompts as counts (n_boot, B): sums over a resample are one matmul."""
    (idx,) = resamples(n_prompts, n_boot, seed)
    counts = torch.zeros(n_boot, n_prompts, dtype=torch.float64)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
    return counts


def response(ab: Tensor, bb: Tensor) -> Tensor:
    """r = sum(a b) / sum(b^2) over the prompt axis (-2): (..., B, K) -> (..., K)."""
    return ab.sum(-2) / bb.sum(-2).clamp_min(1e-300)


def local_exponent(r: Tensor, center: Tensor, use: Tensor) -> Tensor:
    """Slope of log(-log(1 - r)) against log(center) over the bins `use` (..., K); NaN with under
    two usable bins or where r leaves (0, 1) in a used bin (a resample's overshoot)."""
    x = torch.where(use, center.log(), torch.zeros_like(center)).expand_as(r)
    inside = (r > 0) & (r < 1)
    y = torch.where(use & inside, (-torch.log1p(-r.clamp(-1, 1 - 1e-15))).clamp_min(1e-300).log(), torch.zeros_like(r))
    w = use.to(r.dtype).expand_as(r)
    n = w.sum(-1)
    mx, my = (w * x).sum(-1) / n.clamp_min(1), (w * y).sum(-1) / n.clamp_min(1)
    sxx = (w * (x - mx.unsqueeze(-1)) ** 2).sum(-1)
    sxy = (w * (x - mx.unsqueeze(-1)) * (y - my.unsqueeze(-1))).sum(-1)
    slope = sxy / sxx.clamp_min(1e-300)
    bad = (n < 2) | (sxx <= 0) | ((use & ~inside).any(-1))
    return torch.where(bad, torch.full_like(slope, math.nan), slope)


def fit_window(r: Tensor, used: Tensor, r_low: float, r_high: float) -> Tensor:
    """The bins an exponent is fitted over (..., K): the longest contiguous run of kept bins (in
    order of the variable; bins not kept neither join nor break a run) whose response lies in
    (r_low, r_high), the first such run on a tie. A bin past an overshoot or a dip never re-enters:
    the fit is on one rising stretch of the curve. The same rule is applied to every resample."""
    inside = (r > r_low) & (r < r_high) & used
    lead = inside.shape[:-1]
    run = torch.zeros(lead, dtype=torch.long)
    start = torch.zeros(lead, dtype=torch.long)
    best = torch.zeros(lead, dtype=torch.long)
    best_start = torch.zeros(lead, dtype=torch.long)
    best_end = torch.full(lead, -1, dtype=torch.long)
    for k in range(inside.shape[-1]):
        kept, ins = used[..., k].expand(lead), inside[..., k]
        start = torch.where(ins & (run == 0), torch.full_like(start, k), start)
        run = torch.where(ins, run + 1, torch.where(kept, torch.zeros_like(run), run))
        longer = run > best
        best = torch.where(longer, run, best)
        best_start = torch.where(longer, start, best_start)
        best_end = torch.where(longer, torch.full_like(best_end, k), best_end)
    position = torch.arange(inside.shape[-1])
    return inside & (position >= best_start.unsqueeze(-1)) & (position <= best_end.unsqueeze(-1))


def fit_errors(r: Tensor, r_ref: Tensor) -> tuple[Tensor, Tensor]:
    """Each reference curve with a fitted gain g >= 0 against each predictor's: r (..., A, K) and
    r_ref (..., M, K) -> gain, relative error sum((r - g r_ref)^2) / sum(r^2), each (..., A, M)."""
    rr = torch.einsum("...mk,...mk->...m", r_ref, r_ref).unsqueeze(-2)
    cross = torch.einsum("...ak,...mk->...am", r, r_ref)
    gain = (cross / rr.clamp_min(1e-300)).clamp_min(0)
    sq = (r * r).sum(-1).unsqueeze(-1)
    err = sq - 2 * gain * cross + gain**2 * rr
    return gain, err / sq.clamp_min(1e-300)


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
        runner_up, difference (runner-up error - best) with its paired interval, separated.
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
        r[:, used], m.r_ref[:, used], m.r_boot[:, :, used], m.r_ref_boot[:, :, used], cls_err_b.amin(-1), members
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


def _no_response(row, r_low: float, r_high: float) -> bool:
    """A predictor that does not respond in this variable: r never above r_low, its weights no
    closer to w_OLS than zero (`explained` <= 0), or the best class fits with gain ~0 and relative
    error ~1."""
    return not (row.max_r > r_low) or not (row.explained > 0) or (row.gain < r_low and row.error > r_high)


def _not_a_filter(row, max_non_filter: float) -> bool:
    """Weights that are not a filter of S's spectrum: their non-filter share exceeds the best-fitting
    reference member's own (its filter's variation within a bin) by more than `max_non_filter`
    (Adam's first iterates: 0.13-0.25 above; exact filters: 0)."""
    return bool(row.non_filter - getattr(row, "best_non_filter", 0.0) > max_non_filter)


NOT_SEPARABLE = " not separable from "  # a verdict "A not separable from B" (`summarise`)


def verdict_classes(verdict: str) -> list[str]:
    """The classes a verdict names: ["gd"], ["gd", "ridge"] for "gd not separable from ridge", or the
    verdict itself where it names none ("no response", "ambiguous: ...")."""
    return verdict.split(NOT_SEPARABLE)


def summarise(layers: pd.DataFrame, r_low: float, r_high: float, max_non_filter: float = 0.1) -> pd.DataFrame:
    """One verdict per predictor over both bin variables: the filter class both variables'
    fits name (separated from the runner-up by their paired intervals), "not a spectral filter"
    where in every variable the weights leave more of their energy off the filter than the best
    reference member does by over `max_non_filter` (`_not_a_filter`), "mixed: A w [interval] + B"
    where in a bin variable a two-class blend beats every single class and w's interval excludes 0
    and 1 (the same blend where both variables find one; probe/analysis/spectral_blend.py), "ambiguous" where the two
    variables name different classes, "not separable" where the best class's paired interval
    reaches 0, "no response" where r stays below r_low everywhere or the weights do not follow w_OLS
    (`_no_response`), "converged" where it stays above
    r_high in every bin (every class that converges fits; the layers that can decide are earlier). The exponent quoted is the one
    in the best family's own variable."""
    out = []
    for name, rows in layers.groupby("predictor", sort=False):
        by_var = {row.variable: row for row in rows.itertuples()}
        classes = {row.best_class for row in by_var.values()}
        own = next((row for row in by_var.values() if row.own_variable_of_best), next(iter(by_var.values())))
        if all(_no_response(row, r_low, r_high) for row in by_var.values()):
            verdict, klass = "no response", ""
        elif all(row.min_r > r_high for row in by_var.values()):
            verdict, klass = "converged", ""  # r ~ 1 in every bin: every class that converges fits
        elif all(_not_a_filter(row, max_non_filter) for row in by_var.values()):
            verdict, klass = "not a spectral filter", ""
        elif (mixed := [row for row in by_var.values() if getattr(row, "mixed", False)]) and len(
            {row.blend for row in mixed}
        ) == 1:
            m = mixed[0]
            first, second = str(m.blend).split("+")
            verdict, klass = (
                f"mixed: {first} {m.blend_w:.2f} [{m.blend_w_low:.2f}, {m.blend_w_high:.2f}] + {second}",
                "",
            )
        elif len(classes) > 1:
            verdict, klass = "ambiguous: " + " / ".join(f"{v} {r.best_class}" for v, r in by_var.items()), ""
        elif not all(row.separated for row in by_var.values()):
            klass = classes.pop()
            verdict = f"{klass}{NOT_SEPARABLE}{own.runner_up}"
        else:
            klass = classes.pop()
            verdict = klass
        out.append(
            {
                "predictor": name,
                "verdict": verdict,
                "best_class": klass,
                "p": own.p,
                "p_low": own.p_low,
                "p_high": own.p_high,
                "variable": own.variable,
                "best_family": own.best_family,
                "best_k": own.best_k,
                "non_filter": own.non_filter,
            }
        )
    return pd.DataFrame(out)
