"""Gradient descent and Iterative Newton on every prefix, every step count, in one pass.

Both are matrix functions of S_t = X_t^T X_t applied to b_t = X_t^T y_t, so in the eigenbasis
S_t = V diag(lambda) V^T every iterate is a scalar recurrence per eigenvalue; one batched
`eigh` of all prefixes then gives every iteration count at once, exactly (tests compare with
the plain matrix loops).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.threads import per_matrix
from ..core.validate import NEWTON_ALPHAS, Rule
from .base import LearnerResult, as_float64, at_prefixes, prefix_moments, spectral_result
from .registry import register

LOG_STEPS = tuple([0] + [2**k for k in range(13)])  # 0, 1, 2, 4, ..., 4096
NEWTON_ITERATIONS = tuple(range(24))


class _LastPrompts:
    """The eigendecomposition of the last prompts seen, so that GD and Newton on the same prompts
    (a report's sweeps, `benchmarks/learners.py`) decompose them once: held while those tensors
    live and are unmodified (identity and in-place version), dropped when they are freed."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.value: tuple[Tensor, Tensor, Tensor, Tensor] | None = None

    def get(self, xs: Tensor, ys: Tensor, last_prefix: bool = False):
        if self.key is None:
            return None
        xs_ref, ys_ref, versions = self.key
        same = xs_ref() is xs and ys_ref() is ys and versions == (xs._version, ys._version, last_prefix)
        return self.value if same else None

    def put(self, xs: Tensor, ys: Tensor, value: tuple[Tensor, Tensor, Tensor, Tensor], last_prefix: bool = False):
        self.key = (weakref.ref(xs, self.clear), weakref.ref(ys, self.clear), (xs._version, ys._version, last_prefix))
        self.value = value

    def clear(self, *_) -> None:
        self.key, self.value = None, None


LAST_PROMPTS = _LastPrompts()


def batched_eigh(s: Tensor) -> tuple[Tensor, Tensor]:
    """torch.linalg.eigh of a batch of symmetric matrices (..., d, d), on CPU split over threads
    (`core.threads.per_matrix`): equal to eigh's bit for bit (tested)."""
    lam, v = per_matrix(torch.linalg.eigh, s)
    return lam, v


def prefix_eigh(xs: Tensor, ys: Tensor, last_prefix: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Eigen-decompose every prefix in float64: lam (B, n, d), V (B, n, d, d), c = V^T b (B, n, d),
    counts t (n,) (`last_prefix`: the last prefix's alone, n = 1 in those shapes); the last prompts'
    decomposition is reused (`_LastPrompts`)."""
    cached = LAST_PROMPTS.get(xs, ys, last_prefix)
    if cached is not None:
        return cached
    key_xs, key_ys = xs, ys
    xs, ys, _ = as_float64(xs, ys)
    s, b = prefix_moments(xs, ys, last_prefix)
    lam, v = batched_eigh(s)
    lam = lam.clamp_min(0)  # S is PSD; round-off can leave -1e-16
    c = (v.transpose(-1, -2) @ b.unsqueeze(-1)).squeeze(-1)
    t = torch.arange(xs.shape[1], dtype=xs.dtype, device=xs.device)[-s.shape[1] :]
    LAST_PROMPTS.put(key_xs, key_ys, (lam, v, c, t), last_prefix)
    return lam, v, c, t


GD_STEP = {"auto": "per-prompt step 1/lambda_max of the loss Hessian ('auto')"}
NEWTON_ALPHA_TEXT = {
    "spectral": "M_0 = S/||S S^T||_2 ('spectral')",
    "frobenius": "M_0 = S/||S S^T||_F ('frobenius', the paper's code)",
    "paper": "M_0 = 2 S/||S S^T||_2 ('paper', Fu et al. 2024, eq. 8)",
}


def describe_gd(grid: dict) -> str:
    """What a GD grid ran, in words (the report's methods section)."""
    etas = [
        GD_STEP.get(e, str(e)) if isinstance(e, str) else f"fixed step eta = {e:g}" for e in grid.get("eta", ["auto"])
    ]
    conv = ", ".join(grid.get("convention", ["paper"]))
    return f"{conv} convention (gradient of ||y - Xw||^2/(2t) for 'paper'), " + "; ".join(etas)


def describe_newton(grid: dict) -> str:
    """What an Iterative Newton grid ran, in words."""
    alphas = [
        NEWTON_ALPHA_TEXT.get(a, str(a)) if isinstance(a, str) else f"M_0 = {a:g} S/t (fixed alpha)"
        for a in grid.get("alpha", ["spectral"])
    ]
    return "M_(k+1) = 2 M_k - M_k S M_k with " + "; ".join(alphas)


@register("gd", label="GD", unit="steps", describe=describe_gd, rules={"eta": Rule("number", names=("auto",))})
def gd(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    eta: Sequence[float | str] = ("auto",),
    steps: Sequence[int] = LOG_STEPS,
    convention: Sequence[str] = ("paper",),
) -> LearnerResult:
    """Gradient descent from w_0 = 0 on L(w) = ||y - X w||^2 / (2t) (Fu et al. 2024, eq. 4, 6).

    Step-size conventions: "paper" uses the gradient (S w - X^T y)/t of eq. 4; "code" uses
    S w - X^T y as that paper's code does, so a code step eta equals a paper step eta*t.
    eta "auto" picks, per prompt and prefix, eta = 1/lambda_max of the loss Hessian (S/t or S),
    which is always stable; a fixed eta diverges where eta * lambda_max >= 2.
    Closed form per eigenvalue h = eta*lambda(/t): w_k = V diag((1 - (1 - h)^k) / lambda) V^T b.
    """
    lam, v, c, t = prefix_eigh(xs, ys, last_prefix)
    xs, ys, queries = as_float64(xs, ys, queries)
    steps_t = torch.as_tensor(list(steps), dtype=xs.dtype, device=xs.device)
    grid, coefs = [], []
    for conv in convention:
        scale = t.clamp_min(1).view(1, -1, 1) if conv == "paper" else torch.ones_like(t).view(1, -1, 1)
        curv, g = lam / scale, c / scale  # Hessian eigenvalues and the -gradient at w = 0, per eigenvector
        top = curv.amax(-1, keepdim=True)
        for e in eta:
            if e == "auto":
                step = torch.where(top > 0, 1.0 / top.clamp_min(1e-300), torch.zeros_like(top))
            else:  # a positive number (the learner's rules)
                step = torch.full_like(top, float(e))
            h = step * curv  # per-eigenvalue contraction: u_{k+1} = (1 - h) u_k + step * g
            # the exponent a 0-dim tensor (pow of a Python 2 or 3 rounds differently); the grid's
            # counts from the host values, so that nothing here waits on the device
            for k, k_t in zip(steps, steps_t):
                filt = torch.where(h > 1e-12, (1 - (1 - h) ** k_t) / curv.clamp_min(1e-300), k_t * step)
                coefs.append(filt * g)
                grid.append({"eta": e, "steps": int(k), "convention": conv})
    return spectral_result("gd", grid, v, torch.stack(coefs), at_prefixes(xs, last_prefix), queries)


def newton_alpha(lam: Tensor, rule: str | float, t: Tensor | None = None) -> Tensor:
    """Initial scale alpha of M_0 = alpha S, per prefix (B, n, 1), from the eigenvalues of S (of
    prefixes t, default 0..n-1).

    "spectral": 1/||S S^T||_2 (default; converges); "frobenius": 1/||S S^T||_F (the paper's
    code); "paper": 2/||S S^T||_2 as printed in Fu et al. 2024, eq. 8, which sits on the convergence
    boundary: the top eigen-direction's error factor 1 - alpha lambda_max^2 = -1 never shrinks.
    A number a is a fixed scale on the normalised moment S/t (M_0 = a S/t, as a planted model
    computes it), i.e. alpha = a / t^2 on S.
    """
    if isinstance(rule, (int, float)) and not isinstance(rule, bool):
        if rule <= 0:
            raise ConfigError(f"newton alpha must be positive, got {rule}")
        t = torch.arange(lam.shape[-2], dtype=lam.dtype, device=lam.device) if t is None else t
        t = t.to(lam.dtype).clamp_min(1).view(*([1] * (lam.ndim - 2)), -1, 1)
        return torch.full_like(lam[..., :1], float(rule)) / t**2
    sq = lam**2
    if rule == "spectral":
        norm, factor = sq.amax(-1, keepdim=True), 1.0
    elif rule == "frobenius":
        norm, factor = sq.pow(2).sum(-1, keepdim=True).sqrt(), 1.0
    elif rule == "paper":
        norm, factor = sq.amax(-1, keepdim=True), 2.0
    else:
        raise ConfigError(f"newton alpha must be one of {NEWTON_ALPHAS}, got {rule!r}")
    return torch.where(norm > 0, factor / norm.clamp_min(1e-300), torch.zeros_like(norm))


def newton_schulz(m: Tensor, s: Tensor, steps: int) -> Tensor:
    """M after `steps` Newton-Schulz steps M <- 2 M - M S M from the given M (Fu et al. 2024, eq. 8),
    batched over the leading dimensions of m and s (..., d, d): the iteration resumed from any state."""
    for _ in range(steps):
        m = 2 * m - m @ s @ m
    return m


@register("newton", label="Iterative Newton", describe=describe_newton)
def newton(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    iterations: Sequence[int] = NEWTON_ITERATIONS,
    alpha: Sequence[str] = ("spectral",),
) -> LearnerResult:
    """Iterative Newton (Newton-Schulz) for S^+ (Fu et al. 2024, eq. 8):

        M_0 = alpha S,  M_{k+1} = 2 M_k - M_k S M_k,  w_k = M_k X^T y.

    Every M_k is a polynomial in S, so per eigenvalue m_0 = alpha lambda and
    m_{k+1} = 2 m_k - lambda m_k^2; zero eigenvalues stay zero (the pseudo-inverse).
    """
    its = sorted({int(k) for k in iterations})
    lam, v, c, t = prefix_eigh(xs, ys, last_prefix)
    xs, ys, queries = as_float64(xs, ys, queries)
    grid, coefs = [], []
    for rule in alpha:
        m = newton_alpha(lam, rule, t) * lam
        wanted = {}
        for k in range(its[-1] + 1 if its else 0):
            if k in its:
                wanted[k] = m * c
            m = 2 * m - lam * m * m
        for k in iterations:
            coefs.append(wanted[int(k)])
            grid.append({"iterations": int(k), "alpha": rule})  # rule: a name or a fixed number
    return spectral_result("newton", grid, v, torch.stack(coefs), at_prefixes(xs, last_prefix), queries)


def _step_on_moment(lam: Tensor, rule: str | float, t: Tensor, power: int) -> Tensor:
    """A step size on S^power per prefix (B, n, 1): "auto" (GD's word) or "spectral" (Newton's) is
    1/lambda_max(S)^power, per prompt and always stable; a number a is a fixed step on the
    normalised moment S/t, a / t^power on S."""
    if isinstance(rule, str):  # the learners' rules admit "auto" (precond_gd) and "spectral" (newton_identity)
        top = lam.amax(-1, keepdim=True) ** power
        return torch.where(top > 0, 1.0 / top.clamp_min(1e-300), torch.zeros_like(top))
    return torch.full_like(lam[..., :1], float(rule)) / t.clamp_min(1).view(1, -1, 1) ** power


def _filtered(lam: Tensor, c: Tensor, h: Tensor, steps: int) -> Tensor:
    """V^T w after `steps` of the contraction 1 - h per eigenvalue: (1 - (1 - h)^steps) c / lambda
    (zero on zero eigenvalues, the pseudo-inverse's convention)."""
    resp = 1 - (1 - h) ** steps
    return torch.where(lam > 0, resp * c / lam.clamp_min(1e-300), torch.zeros_like(c))


@register(
    "newton_identity",
    label="Newton from alpha I",
    describe=lambda g: "M_0 = alpha I, M_(k+1) = 2 M_k - M_k S M_k",
    rules={"alpha": Rule("number", names=("spectral",))},
)
def newton_identity(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    iterations: Sequence[int] = NEWTON_ITERATIONS,
    alpha: Sequence[str | float] = ("spectral",),
) -> LearnerResult:
    """Newton-Schulz from M_0 = alpha I (not Fu et al.'s alpha S): M_(k+1) = 2 M_k - M_k S M_k,
    w_k = M_k X^T y. Per eigenvalue 1 - lambda m_k = (1 - alpha lambda)^(2^k), so this is exactly
    GD from 0 with 2^k steps of size alpha (tests). alpha "spectral": 1/lambda_max(S); a number a: a
    fixed step on S/t (GD's paper-convention eta = a).
    """
    lam, v, c, t = prefix_eigh(xs, ys, last_prefix)
    xs, ys, queries = as_float64(xs, ys, queries)
    grid, coefs = [], []
    for rule in alpha:
        h = _step_on_moment(lam, rule, t, 1) * lam
        for k in iterations:
            coefs.append(_filtered(lam, c, h, 2 ** int(k)))
            grid.append({"iterations": int(k), "alpha": rule})
    return spectral_result("newton_identity", grid, v, torch.stack(coefs), at_prefixes(xs, last_prefix), queries)


@register(
    "precond_gd",
    label="S-preconditioned GD",
    unit="steps",
    describe=lambda g: "w <- w + eta S (X^T y - S w)",
    rules={"eta": Rule("number", names=("auto",))},
)
def precond_gd(
    xs: Tensor,
    ys: Tensor,
    queries: Tensor | None = None,
    last_prefix: bool = False,
    *,
    steps: Sequence[int] = LOG_STEPS,
    eta: Sequence[str | float] = ("auto",),
) -> LearnerResult:
    """GD from 0 preconditioned by S: w_(k+1) = w_k + eta S (X^T y - S w_k). Per eigenvalue the
    response is 1 - (1 - eta lambda^2)^k, so Fu et al.'s Iterative Newton (M_0 = alpha S, Fu et al. 2024
    eq. 8) after k iterations is this with 2^k steps and eta = alpha (tests). eta "auto":
    1/lambda_max(S)^2 (Fu et al.'s 'spectral' alpha); a number a: a fixed step on S/t, a / t^2 on S.
    """
    lam, v, c, t = prefix_eigh(xs, ys, last_prefix)
    xs, ys, queries = as_float64(xs, ys, queries)
    grid, coefs = [], []
    for rule in eta:
        h = _step_on_moment(lam, rule, t, 2) * lam**2
        for k in steps:
            coefs.append(_filtered(lam, c, h, int(k)))
            grid.append({"eta": rule, "steps": int(k)})
    return spectral_result("precond_gd", grid, v, torch.stack(coefs), at_prefixes(xs, last_prefix), queries)
