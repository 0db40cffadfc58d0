"""Training an N-layer ReLU network directly on each prompt's examples (Wu et al. 2024, App. G baseline).

One network per (prompt, prefix t), all trained at once as one batched model: parameters carry
leading (B, n) axes, network (b, t) sees only the first t examples of prompt b (a masked mean
squared error), and per-element optimisers (SGD, Adam) keep the networks independent.
Initialisation is PyTorch's nn.Linear default, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights
and biases, drawn from one seeded generator in the order of `init_networks`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.validate import Rule
from ..data.positions import prefix_mask
from .base import LearnerResult, as_float64
from .registry import register

NETWORK_STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def layer_sizes(d: int, depth: int, width: int) -> list[int]:
    """d -> width (depth-1 hidden layers) -> 1: an N-layer network (Wu et al. 2024, Def. 1, scalar output)."""
    return [d] + [width] * (depth - 1) + [1]


def init_networks(batch_shape: tuple[int, ...], sizes: Sequence[int], seed: int, dtype=torch.float64) -> list[Tensor]:
    """[W_1, b_1, W_2, b_2, ...] with W_j (*batch_shape, fan_out, fan_in), b_j (*batch_shape, fan_out)."""
    g = torch.Generator().manual_seed(seed)
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        bound = 1 / fan_in**0.5
        params.append((torch.rand(*batch_shape, fan_out, fan_in, generator=g, dtype=dtype) * 2 - 1) * bound)
        params.append((torch.rand(*batch_shape, fan_out, generator=g, dtype=dtype) * 2 - 1) * bound)
    return params


def network_forward(params: Sequence[Tensor], x: Tensor) -> Tensor:
    """x (*batch, m, d) -> (*batch, m): ReLU hidden layers, linear output."""
    h = x
    n_layers = len(params) // 2
    for j in range(n_layers):
        w, b = params[2 * j], params[2 * j + 1]
        h = h @ w.transpose(-1, -2) + b.unsqueeze(-2)
        if j < n_layers - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


@register("relu_gd", label="ReLU network (GD)", rules={"depth": Rule("count", minimum=2)})
def relu_gd(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    *,
    steps: Sequence[int] = NETWORK_STEPS,
    lr: float = 0.01,
    depth: int = 3,
    width: int = 32,
    optimizer: str = "adam",
    seed: int = 0,
) -> LearnerResult:
    """An N-layer ReLU network trained on the first t examples for k full-batch steps of
    `optimizer` ("adam" or "sgd") on the mean squared error / 2, for every prefix t and every k in `steps`."""
    steps = [int(k) for k in steps]
    xs, ys, queries = as_float64(xs, ys, queries)
    b, n, d = xs.shape
    params = [p.to(xs.device).requires_grad_() for p in init_networks((b, n), layer_sizes(d, depth, width), seed)]
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)(params, lr=lr)
    seen = prefix_mask(n, xs.device).to(xs.dtype)  # (t, i)
    counts = seen.sum(-1).clamp_min(1)  # examples per prefix
    data = xs.unsqueeze(1).expand(b, n, n, d)  # network (b, t) evaluated on all of prompt b's points

    snaps = {}
    last = max(steps, default=0)
    for k in range(last + 1):
        on_points = network_forward(params, data)  # (B, t, i): network t on every point of its prompt
        if k in steps:  # the networks after k updates: predictions for x_t, and for the queries
            with torch.no_grad():
                q = (
                    None
                    if queries is None
                    else network_forward(params, queries.unsqueeze(1).expand(b, n, *queries.shape[1:]))
                )
            snaps[k] = (torch.diagonal(on_points.detach(), dim1=1, dim2=2).clone(), q)
        if k == last:
            break
        resid = on_points - ys.unsqueeze(1)
        loss = 0.5 * ((resid**2 * seen).sum(-1) / counts).sum()  # sum of each network's own mean loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    preds = torch.stack([snaps[k][0] for k in steps])
    qpreds = None if queries is None else torch.stack([snaps[k][1] for k in steps])  # type: ignore[misc]  # set with queries
    grid = [{"steps": k, "lr": lr, "depth": depth, "width": width, "optimizer": optimizer} for k in steps]
    return LearnerResult("relu_gd", grid, preds, None, qpreds)
