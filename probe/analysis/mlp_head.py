"""The MLP probe's head trained as a two-layer network (Akyurek et al. 2023, §5, App. C.8: a probe that finds
what a layer encodes nonlinearly), to a stationary point.

On pooled features z (G, N, D) (the pooling fixed, as chosen for the probe), standardised per
feature as z~, each probe's head is

    y ~ [z, gelu(z~ A + c)] W + b          A (D, H), c (H,): trained; W, b: eliminated

The output layer is eliminated by variable projection (as the pooling is, probe/analysis/pooling.py):
for hidden parameters theta = (A, c) the best W is the ridge solution at the linear probe's
penalty lam, and

    f(theta) = (|Yc - Fc W*|^2 + lam |W*|^2) / (N d) + decay (|A|_F^2 + |c|^2) / H

is smooth in theta with gradient the partial one at W* (envelope theorem). Batched L-BFGS
(probe/analysis/lbfgs.py) minimises it from the random-feature layer the probe had (`random_layer`)
and from RESTARTS - 1 other draws, for every weight decay in DECAYS at once, on all but a
VALIDATION share of the training prompts (at most SELECT_ITER iterations each); per probe the
(decay, start) with the least validation error is refitted on all training prompts from where it
stopped, to the stopping rule or `max_iter`. `train_heads` returns those fits
with their validation errors, so the caller keeps the trained head only where it predicts the
held-out share better.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.seeds import Stream, stream_generator
from .lbfgs import minimize
from .ridge import ridge_head

DECAYS = (1e-3, 1e-2)  # weight decay on the hidden layer, per hidden unit (module docstring)
RESTARTS = 2  # the random-feature layer, and one other draw
VALIDATION = 0.2  # share of the training prompts that chooses the decay and start
SELECT_ITER = 100  # the most L-BFGS iterations of the choosing fits (the chosen one then runs to the stopping rule)


@dataclass
class TrainedHeads:
    """Per probe (G,): whether the trained head predicts the validation share better than the
    baseline by the margin (`better`); where it does, the hidden layer A (G, D, H), c (G, 1, H)
    refitted on all prompts (elsewhere the first start's, unused); the validation MSE of the chosen
    (decay, start); the chosen decay; L-BFGS iterations (choosing and refitting fits together),
    the last fit's |grad|_inf and whether it met the stopping rule (the refit where `better`)."""

    better: Tensor
    hidden_weight: Tensor
    hidden_bias: Tensor
    val_mse: Tensor
    decay: Tensor
    iterations: Tensor
    grad_norm: Tensor
    converged: Tensor


def split(n: int, seed: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(fit, validation) prompt indices: a VALIDATION share drawn from `seed`'s probe-split stream."""
    order = torch.randperm(n, generator=stream_generator(seed, Stream.PROBE_SPLIT)).to(device)
    cut = max(1, round(VALIDATION * n))
    return order[cut:], order[:cut]


def starts(width: int, hidden: int, seed: int, first: tuple[Tensor, Tensor]) -> list[tuple[Tensor, Tensor]]:
    """The RESTARTS starting layers: `first` (the probe's random-feature layer), then draws with
    A ~ N(0, 1/D), c ~ N(0, 1) from the probe-restart stream."""
    g = stream_generator(seed, Stream.PROBE_RESTARTS)
    out = [first]
    for _ in range(RESTARTS - 1):
        a = torch.randn(width, hidden, generator=g, dtype=torch.float64) / width**0.5
        out.append((a, torch.randn(hidden, generator=g, dtype=torch.float64)))
    return out


class _Objective:
    """f(theta) of the module docstring for a batch of problems (probe x decay x start), each with
    its own features zs (k, N, D) standardised, z (k, N, D), targets yc (k, N, d), penalty lam (k,)
    and decay (k,); theta flattened per problem as [A (D H), c (H)]."""

    def __init__(self, zs: Tensor, z: Tensor, yc: Tensor, penalty: Tensor, decay: Tensor, hidden: int):
        self.zs, self.z, self.yc, self.penalty, self.decay, self.hidden = zs, z, yc, penalty, decay, hidden

    def unpack(self, theta: Tensor) -> tuple[Tensor, Tensor]:
        width = self.zs.shape[-1]
        a = theta[:, : width * self.hidden].view(-1, width, self.hidden)
        return a, theta[:, width * self.hidden :].view(-1, 1, self.hidden)

    def features(self, theta: Tensor, index: Tensor, rows: Tensor | None = None) -> Tensor:
        """[z, gelu(z~ A + c)] for the problems `index` (prompts `rows`, default all)."""
        zs, z = self.zs[index], self.z[index]
        if rows is not None:
            zs, z = zs[:, rows], z[:, rows]
        a, c = self.unpack(theta)
        return torch.cat([z, torch.nn.functional.gelu(zs @ a + c)], -1)

    def __call__(self, theta: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
        theta = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.features(theta, index)
            fc = f - f.mean(1, keepdim=True)
            yc, lam = self.yc[index], self.penalty[index]
            w = ridge_head(fc.detach(), yc, lam)  # W*: its own gradient term vanishes (envelope theorem)
            n, d = yc.shape[1], yc.shape[2]
            fit = ((yc - fc @ w).pow(2).sum((1, 2)) + lam * w.pow(2).sum((1, 2))) / (n * d)
            value = fit + self.decay[index] * theta.pow(2).sum(-1) / self.hidden
            (grad,) = torch.autograd.grad(value.sum(), theta)
        return value.detach(), grad

    def val_mse(self, theta: Tensor, fit_rows: Tensor, val_rows: Tensor) -> Tensor:
        """(k,) mean squared error on the validation prompts of W fitted on the fit prompts."""
        every = torch.arange(len(theta), device=theta.device)
        f_fit, f_val = self.features(theta, every, fit_rows), self.features(theta, every, val_rows)
        y_fit, y_val = self.yc[:, fit_rows], self.yc[:, val_rows]
        f_mean, y_mean = f_fit.mean(1, keepdim=True), y_fit.mean(1, keepdim=True)
        w = ridge_head(f_fit - f_mean, y_fit - y_mean, self.penalty)
        return ((f_val - f_mean) @ w + y_mean - y_val).pow(2).mean((1, 2))


def train_heads(
    z: Tensor,
    zs: Tensor,
    yc: Tensor,
    penalty: Tensor,
    first: tuple[Tensor, Tensor],
    seed: int,
    baseline_val: Tensor,
    margin: Tensor,
    *,
    gtol: float,
    ftol: float,
    max_iter: int,
) -> TrainedHeads:
    """Train the hidden layer of G probes' MLP heads (module docstring): z (G, N, D) pooled
    features, zs the same standardised, yc (G, N, d) centred targets, penalty (G,) the output
    layer's ridge penalty, `first` the probes' random-feature layer (A (D, H), c (H,)). Only probes
    whose chosen fit's validation MSE is below baseline_val - margin (G,) are refitted on all prompts."""
    g, n, width = z.shape
    hidden = first[0].shape[1]
    begin = [torch.cat([a.reshape(-1), c]).to(z) for a, c in starts(width, hidden, seed, first)]
    decays = torch.tensor(DECAYS, dtype=z.dtype, device=z.device)
    n_dec, n_start = len(DECAYS), len(begin)
    # problems ordered (probe, decay, start)
    rep = n_dec * n_start
    theta0 = torch.stack(begin).repeat(n_dec, 1).repeat(g, 1)
    decay = decays.repeat_interleave(n_start).repeat(g)
    fit_rows, val_rows = split(n, seed, z.device)
    expand = lambda t: t.repeat_interleave(rep, 0)
    on_fit = _Objective(
        expand(zs[:, fit_rows]), expand(z[:, fit_rows]), expand(yc[:, fit_rows]), expand(penalty), decay, hidden
    )
    found = minimize(on_fit, theta0, gtol=gtol, ftol=ftol, max_iter=min(max_iter, SELECT_ITER))
    full = _Objective(expand(zs), expand(z), expand(yc), expand(penalty), decay, hidden)
    val = full.val_mse(found.x, fit_rows, val_rows).view(g, rep)
    best = val.argmin(1)
    best_val = val.gather(1, best.unsqueeze(1)).squeeze(1)
    chosen = torch.arange(g, device=z.device) * rep + best
    better = best_val < baseline_val - margin
    theta, iterations = found.x[chosen].clone(), found.iterations[chosen].clone()
    grad_norm, converged = found.grad_norm[chosen].clone(), found.converged[chosen].clone()
    refit = better.nonzero().squeeze(-1)
    if len(refit):
        objective = _Objective(zs[refit], z[refit], yc[refit], penalty[refit], decay[chosen][refit], hidden)
        final = minimize(objective, theta[refit], gtol=gtol, ftol=ftol, max_iter=max_iter)
        theta[refit], grad_norm[refit], converged[refit] = final.x, final.grad_norm, final.converged
        iterations[refit] += final.iterations
    a, c = full.unpack(theta)
    return TrainedHeads(better, a, c, best_val, decay[chosen], iterations, grad_norm, converged)
