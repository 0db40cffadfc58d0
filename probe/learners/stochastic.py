"""Minibatch SGD and Adam on the prefix examples (Hataya & Imaizumi 2024, eq. 9, 12-15), seeded.

At every step each prefix t takes a step on the squared loss l(w.x, y) = (w.x - y)^2 / 2
averaged over a minibatch of its first t examples (the same minibatches for every step size).
Minibatches are drawn in one of two ways:

- by default, `batch_size` indices uniformly with replacement, fresh for every prompt (`seed`);
- with `masks_seed` (or explicit `masks`), Hataya & Imaizumi 2024's Assumption 1: 0/1 masks b[l, t, i] that
  pick min(K, t) distinct examples of prefix t at step l, the same for every prompt. These are
  the masks a planted SGD / Adam model of that seed holds (probe/models/constructions/sgd.py), so the
  learner replays the model's randomness exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.validate import POSITIVE
from .base import LearnerResult, as_float64, linear_result
from .registry import register

STOCHASTIC_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


def minibatch_indices(n: int, batch: int, steps: int, batch_size: int, seed: int, device) -> Tensor:
    """(steps, B, n, m) indices: for prefix t, uniform over 0..t-1 (0 when t = 0, masked later)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(steps, batch, n, batch_size, generator=g, dtype=torch.float64)
    t = torch.arange(n, dtype=torch.float64).view(1, 1, n, 1)
    return (u * t).floor().long().to(device)


def minibatch_masks(steps: int, n: int, batch_size: int, seed: int) -> Tensor:
    """(steps, n, n) 0/1 masks (Hataya & Imaizumi 2024, Assumption 1): masks[l, t, i] = 1 when example i is in
    prefix t's minibatch at step l; min(batch_size, t) distinct examples among the first t.

    Entry (l, t) depends only on (seed, l, t, batch_size), so any number of steps or points
    gives the same minibatches as the planted model that was built with more."""
    out = torch.zeros(steps, n, n, dtype=torch.float64)
    for l in range(steps):
        for t in range(1, n):
            g = torch.Generator().manual_seed(((seed * 100_003 + l) * 65_537 + t) % 2**63)
            out[l, t, torch.randperm(t, generator=g)[:batch_size]] = 1.0
    return out


def check_masks(masks: Tensor, steps: int, n: int) -> Tensor:
    """Explicit masks as (>= steps, n, n) 0/1 float64, each step's batch within its prefix."""
    masks = torch.as_tensor(masks, dtype=torch.float64)
    if masks.ndim != 3 or masks.shape[0] < steps or masks.shape[1:] != (n, n):
        raise ConfigError(
            f"masks must have shape (steps >= {steps}, n={n}, n={n}) (masks[l, t, i] = 1: example i in prefix t's "
            f"minibatch at step l), got {tuple(masks.shape)}"
        )
    if not bool(((masks == 0) | (masks == 1)).all()) or bool(masks.triu().any()):
        raise ConfigError("masks must hold 0 or 1, with masks[l, t, i] = 0 for i >= t (only seen examples)")
    return masks


def masked_gradient(w: Tensor, xs: Tensor, ys: Tensor, mask: Tensor) -> Tensor:
    """g = (1/|B_t|) sum_i mask[t, i] (w.x_i - y_i) x_i for w (E, B, n, d), mask (n, n) -> (E, B, n, d)."""
    resid = torch.einsum("ebtd,bid->ebti", w, xs) - ys.unsqueeze(1)  # residual of example i under prefix t's w
    count = mask.sum(-1).clamp_min(1).view(1, 1, -1, 1)
    return torch.einsum("ebti,ti,bid->ebtd", resid, mask, xs) / count


def minibatch_gradient(w: Tensor, xs: Tensor, ys: Tensor, idx: Tensor) -> Tensor:
    """g = (1/m) sum_{i in batch} (w.x_i - y_i) x_i for w (E, B, n, d), idx (B, n, m) -> (E, B, n, d)."""
    b, n, m = idx.shape
    xb = torch.gather(
        xs.unsqueeze(1).expand(b, n, n, xs.shape[-1]), 2, idx.unsqueeze(-1).expand(b, n, m, xs.shape[-1])
    )  # (B, n, m, d)
    yb = torch.gather(ys.unsqueeze(1).expand(b, n, n), 2, idx)  # (B, n, m)
    resid = torch.einsum("ebnd,bnmd->ebnm", w, xb) - yb
    g = torch.einsum("ebnm,bnmd->ebnd", resid, xb) / m
    seen = (torch.arange(n, device=xs.device) > 0).view(1, 1, n, 1)
    return g * seen  # no example, no step


def _run_minibatch(
    name: str,
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None,
    eta: Sequence[float],
    batch_size: Sequence[int],
    steps: Sequence[int],
    seed: int,
    update,
    masks_seed: int | None = None,
    masks: Tensor | None = None,
) -> LearnerResult:
    """Shared loop: for each batch size, iterate `update(w, g, state, k) -> (w, state)` from w = 0
    over the same minibatches for every step size, keeping the requested step counts."""
    xs, ys, queries = as_float64(xs, ys, queries)
    b, n, d = xs.shape
    last = max(steps, default=0)
    if masks is not None:
        masks = check_masks(masks, last, n).to(xs.device)
        batch_size = [int(masks[0].sum(-1).max()) if last else 1]  # the masks fix the batch
    etas = torch.tensor(list(eta), dtype=xs.dtype, device=xs.device).view(-1, 1, 1, 1)
    grid, weights = [], []
    for m in batch_size:
        shared = masks_seed is not None or masks is not None
        if shared:
            draws = masks if masks is not None else minibatch_masks(last, n, int(m), int(masks_seed or 0)).to(xs.device)
        else:
            draws = minibatch_indices(n, b, last, int(m), seed, xs.device)
        w = xs.new_zeros(len(eta), b, n, d)
        state: dict = {"eta": etas}
        snaps = {0: w}
        for k in range(last):
            g = masked_gradient(w, xs, ys, draws[k]) if shared else minibatch_gradient(w, xs, ys, draws[k])
            w, state = update(w, g, state, k)
            snaps[k + 1] = w
        for k in steps:
            for e_i, e in enumerate(eta):
                weights.append(snaps[int(k)][e_i])
                grid.append({"eta": float(e), "batch_size": int(m), "steps": int(k)})
    return linear_result(name, grid, torch.stack(weights), xs, queries)


@register("sgd", label="SGD", unit="steps", rules={"eta": POSITIVE})
def sgd(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    eta: Sequence[float] = (0.01, 0.03, 0.1),
    batch_size: Sequence[int] = (1, 4),
    steps: Sequence[int] = STOCHASTIC_STEPS,
    seed: int = 0,
    masks_seed: int | None = None,
    masks: Tensor | None = None,
) -> LearnerResult:
    """Minibatch SGD (Hataya & Imaizumi 2024, eq. 9): w <- w - eta * mean over the batch of (w.x - y) x, from w = 0.
    `masks_seed` / `masks`: Assumption 1's shared masks (module docstring) instead of `seed`'s draws."""

    def update(w, g, state, k):
        return w - state["eta"] * g, state

    return _run_minibatch("sgd", xs, ys, queries, eta, batch_size, steps, seed, update, masks_seed, masks)


@register("adam", label="Adam", unit="steps", rules={"eta": POSITIVE})
def adam(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    eta: Sequence[float] = (0.01, 0.03, 0.1),
    batch_size: Sequence[int] = (4,),
    steps: Sequence[int] = STOCHASTIC_STEPS,
    seed: int = 0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    eps_placement: str = "paper",
    masks_seed: int | None = None,
    masks: Tensor | None = None,
) -> LearnerResult:
    """Adam (Hataya & Imaizumi 2024, eq. 12-15) on minibatch gradients, from w = 0:

    m <- b1 m + (1-b1) g,  v <- b2 v + (1-b2) g^2,
    w <- w - eta (m/(1-b1^l)) / sqrt(v/(1-b2^l) + eps)        ("paper": eps inside the root)
    w <- w - eta (m/(1-b1^l)) / (sqrt(v/(1-b2^l)) + eps)      ("torch": torch.optim.Adam)
    """

    def update(w, g, state, k):
        m = beta1 * state.get("m", torch.zeros_like(w)) + (1 - beta1) * g
        v = beta2 * state.get("v", torch.zeros_like(w)) + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1 ** (k + 1)), v / (1 - beta2 ** (k + 1))
        denom = (v_hat + eps).sqrt() if eps_placement == "paper" else v_hat.sqrt() + eps
        return w - state["eta"] * m_hat / denom, {**state, "m": m, "v": v}

    return _run_minibatch("adam", xs, ys, queries, eta, batch_size, steps, seed, update, masks_seed, masks)
