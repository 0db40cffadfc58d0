"""The probes' heads on a fitted pooling (Akyurek et al. 2023, eq. 22; probe/analysis/probes.py fits the
pooling and the grid): the closed-form ridge head of the linear probe, the MLP probe's
random-feature head beside it (its hidden block's weight chosen by leave-one-out), and the MLP
probe's trained hidden layer where it predicts held-out prompts better (probe/analysis/mlp_head.py).
Arrays carry a leading probe axis G."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..core.seeds import Stream, stream_generator
from .mlp_head import split as mlp_split
from .mlp_head import train_heads
from .pooling import MIN_GAIN, ProbeSet
from .ridge import TwoBlockRidge, choose_penalty, ridge_head, ridge_loo, ridge_penalties


@dataclass
class Head:
    """A fitted head for G probes: features -> standardised targets. kind 'linear': the pooled z;
    'mlp': [z, scale * gelu(((z - z_mean) / z_std) A + c)] with A, c drawn from the seed and the
    hidden block's scale (G, 1, 1) chosen by leave-one-out (0: the linear probe)."""

    kind: str
    weight: Tensor  # (G, F, d)
    feature_mean: Tensor  # (G, 1, F)
    target_mean: Tensor  # (G, 1, d)
    z_mean: Tensor | None = None  # (G, 1, D)
    z_std: Tensor | None = None
    hidden_weight: Tensor | None = None  # (G, D, H): the random layer (the same for every probe) or trained
    hidden_bias: Tensor | None = None  # (G, 1, H)
    hidden_scale: Tensor | None = None  # (G, 1, 1)

    def hidden(self, z: Tensor) -> Tensor:
        assert self.z_mean is not None and self.z_std is not None
        assert self.hidden_weight is not None and self.hidden_bias is not None
        return torch.nn.functional.gelu(((z - self.z_mean) / self.z_std) @ self.hidden_weight + self.hidden_bias)

    def features(self, z: Tensor, hidden: Tensor | None = None) -> Tensor:
        """[z] or [z, scale * hidden(z)]; `hidden` is hidden(z) where the caller has it already."""
        if self.kind == "linear":
            return z
        assert self.hidden_scale is not None
        return torch.cat([z, self.hidden_scale * (self.hidden(z) if hidden is None else hidden)], dim=-1)

    def predict(self, z: Tensor) -> Tensor:
        return (self.features(z) - self.feature_mean) @ self.weight + self.target_mean

    PER_PROBE = (
        "weight",
        "feature_mean",
        "target_mean",
        "z_mean",
        "z_std",
        "hidden_weight",
        "hidden_bias",
        "hidden_scale",
    )

    def rows(self, rows: slice | Tensor) -> Head:
        """The heads of the probes `rows` (a slice or an index)."""
        parts: dict[str, Any] = {
            f: None if getattr(self, f) is None else getattr(self, f)[rows] for f in self.PER_PROBE
        }
        return dataclasses.replace(self, **parts)

    @staticmethod
    def cat(heads: list[Head]) -> Head:
        """The heads of consecutive blocks of probes as one (same kind, width and random layer)."""
        merged: dict[str, Any] = {
            f: None if getattr(heads[0], f) is None else torch.cat([getattr(h, f) for h in heads])
            for f in Head.PER_PROBE
        }
        return dataclasses.replace(heads[0], **merged)

    def where(self, take: Tensor, other: Head) -> Head:
        """Per probe, `other`'s fitted parts where take (G,) is true (same kind, width and random layer)."""
        pick = lambda a, b: None if a is None else torch.where(take.view(-1, *[1] * (a.dim() - 1)), b, a)
        merged: dict[str, Any] = {f: pick(getattr(self, f), getattr(other, f)) for f in self.PER_PROBE}
        return dataclasses.replace(self, **merged)


HIDDEN_SCALES = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)  # hidden block against the linear one: sqrt(penalty ratio); 0 first


def random_layer(width: int, hidden: int, seed: int) -> tuple[Tensor, Tensor]:
    """The MLP probe's hidden layer: A ~ N(0, 1/D) (D x H), c ~ N(0, 1), from `seed`'s probe-features
    stream alone (so a probe fitted alone draws what it would in any grid)."""
    g = stream_generator(seed, Stream.PROBE_FEATURES)
    a = torch.randn(width, hidden, generator=g, dtype=torch.float64) / math.sqrt(width)
    return a, torch.randn(hidden, generator=g, dtype=torch.float64)


HEAD_BLOCK_BYTES = 64 << 20  # the per-probe temporaries (ridge's N x F products) of one block of heads


Chosen = tuple[Tensor, Tensor]  # per probe (G,): the linear head's penalty chosen by leave-one-out, its error


def _chosen_rows(chosen: Chosen | None, rows: slice) -> Chosen | None:
    """The entries of `chosen` for the probes `rows`."""
    return None if chosen is None else (chosen[0][rows], chosen[1][rows])


def fit_head(
    kind: str, z: Tensor, y: Tensor, alphas: Sequence[float], hidden: int, seed: int, chosen: Chosen | None = None
) -> tuple[Head, Tensor, Tensor]:
    """The closed-form head of each probe on pooled features z (G, N, D) and targets y (G, N, d);
    returns it with its penalties (G,) and leave-one-out MSE (G,) (`_fit_heads`; `chosen`: the
    linear penalty and its error on these features, where already known). Fitted a block of
    probes at a time (at most about HEAD_BLOCK_BYTES of temporaries): each probe's head depends on
    its own features only, so the blocks give the batched result."""
    n, width = z.shape[1], z.shape[2]
    per_probe = 8 * n * (4 * (width + (hidden if kind == "mlp" else 0)) + 3 * len(alphas) * y.shape[-1])
    block = max(1, HEAD_BLOCK_BYTES // per_probe)
    if block >= len(z):
        return _fit_heads(kind, z, y, alphas, hidden, seed, chosen)
    blocks = [slice(lo, lo + block) for lo in range(0, len(z), block)]
    parts = [_fit_heads(kind, z[b], y[b], alphas, hidden, seed, _chosen_rows(chosen, b)) for b in blocks]
    heads, penalties, loos = zip(*parts)
    return Head.cat(list(heads)), torch.cat(penalties), torch.cat(loos)


def _fit_heads(
    kind: str, z: Tensor, y: Tensor, alphas: Sequence[float], hidden: int, seed: int, chosen: Chosen | None = None
) -> tuple[Head, Tensor, Tensor]:
    """`fit_head` for one block of probes. The linear head's penalty is
    chosen from `alphas` by leave-one-out; the MLP head keeps that penalty and chooses, the same
    way, how strongly its hidden block enters (HIDDEN_SCALES, after equalising the two blocks'
    mean eigenvalues; the smallest scale within MIN_GAIN of the best leave-one-out R^2): the hidden
    block's own penalty is the linear one / scale^2, and scale 0 is the linear probe, so its
    leave-one-out error is at most MIN_GAIN (in R^2) above the linear probe's."""
    head = Head(kind, torch.empty(0), torch.empty(0), y.mean(1, keepdim=True))
    zc, yc = z - z.mean(1, keepdim=True), y - head.target_mean
    if chosen is None:
        grid = ridge_penalties(zc, alphas)
        choice, loo = choose_penalty(zc, yc, grid)
        penalty = grid.gather(1, choice.unsqueeze(1)).squeeze(1)
    else:
        penalty, loo = chosen
    if kind != "mlp":
        head.feature_mean, head.weight = z.mean(1, keepdim=True), ridge_head(zc, yc, penalty)
        return head, penalty, loo
    head.z_mean, head.z_std = z.mean(1, keepdim=True), z.std(1, keepdim=True).nan_to_num(1.0).clamp_min(1e-12)
    a, c = (v.to(z.device) for v in random_layer(z.shape[-1], hidden, seed))
    head.hidden_weight, head.hidden_bias = a.expand(len(z), -1, -1), c.view(1, 1, -1).expand(len(z), 1, -1)
    h = head.hidden(z)
    h_mean = h.mean(1, keepdim=True)
    hc = h - h_mean
    balance = (ridge_penalties(zc, (1.0,)) / ridge_penalties(hc, (1.0,))).sqrt().view(-1, 1, 1)
    # [zc, c hc] at penalty lam is [zc, hc] at penalty lam on zc and lam / c^2 on hc
    scales = torch.tensor(HIDDEN_SCALES[1:], dtype=z.dtype, device=z.device)
    hidden_penalties = penalty.unsqueeze(-1) / (scales * balance.view(-1, 1)) ** 2  # (G, S)
    two_blocks = TwoBlockRidge(zc, hc, yc, penalty)
    loos = torch.cat([loo.unsqueeze(-1), two_blocks.loo(hidden_penalties)], 1)
    # the smallest scale within MIN_GAIN of the best leave-one-out R^2: near-ties (nothing to decode)
    # choose the simpler probe, so that round-off in the pooling cannot flip the choice
    within = loos <= loos.min(1, keepdim=True).values + MIN_GAIN * yc.pow(2).mean((1, 2)).unsqueeze(1)
    best = within.long().argmax(1)
    loo = loos.gather(1, best.unsqueeze(1)).squeeze(1)
    scale = torch.tensor(HIDDEN_SCALES, dtype=torch.float64, device=z.device)[best].view(-1, 1, 1) * balance
    head.hidden_scale = scale
    use_hidden = best > 0
    w_z, w_h = two_blocks.coef(hidden_penalties.gather(1, (best - 1).clamp_min(0).unsqueeze(1)).squeeze(1), use_hidden)
    # the hidden block enters as scale * hc, so its weights are W_h / scale (none where scale is 0)
    w_h = torch.where(use_hidden.view(-1, 1, 1), w_h / torch.where(use_hidden.view(-1, 1, 1), scale, 1.0), 0.0)
    head.feature_mean = torch.cat([head.z_mean, scale * h_mean], -1)
    head.weight = torch.cat([w_z, w_h], 1)
    return head, penalty, loo


def fit_probe_head(
    kind: str,
    probes: ProbeSet,
    scores: Tensor,
    alphas: Sequence[float],
    hidden: int,
    seed: int,
    linear: Chosen | None = None,
    uniform_linear: Chosen | None = None,
) -> tuple[Head, Tensor, Tensor, Tensor]:
    """The head of each probe of `probes` on its pooling: (head, penalty, leave-one-out MSE, the
    pooling weights alpha (G, P) it reads). The MLP probe pools with the linear probe's weights or
    uniformly, whichever leaves the smaller leave-one-out error by MIN_GAIN (in R^2): where the
    linear probe decodes nothing its pooling is arbitrary, and uniform pooling keeps every token.
    `linear` and `uniform_linear`: the linear penalty and its error at `scores`' pooling and at
    uniform pooling, where already chosen (the linear head's, `PoolingFit.uniform_penalty`): the
    MLP head starts from them instead of choosing again (the same numbers)."""
    every = torch.arange(len(probes.layer), device=scores.device)
    alpha = probes.attention(scores, every)
    y = probes.yc
    head, penalty, loo = _heads_by_block(kind, probes, alpha, alphas, hidden, seed, linear)
    if kind != "mlp":
        return head, penalty, loo, alpha
    uniform = probes.attention(torch.zeros_like(scores), every)
    other, other_penalty, other_loo = _heads_by_block(kind, probes, uniform, alphas, hidden, seed, uniform_linear)
    take = other_loo < loo - MIN_GAIN * y.pow(2).mean((1, 2))
    alpha = torch.where(take.unsqueeze(-1), uniform, alpha)
    return head.where(take, other), torch.where(take, other_penalty, penalty), torch.minimum(loo, other_loo), alpha


@dataclass
class HeadFit:
    """Per MLP probe (G,): whether its head is the trained network (`train_mlp_heads`; else the
    random-feature head, which predicted the held-out share as well), and the trained fit's weight
    decay, L-BFGS iterations, final |grad|_inf and whether it met the stopping rule."""

    trained: Tensor
    decay: Tensor
    iterations: Tensor
    grad_norm: Tensor
    converged: Tensor

    def take(self, index: Tensor) -> HeadFit:
        return HeadFit(*(getattr(self, f.name)[index] for f in dataclasses.fields(HeadFit)))

    @staticmethod
    def cat(parts: list[HeadFit]) -> HeadFit:
        return HeadFit(*(torch.cat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(HeadFit)))


def train_mlp_heads(
    probes: ProbeSet,
    alpha: Tensor,
    head: Head,
    penalty: Tensor,
    loo: Tensor,
    alphas: Sequence[float],
    seed: int,
    *,
    gtol: float,
    ftol: float,
    max_iter: int,
) -> tuple[Head, Tensor, HeadFit]:
    """The MLP probes' heads trained as two-layer networks on their pooling alpha (G, P)
    (probe/analysis/mlp_head.py), kept per probe where the trained head predicts the validation
    share of the training prompts better (by MIN_GAIN in R^2) than the random-feature head `head`
    refitted without it; elsewhere `head`. Returns (heads, leave-one-out MSE of each head's output
    layer, HeadFit). A block of whole layers' probes at a time (`ProbeSet.pooled_blocks`)."""
    parts = [
        _train_block(z, probes.yc[rows], head.rows(rows), penalty[rows], loo[rows], alphas, seed, gtol, ftol, max_iter)
        for rows, z in probes.pooled_blocks(lambda rows: alpha[rows])
    ]
    heads, loos, fits = zip(*parts)
    return Head.cat(list(heads)), torch.cat(loos), HeadFit.cat(list(fits))


def _train_block(z, yc, rf: Head, penalty, rf_loo, alphas, seed, gtol, ftol, max_iter) -> tuple[Head, Tensor, HeadFit]:
    """`train_mlp_heads` for one block of probes: z (k, N, D) pooled, yc (k, N, d) centred."""
    assert rf.z_mean is not None and rf.z_std is not None and rf.hidden_weight is not None
    assert rf.hidden_bias is not None
    zs = (z - rf.z_mean) / rf.z_std
    first = (rf.hidden_weight[0].cpu(), rf.hidden_bias[0, 0].cpu())
    fit_rows, val_rows = mlp_split(z.shape[1], seed, z.device)
    baseline, _, _ = fit_head("mlp", z[:, fit_rows], yc[:, fit_rows], alphas, first[0].shape[1], seed)
    baseline_val = (baseline.predict(z[:, val_rows]) - yc[:, val_rows]).pow(2).mean((1, 2))
    margin = MIN_GAIN * yc.pow(2).mean((1, 2))
    fitted = train_heads(z, zs, yc, penalty, first, seed, baseline_val, margin, gtol=gtol, ftol=ftol, max_iter=max_iter)
    trained = Head("mlp", torch.empty(0), torch.empty(0), yc.mean(1, keepdim=True), rf.z_mean, rf.z_std)
    trained.hidden_weight, trained.hidden_bias = fitted.hidden_weight, fitted.hidden_bias
    trained.hidden_scale = torch.ones_like(rf.z_mean[..., :1])
    features = trained.features(z)
    trained.feature_mean = features.mean(1, keepdim=True)
    fc, ycc = features - trained.feature_mean, yc - trained.target_mean
    trained.weight = ridge_head(fc, ycc, penalty)
    trained_loo = ridge_loo(fc, ycc, penalty.unsqueeze(1))[:, 0]
    take = fitted.better
    fit = HeadFit(take, fitted.decay, fitted.iterations, fitted.grad_norm, fitted.converged)
    return rf.where(take, trained), torch.where(take, trained_loo, rf_loo), fit


def _heads_by_block(
    kind: str,
    probes: ProbeSet,
    alpha: Tensor,
    alphas: Sequence[float],
    hidden: int,
    seed: int,
    chosen: Chosen | None = None,
) -> tuple[Head, Tensor, Tensor]:
    """`fit_head` on the probes' states pooled with alpha (G, P), for blocks of whole layers'
    probes (`ProbeSet.pooled_blocks`): the pooled states of every probe are never held at once, and
    each probe's head is its own, so the numbers are those of one block."""
    parts = [
        fit_head(kind, z, probes.yc[rows], alphas, hidden, seed, _chosen_rows(chosen, rows))
        for rows, z in probes.pooled_blocks(lambda rows: alpha[rows])
    ]
    heads, penalties, loos = zip(*parts)
    return Head.cat(list(heads)), torch.cat(penalties), torch.cat(loos)
