"""Bootstrap intervals shared by evaluation and the similarity metrics."""

from __future__ import annotations

import torch
from torch import Tensor


def bootstrap_mean(values: Tensor, n_boot: int = 1000, level: float = 0.90, seed: int = 0,
                   chunk: int = 100) -> tuple[Tensor, Tensor]:
    """Percentile bootstrap interval of the mean over dim 0 (prompts).

    values (P, ...) -> (lo, hi) each (...), the (1-level)/2 and (1+level)/2 quantiles of the
    means of `n_boot` resamples of the P prompts (level 0.90 gives Garg et al.'s 5%-95% band).
    """
    p = values.shape[0]
    g = torch.Generator().manual_seed(seed)
    means = []
    for start in range(0, n_boot, chunk):
        idx = torch.randint(0, p, (min(chunk, n_boot - start), p), generator=g).to(values.device)
        means.append(values[idx].mean(dim=1))
    stacked = torch.cat(means)  # (n_boot, ...)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=stacked.dtype, device=stacked.device)
    lo, hi = torch.quantile(stacked, q, dim=0)
    return lo, hi


def bootstrap_ratio(num: Tensor, den: Tensor, n_boot: int = 1000, level: float = 0.90, seed: int = 0,
                    chunk: int = 100) -> tuple[Tensor, Tensor, Tensor]:
    """Ratio of sums over prompts, sum(num) / sum(den), with a percentile bootstrap interval.

    num, den (P, ...) -> (ratio, lo, hi) each (...); resamples the P prompts jointly in both.
    Used for patching fractions, where a per-prompt ratio would divide by near-zero changes.
    """
    p = num.shape[0]
    g = torch.Generator().manual_seed(seed)
    ratios = []
    for start in range(0, n_boot, chunk):
        idx = torch.randint(0, p, (min(chunk, n_boot - start), p), generator=g).to(num.device)
        ratios.append(num[idx].sum(dim=1) / den[idx].sum(dim=1))
    stacked = torch.cat(ratios)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=stacked.dtype, device=stacked.device)
    lo, hi = torch.nanquantile(stacked, q, dim=0)
    return num.sum(0) / den.sum(0), lo, hi
