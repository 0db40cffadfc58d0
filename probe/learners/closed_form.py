"""Least squares and ridge regression on every prefix at once (Fu et al. 2024, eq. 5, Akyurek et al. 2023, eq. 17-18)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.threads import per_matrix
from ..core.validate import Rule
from .base import LearnerResult, as_float64, at_prefixes, linear_result, prefix_moments
from .registry import register


def least_squares_weights(xs: Tensor, ys: Tensor, rtol: float = 1e-10, last_prefix: bool = False) -> Tensor:
    """Minimum-norm w_t = S_t^+ X_t^T y_t for every prefix (B, n, d), or the last (B, 1, d) (Fu et al. 2024, eq. 5)."""
    s, b = prefix_moments(xs, ys, last_prefix)
    pinv = per_matrix(lambda m: torch.linalg.pinv(m, hermitian=True, rtol=rtol), s)
    return (pinv @ b.unsqueeze(-1)).squeeze(-1)


@register("least_squares", label="least squares")
def least_squares(xs: Tensor, ys: Tensor, queries: Tensor | None = None, last_prefix: bool = False) -> LearnerResult:
    """OLS with the pseudo-inverse: the minimum-norm interpolant while t < d."""
    xs, ys, queries = as_float64(xs, ys, queries)
    weights = least_squares_weights(xs, ys, last_prefix=last_prefix)[None]
    return linear_result("least_squares", [{}], weights, at_prefixes(xs, last_prefix), queries)


PENALTIES = ("fixed", "per_example")


@register("ridge", label="ridge", rules={"penalty": Rule("choice", names=PENALTIES)})
def ridge(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    lam: Sequence[float] = (0.01, 0.1, 1.0),
    penalty: Sequence[str] = ("fixed",),
) -> LearnerResult:
    """w_t = (S_t + lambda I)^{-1} X_t^T y_t, minimising ||y - X w||^2 + lambda ||w||^2.

    The Bayes-optimal choice for y = x.w + N(0, sigma^2), w ~ N(0, tau^2 I) is
    lambda = sigma^2 / tau^2 (Akyurek et al. 2023, eq. 18); see `bayes_lambda`. penalty "per_example" puts
    lambda t in its place at prefix t (the penalty of the mean loss ||y - X w||^2 / t + lambda ||w||^2):
    along S's eigen-directions a filter of lambda / t, where the fixed penalty's is one of lambda.
    """
    xs, ys, queries = as_float64(xs, ys, queries)
    s, b = prefix_moments(xs, ys, last_prefix)
    eye = torch.eye(xs.shape[-1], dtype=xs.dtype, device=xs.device)
    grid = [(float(v), rule) for rule in penalty for v in lam]
    n = s.shape[1]  # examples before each position: t = 0..n-1 (the last alone: n_points - 1); S_0 = 0 stays 0
    t = torch.arange(xs.shape[1] - n, xs.shape[1], dtype=xs.dtype, device=xs.device).clamp_min(1)
    scale = torch.stack([t if rule == "per_example" else torch.ones_like(t) for _, rule in grid])  # (K, n)
    lams = torch.as_tensor([v for v, _ in grid], dtype=xs.dtype, device=xs.device).view(-1, 1) * scale
    reg = s.unsqueeze(0) + lams.view(len(grid), 1, n, 1, 1) * eye  # (K, B, n, d, d)
    try:
        # below d examples S is singular, and S + lambda I too where lambda is below S's resolution:
        # LAPACK may or may not meet an exact zero pivot there (it depends on the CPU), so on the CPU,
        # where reading S costs no device synchronisation, the check is explicit
        if xs.device.type == "cpu" and n > 0 and _below_resolution(s, min(lam), xs.shape[1] - n < xs.shape[-1]):
            raise torch.linalg.LinAlgError("lambda below the resolution of S at a rank-deficient prefix")
        w = torch.linalg.solve(reg, b.unsqueeze(0).expand(len(lams), *b.shape).unsqueeze(-1)).squeeze(-1)
    except torch.linalg.LinAlgError:
        top = float(s.diagonal(dim1=-2, dim2=-1).abs().max())
        raise ConfigError(
            f"ridge with lambda {min(lam):g} is singular on these prompts: S = X^T X reaches {top:.3g}, where "
            f"{min(lam):g} is below {xs.dtype}'s resolution; rescale the prompts or use lambdas comparable to |x|^2"
        ) from None
    rows = [{"lam": v} if rule == "fixed" else {"lam": v, "penalty": rule} for v, rule in grid]
    return linear_result("ridge", rows, w, at_prefixes(xs, last_prefix), queries)


def _below_resolution(s: Tensor, lam: float, deficient: bool) -> bool:
    """Whether `lam` vanishes beside S (below its dtype's resolution of S's largest diagonal entry)
    where some prefix has fewer examples than dimensions (`deficient`): S + lam I is then singular."""
    return deficient and lam <= torch.finfo(s.dtype).eps * float(s.diagonal(dim1=-2, dim2=-1).abs().max())


@register(
    "pcr",
    label="principal-component regression",
    unit="components",
    rules={"components": Rule("count", minimum=1)},
)
def pcr(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    components: Sequence[int] = (1, 2),
    rtol: float = 1e-10,
) -> LearnerResult:
    """Principal-component regression on each prompt's own S_t = X_t^T X_t: least squares restricted
    to S_t's top m eigen-directions, w_t = sum_{j <= m} (v_j^T X_t^T y_t / lambda_j) v_j (directions
    with lambda_j <= rtol lambda_max left out). Along S_t's eigen-directions a step filter of rank
    (1 on the top m, 0 below), not a function of the eigenvalue: it has no small-lambda exponent.
    Zhang, Singh, Latham & Saxe 2025 relate linear attention to principal-component regression."""
    from .iterative import prefix_eigh

    xs, ys, queries = as_float64(xs, ys, queries)
    d = xs.shape[-1]
    lam, v, c, _ = prefix_eigh(xs, ys, last_prefix)  # eigenvalues ascending
    ranks = list(components)
    rank = torch.arange(d, device=xs.device).flip(0)  # 0 for the largest eigenvalue
    kept = lam > rtol * lam.amax(-1, keepdim=True).clamp_min(1e-300)
    coef = torch.where(kept, c / lam.clamp_min(1e-300), torch.zeros_like(c))  # (B, n, d)
    mask = torch.stack([rank < m for m in ranks]).to(xs.dtype)  # (K, d)
    w = torch.einsum("bnij,kbnj->kbni", v, coef.unsqueeze(0) * mask.view(len(ranks), 1, 1, d))
    return linear_result("pcr", [{"components": m} for m in ranks], w, at_prefixes(xs, last_prefix), queries)


def bayes_lambda(noise_std: float, w_scale: float) -> float:
    """sigma^2 / tau^2, the ridge penalty whose estimate is the posterior mean (Akyurek et al. 2023, eq. 18)."""
    return noise_std**2 / w_scale**2


def zfb_gamma(n_train: int, d: int, input_var: float = 1.0, noise: float = 0.0) -> float:
    """Gamma = ((1 + 1/N) Lambda + (tr(Lambda) + sigma^2) / N I)^-1 for Lambda = v I, a scalar here:
    Zhang, Frei & Bartlett (2024, Theorem 4.1) global minimum of one linear self-attention layer trained
    on N examples of x ~ N(0, Lambda), w ~ N(0, I), label noise sigma^2 (in units of w's variance)."""
    return 1.0 / ((1 + 1 / n_train) * input_var + (d * input_var + noise) / n_train)


@register(
    "lsa_optimum",
    label="one LSA layer's optimum",
    describe=lambda g: f"w = Gamma X^T y / t, Gamma for N = {g['n_train']} (Zhang, Frei & Bartlett 2024)",
)
def lsa_optimum(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    n_train: Sequence[int] = (20,),
    input_var: Sequence[float] = (1.0,),
    noise: Sequence[float] = (0.0,),
) -> LearnerResult:
    """One preconditioned step from 0, w_t = Gamma X_t^T y_t / t with `zfb_gamma`'s Gamma: what a
    linear self-attention layer trained on N examples of isotropic inputs predicts after t (its
    attention divides by the t examples it sees; at t = N this is the theorem's x_q^T Gamma X^T y / N).
    Gamma is built from the training distribution (N, Lambda = input_var I, noise), not from the prompt."""
    xs, ys, queries = as_float64(xs, ys, queries)
    _, b = prefix_moments(xs, ys, last_prefix)
    n = xs.shape[1]
    t = torch.arange(n - 1, n, device=xs.device) if last_prefix else torch.arange(n, device=xs.device)
    mean_b = b / t.clamp_min(1).to(xs.dtype).view(1, -1, 1)  # X_t^T y_t / t (0 at t = 0)
    settings = [(int(n_), float(v), float(s)) for n_ in n_train for v in input_var for s in noise]
    grid = [{"n_train": n_, "input_var": v, "noise": s} for n_, v, s in settings]
    gammas = torch.tensor([zfb_gamma(n_, xs.shape[-1], v, s) for n_, v, s in settings], dtype=xs.dtype).to(xs.device)
    weights = gammas.view(-1, 1, 1, 1) * mean_b.unsqueeze(0)
    return linear_result("lsa_optimum", grid, weights, at_prefixes(xs, last_prefix), queries)
