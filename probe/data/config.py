"""The task a model learns in context: recipe section [task] of a run, and the registry of tasks
(probe/data/tasks.py registers each sampler in `TASKS`, which `TaskConfig.name` is checked against)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.registry import Registry

TASKS: Registry[Any] = Registry("task")  # name -> sampler (probe/data/tasks.py)
COVARIANCES = ("isotropic", "ill_conditioned")


@dataclass
class TaskConfig(Section):
    """A task: recipe section [task]."""

    SECTION = "task"

    name: str = setting("linear_regression", "the task (probe/data/tasks.py)", TASKS, noun="task")
    n_dims: int = setting(4, "d, the dimension of x")
    n_points: int = setting(12, "examples per prompt")
    w_scale: float = setting(1.0, "tau: w ~ N(0, tau^2 I)")
    noise_std: float = setting(0.0, "sigma: y = x.w + N(0, sigma^2)", low=0.0, strict=False)
    covariance: str = setting(
        "isotropic", "x ~ N(0, I), or N(0, Sigma) with condition number kappa", COVARIANCES, noun="covariance"
    )
    kappa: float = setting(
        100.0,
        "condition number of Sigma when covariance = ill_conditioned (float32 prompts: at most 1e12)",
        low=1.0,
        strict=False,
        high=1e12,
    )
    sparsity: int = setting(2, "non-zero entries of w for sparse_linear_regression")
    relu_depth: int = setting(3, "N, layers of the ReLU network (Wu et al. 2024, Def. 1)", minimum=2)
    relu_width: int = setting(16, "K, hidden width of the ReLU network")
    mixture_weights: tuple[float, float] = setting(
        (1.0, 0.0), "x ~ w1 N(-m, I) + w2 N(m, I) (relu_network only)", low=0.0, strict=False
    )
    mixture_mean: float = setting(2.0, "m of the mixture", low=None)
    param_mean: float = setting(0.0, "network parameters ~ N(param_mean, 1) before 1/sqrt(fan_in)", low=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sparsity > self.n_dims:
            raise ConfigError(f"task.sparsity must be in 1..n_dims={self.n_dims}, got {self.sparsity}")
        if len(self.mixture_weights) != 2 or abs(sum(self.mixture_weights) - 1) >= 1e-6:
            raise ConfigError(
                f"task.mixture_weights must be two non-negative numbers summing to 1, got {self.mixture_weights}"
            )
