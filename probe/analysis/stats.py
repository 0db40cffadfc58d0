"""Statistics shared by every analysis: R^2 and prompt-resampling bootstrap intervals."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from ..core.seeds import Stream, stream_generator


def r2_score(truth: Tensor, pred: Tensor, dim: int = -2) -> Tensor:
    """scikit-learn's r2_score per output, batched: 1 - SS_res / SS_tot over `dim` (samples).

    Where the truth is constant along `dim`, sklearn's convention: 1 for a perfect prediction,
    else 0. Computed in float64; the `dim` axis is removed from the result.
    """
    truth, pred = truth.double(), pred.double()
    ss_res = ((truth - pred) ** 2).sum(dim)
    ss_tot = ((truth - truth.mean(dim, keepdim=True)) ** 2).sum(dim)
    constant = torch.where(ss_res > 0, torch.zeros_like(ss_res), torch.ones_like(ss_res))
    return torch.where(ss_tot > 0, 1 - ss_res / ss_tot.clamp_min(1e-300), constant)


def resamples(
    n: int, n_boot: int, seed: int = 0, chunk: int | None = None, device: torch.device | str | None = None
) -> Iterator[Tensor]:
    """Bootstrap resamples of n prompts, as index batches (b, n) of at most `chunk` resamples.

    One generator, the run seed's bootstrap stream (probe/core/seeds.py), draws them in order; the
    draws do not depend on `chunk` (CPU generator), so chunking only bounds memory.
    """
    g = stream_generator(seed, Stream.BOOTSTRAP)
    chunk = chunk or n_boot
    for start in range(0, n_boot, chunk):
        yield torch.randint(0, n, (min(chunk, n_boot - start), n), generator=g).to(device)


def percentile_interval(stacked: Tensor, level: float = 0.90, ignore_nan: bool = False) -> tuple[Tensor, Tensor]:
    """The (1-level)/2 and (1+level)/2 quantiles over dim 0 (the resamples)."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=stacked.dtype, device=stacked.device)
    lo, hi = (torch.nanquantile if ignore_nan else torch.quantile)(stacked, q, dim=0)
    return lo, hi


def bootstrap_mean(
    values: Tensor, n_boot: int = 1000, level: float = 0.90, seed: int = 0, chunk: int = 100
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval of the mean over dim 0 (prompts).

    values (P, ...) -> (lo, hi) each (...), the (1-level)/2 and (1+level)/2 quantiles of the
    means of `n_boot` resamples of the P prompts (level 0.90 gives Garg et al.'s 5%-95% band).
    """
    return percentile_interval(resampled_means(values, n_boot, seed, chunk), level)


def resample_counts(n: int, n_boot: int, seed: int = 0, device: torch.device | str | None = None) -> Tensor:
    """(n_boot, n) float64: how many times each of the n prompts is drawn in each resample of
    `resamples` (the same draws)."""
    counts = torch.zeros(n_boot, n, dtype=torch.float64)
    for idx in resamples(n, n_boot, seed):  # one batch of every resample
        counts.scatter_add_(1, idx, torch.ones(idx.shape, dtype=torch.float64))
    return counts.to(device)


def resampled_means(values: Tensor, n_boot: int = 1000, seed: int = 0, chunk: int = 100) -> Tensor:
    """(n_boot, ...): the mean over dim 0 (prompts) of `values` (P, ...) on each resample of `resamples`,
    as one product of the resamples' prompt counts with the values (in float64, returned in the values'
    dtype; a resample's mean equals the mean of its drawn rows up to summation order). Values with a NaN or an infinity take the
    drawn rows themselves, `chunk` resamples at a time (a count of 0 times NaN would reach every
    resample)."""
    n = values.shape[0]
    if not bool(torch.isfinite(values).all()):
        draws = resamples(n, n_boot, seed, chunk, values.device)
        return torch.cat([values[idx].mean(dim=1) for idx in draws])
    counts = resample_counts(n, n_boot, seed, values.device)
    means = (counts @ values.reshape(n, -1).double()).div_(n).view(n_boot, *values.shape[1:])
    return means.to(values.dtype) if values.is_floating_point() else means


def bootstrap_ratio(
    num: Tensor, den: Tensor, n_boot: int = 1000, level: float = 0.90, seed: int = 0, chunk: int = 100
) -> tuple[Tensor, Tensor, Tensor]:
    """Ratio of sums over prompts, sum(num) / sum(den), with a percentile bootstrap interval.

    num, den (P, ...) -> (ratio, lo, hi) each (...); resamples the P prompts jointly in both.
    Used for patching fractions, where a per-prompt ratio would divide by near-zero changes.
    """
    ratios = [
        num[idx].sum(dim=1) / den[idx].sum(dim=1) for idx in resamples(num.shape[0], n_boot, seed, chunk, num.device)
    ]
    lo, hi = percentile_interval(torch.cat(ratios), level, ignore_nan=True)
    return num.sum(0) / den.sum(0), lo, hi


def bootstrap_r2(
    truth: Tensor, pred: Tensor, n_boot: int = 1000, seed: int = 0, level: float = 0.90, chunk: int | None = None
) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval of r2_score over dim 0 (prompts): (P, ...) -> (lo, hi) each (...)."""
    r2 = [
        r2_score(truth[idx], pred[idx], dim=1) for idx in resamples(truth.shape[0], n_boot, seed, chunk, truth.device)
    ]
    return percentile_interval(torch.cat(r2), level)


def r2_resamples(truth: Tensor, pred: Tensor, n_boot: int = 1000, seed: int = 0) -> Tensor:
    """r2_score over dim -2 (prompts) on every bootstrap resample of the prompts, the same resamples
    for every leading index so that draws are paired: (..., P, J) -> (n_boot, ..., J). Resample
    counts times per-prompt sums (no copy of the data per resample); the resamples are
    `resamples`', so each draw equals r2_score of truth[..., idx, :]."""
    truth, pred = truth.double(), pred.double()
    n = truth.shape[-2]
    (idx,) = resamples(n, n_boot, seed, device=truth.device)
    counts = torch.zeros(n_boot, n, dtype=torch.float64, device=truth.device)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
    sse = torch.einsum("rp,...pj->r...j", counts, (truth - pred) ** 2)
    s1, s2 = torch.einsum("rp,...pj->r...j", counts, truth), torch.einsum("rp,...pj->r...j", counts, truth**2)
    sst = (s2 - s1**2 / n).clamp_min(0)
    constant = torch.where(sse > 0, torch.zeros_like(sse), torch.ones_like(sse))
    return torch.where(sst > 1e-12 * s2.clamp_min(1e-300), 1 - sse / sst.clamp_min(1e-300), constant)
