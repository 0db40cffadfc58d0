"""The spectral instrument's measurement primitives (probe/analysis/spectral.py): each prompt's
eigen-directions, the components of weights along them, log-spaced bins of an eigenvalue variable,
the binned sums a predictor's response r is read from, the local exponent p and its fit window,
and the fit errors of reference filters."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..core.errors import ConfigError, NotMeasurable
from ..learners.iterative import prefix_eigh
from .stats import resamples

VARIABLES = {"lam_t": "lambda / t", "lam_max": "lambda / lambda_max"}  # the bin variables, in words


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
