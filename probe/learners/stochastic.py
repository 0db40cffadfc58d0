"""Minibatch SGD and Adam on the prefix examples (seed 000 eq. 9, 12-15), seeded.

At every step each prefix t draws a minibatch of `batch_size` indices uniformly with
replacement from its first t examples (the same draws for every step size), and takes a step
on the squared loss l(w.x, y) = (w.x - y)^2 / 2 averaged over the minibatch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .base import LearnerResult, as_float64, linear_result
from .registry import register

STOCHASTIC_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128)


def minibatch_indices(n: int, batch: int, steps: int, batch_size: int, seed: int, device) -> Tensor:
    """(steps, B, n, m) indices: for prefix t, uniform over 0..t-1 (0 when t = 0, masked later)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(steps, batch, n, batch_size, generator=g, dtype=torch.float64)
    t = torch.arange(n, dtype=torch.float64).view(1, 1, n, 1)
    return (u * t).floor().long().to(device)


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


def _check(steps: Sequence[int], batch_size: Sequence[int], eta: Sequence[float], name: str) -> None:
    if any(int(k) < 0 for k in steps) or any(int(m) < 1 for m in batch_size) or any(e <= 0 for e in eta):
        raise ValueError(f"{name}: steps must be >= 0, batch sizes >= 1 and step sizes > 0")


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
) -> LearnerResult:
    """Shared loop: for each batch size, iterate `update(w, g, state, k) -> (w, state)` from w = 0
    over the same seeded minibatches for every step size, keeping the requested step counts."""
    _check(steps, batch_size, eta, name)
    xs, ys, queries = as_float64(xs, ys, queries)
    b, n, d = xs.shape
    etas = torch.tensor(list(eta), dtype=xs.dtype, device=xs.device).view(-1, 1, 1, 1)
    grid, weights = [], []
    for m in batch_size:
        idx = minibatch_indices(n, b, max(steps, default=0), int(m), seed, xs.device)
        w = xs.new_zeros(len(eta), b, n, d)
        state: dict = {"eta": etas}
        snaps = {0: w}
        for k in range(max(steps, default=0)):
            w, state = update(w, minibatch_gradient(w, xs, ys, idx[k]), state, k)
            snaps[k + 1] = w
        for k in steps:
            for e_i, e in enumerate(eta):
                weights.append(snaps[int(k)][e_i])
                grid.append({"eta": float(e), "batch_size": int(m), "steps": int(k)})
    return linear_result(name, grid, torch.stack(weights), xs, queries)


@register("sgd")
def sgd(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    eta: Sequence[float] = (0.01, 0.03, 0.1),
    batch_size: Sequence[int] = (1, 4),
    steps: Sequence[int] = STOCHASTIC_STEPS,
    seed: int = 0,
) -> LearnerResult:
    """Minibatch SGD (seed 000 eq. 9): w <- w - eta * mean over the batch of (w.x - y) x, from w = 0."""

    def update(w, g, state, k):
        return w - state["eta"] * g, state

    return _run_minibatch("sgd", xs, ys, queries, eta, batch_size, steps, seed, update)


@register("adam")
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
) -> LearnerResult:
    """Adam (seed 000 eq. 12-15) on minibatch gradients, from w = 0:

    m <- b1 m + (1-b1) g,  v <- b2 v + (1-b2) g^2,
    w <- w - eta (m/(1-b1^l)) / sqrt(v/(1-b2^l) + eps)        ("paper": eps inside the root)
    w <- w - eta (m/(1-b1^l)) / (sqrt(v/(1-b2^l)) + eps)      ("torch": torch.optim.Adam)
    """
    if eps_placement not in ("paper", "torch"):
        raise ValueError(f"adam eps_placement must be 'paper' or 'torch', got {eps_placement!r}")

    def update(w, g, state, k):
        m = beta1 * state.get("m", torch.zeros_like(w)) + (1 - beta1) * g
        v = beta2 * state.get("v", torch.zeros_like(w)) + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1 ** (k + 1)), v / (1 - beta2 ** (k + 1))
        denom = (v_hat + eps).sqrt() if eps_placement == "paper" else v_hat.sqrt() + eps
        return w - state["eta"] * m_hat / denom, {**state, "m": m, "v": v}

    return _run_minibatch("adam", xs, ys, queries, eta, batch_size, steps, seed, update)
