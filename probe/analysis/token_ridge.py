"""The token probes' ridge regressions (probe/analysis/token_probes.py): per layer boundary and
token kind, ridge probes of the layer's features for every target, the penalty chosen by exact
leave-one-out, fitted on the training streams and scored on the test streams a block of layers
at a time (`LayerFeatures`), each block's features factored once for every target (`RidgeBasis`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..capture.streams import LayerStreams
from ..core.allocator import release_free_memory
from .ridge import RidgeBasis, loo_block, ridge_penalties
from .stats import resamples

ALPHAS = (1e-8, 1e-6, 1e-4, 1e-2, 1.0)  # ridge penalties, fractions of the mean eigenvalue


@dataclass(frozen=True)
class LayerFeatures:
    """A token kind's probe features (K, N, J, F), built a block of layers at a time from `source`
    (K first) by `build`: every layer's float64 features at once are GBs at paper scale."""

    source: Tensor | LayerStreams  # (K, ...) sliced by a block of layers
    build: Callable[[Tensor], Tensor]
    shape: tuple[int, int, int, int]

    def block(self, rows: slice) -> Tensor:
        return self.build(self.source[rows])


@dataclass(frozen=True)
class RidgeHeads:
    """One target's ridge probes at every layer: coefficients (K, F, d), the features' training means
    (K, 1, F), the target's (1, 1, d), and the penalty each probe chose by leave-one-out (K,)."""

    coef: Tensor
    f_mean: Tensor
    y_mean: Tensor
    chosen: Tensor


def ridge_fit(f_train: LayerFeatures, y_trains: list[Tensor]) -> list[RidgeHeads]:
    """Ridge probes of K feature sets (K, N, J, F) for each target (N, J, d) of `y_trains`, the
    penalty chosen by exact leave-one-out (`ridge_fit_kinds` of one feature set)."""
    return ridge_fit_kinds([(f_train, y_trains)])[0]


def ridge_fit_kinds(kinds: list[tuple[LayerFeatures, list[Tensor]]]) -> list[list[RidgeHeads]]:
    """`ridge_fit` of several feature sets of the same layers (the token kinds), a block of layers
    at a time, every set reading a block before the next: each block's features are built and
    factored once for all targets (probe/analysis/ridge.py `RidgeBasis`): a target costs its own
    projections, not a factorisation, and only one block's features are held (each probe's numbers
    are its own, so the blocks give the batched result)."""
    k = kinds[0][0].shape[0]
    # per feature set: its centred targets with their means, then per block its features' means and
    # per target its coefficients and chosen penalties
    parts: list[tuple[list[tuple[Tensor, Tensor]], list[Tensor], list[list[Tensor]], list[list[Tensor]]]] = []
    for f_train, y_trains in kinds:
        _, n_train, j, width = f_train.shape
        centred = []  # each target once, seen by every probe as a view (k copies of 11 targets would be GBs)
        for y_train in y_trains:
            y = y_train.reshape(1, n_train * j, -1)
            y_mean = y.mean(1, keepdim=True)
            centred.append((y - y_mean, y_mean))
        parts.append((centred, [], [[] for _ in y_trains], [[] for _ in y_trains]))  # + f_means, coefs, chosen
    block = min(
        loo_block(f.shape[1] * f.shape[2], f.shape[3], len(ALPHAS), max(y.shape[-1] for y, _ in part[0]))
        for (f, _), part in zip(kinds, parts)
    )
    for lo in range(0, k, block):
        for (f_train, _), (centred, f_means, coefs, chosen) in zip(kinds, parts):
            _, n_train, j, width = f_train.shape
            fc = f_train.block(slice(lo, lo + block)).reshape(-1, n_train * j, width)
            f_mean = fc.mean(1, keepdim=True)
            fc = fc - f_mean
            penalties = ridge_penalties(fc, ALPHAS)
            basis = RidgeBasis(fc)
            del fc
            f_means.append(f_mean)
            for (yc, _), coef, pens in zip(centred, coefs, chosen):
                yb = yc.expand(len(penalties), -1, -1)
                best = basis.loo(yb, penalties).argmin(-1)
                pen = penalties.gather(1, best.unsqueeze(1)).squeeze(1)
                coef.append(basis.head(yb, pen))
                pens.append(pen)
            del basis
        # each block's temporaries (~130 MB at paper scale) were otherwise kept by glibc under the raised
        # trim threshold (probe/core/allocator.py) and not reused: 1.9 GB more resident over 13 layers
        release_free_memory()
    return [
        [
            RidgeHeads(torch.cat(c), torch.cat(f_means), y_mean, torch.cat(p))
            for c, p, (_, y_mean) in zip(coefs, chosen, centred)
        ]
        for centred, f_means, coefs, chosen in parts
    ]


def ridge_score(
    f_test: LayerFeatures, heads: list[RidgeHeads], y_tests: list[Tensor], n_boot: int, seed: int
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Each target's heads (sharing one set of features) on the test features (`ridge_score_kinds`
    of one feature set)."""
    return ridge_score_kinds([(f_test, heads, y_tests)], n_boot, seed)[0]


def ridge_score_kinds(
    kinds: list[tuple[LayerFeatures, list[RidgeHeads], list[Tensor]]], n_boot: int, seed: int
) -> list[list[tuple[Tensor, Tensor, Tensor]]]:
    """Per feature set of the same layers, each target's heads on its test features, a block of
    layers at a time (every set reading a block before the next): held-out R^2 (K,), its resamples
    over test prompts (K, n_boot), and the penalties chosen."""
    k = kinds[0][0].shape[0]
    outs, prepared = [], []
    for f_test, heads, y_tests in kinds:
        n_test = f_test.shape[1]
        draws_idx = list(resamples(n_test, n_boot, seed, 100))
        sst = [(y - h.y_mean.unsqueeze(1)).pow(2).sum((2, 3)) for h, y in zip(heads, y_tests)]  # per test prompt
        outs.append([(torch.empty(k, dtype=torch.float64), torch.empty(k, n_boot, dtype=torch.float64)) for _ in heads])
        prepared.append((draws_idx, sst))
    block = min(
        loo_block(f.shape[1] * f.shape[2], f.shape[3], len(ALPHAS), max(y.shape[-1] for y in y_tests))
        for f, _, y_tests in kinds
    )
    for lo in range(0, k, block):
        rows = slice(lo, min(lo + block, k))
        for (f_test, heads, y_tests), (draws_idx, sst), out in zip(kinds, prepared, outs):
            ft = f_test.block(rows) - heads[0].f_mean[rows].unsqueeze(1)  # (b, N_test, J, F)
            for h, y_test, s, (r2, draws) in zip(heads, y_tests, sst, out):
                pred = ft @ h.coef[rows].unsqueeze(1) + h.y_mean.unsqueeze(1)  # (b, N_test, J, d)
                sse = (pred - y_test).pow(2).sum((2, 3))  # (b, N_test): per prompt, so prompts resample
                sst_b = s.expand_as(sse)
                r2[rows] = (1 - sse.sum(1) / sst_b.sum(1)).cpu()
                draws[rows] = torch.cat([1 - sse[:, idx].sum(-1) / sst_b[:, idx].sum(-1) for idx in draws_idx], 1).cpu()
    return [
        [(r2, draws, h.chosen.cpu()) for (r2, draws), h in zip(out, heads)] for out, (_, heads, _) in zip(outs, kinds)
    ]
