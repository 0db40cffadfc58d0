"""Seeded, batched prompt samplers for the in-context regression tasks.

Every sampler returns a `Prompts` with xs (B, n, d), ys (B, n) and the task parameters.
Randomness comes only from the `torch.Generator` passed in, so a (seed, step) pair fixes a batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.seeds import generator_for  # noqa: F401  (the prompt streams' generator, re-exported)
from ..core.validate import check_memory
from .config import TASKS, TaskConfig


@dataclass
class Prompts:
    xs: Tensor  # (B, n, d)
    ys: Tensor  # (B, n)
    w: Tensor | None = None  # (B, d) for linear tasks
    params: dict[str, Tensor] = field(default_factory=dict)  # e.g. "sigma_sqrt" (B, d, d)

    def to(self, device: str | torch.device) -> Prompts:
        return Prompts(
            self.xs.to(device),
            self.ys.to(device),
            None if self.w is None else self.w.to(device),
            {k: v.to(device) for k, v in self.params.items()},
        )


def random_orthogonal(batch: int, d: int, generator: torch.Generator) -> Tensor:
    """Haar-distributed orthogonal matrices (B, d, d): QR of a Gaussian with sign fix."""
    g = torch.randn(batch, d, d, generator=generator)
    q, r = torch.linalg.qr(g)
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)


def input_transform(task: TaskConfig, batch: int, generator: torch.Generator) -> Tensor | None:
    """A (B, d, d) with x = z @ A, z ~ N(0, I), so Sigma = A^T A; None when isotropic.

    Ill-conditioned inputs follow Fu et al. 2024, §4.3: a random orthogonal basis Q per prompt and
    singular values sqrt(kappa) on half the directions and 1 on the rest, so kappa(Sigma) = kappa.
    """
    if task.covariance == "isotropic":
        return None
    d = task.n_dims
    scales = torch.ones(d)
    scales[: d // 2] = task.kappa**0.5
    q = random_orthogonal(batch, d, generator)
    return q @ torch.diag(scales) @ q.transpose(-1, -2)  # symmetric square root of Sigma


def sample_inputs(
    task: TaskConfig, batch: int, n_points: int, generator: torch.Generator, active_dims: int | None
) -> tuple[Tensor, Tensor | None]:
    xs = torch.randn(batch, n_points, task.n_dims, generator=generator)
    a = input_transform(task, batch, generator)
    if a is not None:
        xs = xs @ a
    return zero_inactive(xs, active_dims), a


def zero_inactive(xs: Tensor, active_dims: int | None) -> Tensor:
    """Garg et al.'s dimension curriculum: coordinates past `active_dims` are zero."""
    if active_dims is not None and active_dims < xs.shape[-1]:
        xs[..., active_dims:] = 0
    return xs


def _linear_prompts(
    task: TaskConfig,
    batch: int,
    n_points: int,
    generator: torch.Generator,
    active_dims: int | None,
    mask: Callable[[Tensor], Tensor] | None = None,
) -> Prompts:
    """y = x.w + eps with w ~ N(0, tau^2 I) (then `mask`ed), eps ~ N(0, sigma^2); draws in the order
    inputs, w, the mask's own draws, noise (a seed's prompts stay what they were)."""
    xs, a = sample_inputs(task, batch, n_points, generator, active_dims)
    w = task.w_scale * torch.randn(batch, task.n_dims, generator=generator)
    if mask is not None:
        w = mask(w)
    ys = torch.einsum("bnd,bd->bn", xs, w)
    if task.noise_std > 0:
        ys = ys + task.noise_std * torch.randn(batch, n_points, generator=generator)
    return Prompts(xs, ys, w, {} if a is None else {"sigma_sqrt": a})


@TASKS.register("linear_regression")
def linear_regression(
    task: TaskConfig, batch: int, n_points: int, generator: torch.Generator, active_dims: int | None = None
) -> Prompts:
    """y = x.w + eps, w ~ N(0, tau^2 I), eps ~ N(0, sigma^2) (Akyurek et al. 2023, eq. 16)."""
    return _linear_prompts(task, batch, n_points, generator, active_dims)


@TASKS.register("sparse_linear_regression")
def sparse_linear_regression(
    task: TaskConfig, batch: int, n_points: int, generator: torch.Generator, active_dims: int | None = None
) -> Prompts:
    """As linear regression, with all but `sparsity` random coordinates of w set to zero."""

    def keep_sparsity(w: Tensor) -> Tensor:
        keep = torch.rand(batch, task.n_dims, generator=generator).argsort(dim=-1)[:, : task.sparsity]
        return w * torch.zeros_like(w).scatter_(1, keep, 1.0)

    return _linear_prompts(task, batch, n_points, generator, active_dims, keep_sparsity)


def sample_relu_network(task: TaskConfig, batch: int, generator: torch.Generator) -> list[Tensor]:
    """Weights of B independent N-layer ReLU networks (Wu et al. 2024, Def. 1), one list entry per layer.

    Layer j has shape (B, fan_out, fan_in); entries ~ N(param_mean, 1) / sqrt(fan_in) so that
    activations keep unit scale with depth. The output layer maps width K to a scalar.
    """
    sizes = [task.n_dims] + [task.relu_width] * (task.relu_depth - 1) + [1]
    return [
        (task.param_mean + torch.randn(batch, fan_out, fan_in, generator=generator)) / fan_in**0.5
        for fan_in, fan_out in itertools.pairwise(sizes)
    ]


def relu_network_forward(weights: list[Tensor], xs: Tensor) -> Tensor:
    """f(x) = V_N relu(V_{N-1} ... relu(V_1 x)); xs (B, n, d) -> (B, n). Linear output layer."""
    h = xs
    for j, v in enumerate(weights):
        h = torch.einsum("bnk,bok->bno", h, v)
        if j < len(weights) - 1:
            h = torch.relu(h)
    return h.squeeze(-1)


def sample_mixture(task: TaskConfig, batch: int, n_points: int, generator: torch.Generator) -> Tensor:
    """x ~ w1 N(-m 1, I) + w2 N(m 1, I), the component drawn independently per point."""
    w2 = task.mixture_weights[1]
    component = (torch.rand(batch, n_points, 1, generator=generator) < w2).float()
    centre = task.mixture_mean * (2 * component - 1)
    return centre + torch.randn(batch, n_points, task.n_dims, generator=generator)


@TASKS.register("relu_network")
def relu_network(
    task: TaskConfig, batch: int, n_points: int, generator: torch.Generator, active_dims: int | None = None
) -> Prompts:
    """y = f(x) for a random N-layer ReLU network f per prompt, x from a Gaussian mixture."""
    xs = zero_inactive(sample_mixture(task, batch, n_points, generator), active_dims)
    weights = sample_relu_network(task, batch, generator)
    ys = relu_network_forward(weights, xs)
    if task.noise_std > 0:
        ys = ys + task.noise_std * torch.randn(batch, n_points, generator=generator)
    return Prompts(xs, ys, None, {f"layer{j}": v for j, v in enumerate(weights)})


def sample_prompts(
    task: TaskConfig,
    batch: int,
    n_points: int | None = None,
    *,
    generator: torch.Generator,
    active_dims: int | None = None,
) -> Prompts:
    """Sample a batch of prompts of `n_points` examples (default: the task's).

    `active_dims` < d zeroes the later coordinates of x before labels are computed
    (Garg et al.'s dimension curriculum).
    """
    n_points = task.n_points if n_points is None else n_points
    # the draw's floor: x and y in float32, twice over (its temporaries); a count no machine holds is
    # refused here, naming it, rather than by the allocator
    nbytes = 2 * 4.0 * batch * (n_points * (task.n_dims + 1) + task.n_dims)
    check_memory(nbytes, f"{batch} prompts of {n_points} points (d = {task.n_dims})", "draw fewer prompts")
    prompts = TASKS.get(task.name)(task, batch, n_points, generator, active_dims)
    if not (bool(torch.isfinite(prompts.xs).all()) and bool(torch.isfinite(prompts.ys).all())):
        raise ConfigError(
            f"{task.name} prompts overflow float32 (|x| or |y| beyond 3.4e38) at task.w_scale = {task.w_scale:g}, "
            f"task.noise_std = {task.noise_std:g}, task.kappa = {task.kappa:g}: lower the task's scales"
        )
    return prompts
