"""Probes for the state a learner keeps in the tokens: per token, a function of
the second moment S the token can see, applied to its own x.

A Newton-type learner keeps a d x d matrix built from S = X^T X; GD keeps a d-vector. Fu et al.'s
construction of Iterative Newton (Fu et al. 2024, Thm. 1, App. B) keeps M_k x_i in example i's token
(probe/models/constructions/newton_relu.py), and M_1 = 2 alpha S - alpha^2 S^3 (eq. 8). So the
targets, per token of example j (0-indexed), with S the normalised moment the token can see
(causality): the x token of example j sees the j examples before it (S_j / j), the y token sees
example j too (S_{j+1} / (j + 1)):

    sx          (S/t) x_j
    s3x         (S/t)^3 x_j
    newton_mx   M_k x_j, M_0 = alpha S/t, M_{k+1} = 2 M_k - M_k (S/t) M_k (Fu et al. 2024, eq. 8), for each
                k of `iterations`; alpha a fixed number (a planted model's) or "spectral"
                (1 / lambda_max(S/t)^2, the learners' default rule)
    w_newton    the Newton weight iterate M_k b, b = X^T y / t over the same examples, for each k
    w_gd        the GD weight iterate after k steps from 0 on ||y - X w||^2 / (2t) (Fu et al. 2024, eq. 6),
                for each k of `gd_steps`; eta a fixed number or "auto" (1 / lambda_max(S/t))
    w_ols       the least-squares weights (S/t)^+ b, the limit of both

Each is probed at every layer boundary by one ridge map from the token's residual stream, shared
by all examples' tokens of that kind (x or y; the x token of example 0, which sees nothing, and the
last example's y token, which nothing reads, are left out), fitted on training prompts with the penalty chosen by exact leave-one-out, and scored on
held-out prompts: R^2 = 1 - SSE / SST pooled over the target's d entries, with a 90% percentile
interval over resamples of the test prompts. At large t, S/t is near I, so x_j alone already gives
part of S x_j: the floor every layer is compared with is the same probe on the example's own x
(`floor_r2`; the gain over it has a paired interval). A Garg-encoded y token holds no x at layer 0,
so layer 0 is no floor there.

Token kind "column": the d column tokens a planted Newton model keeps beside the interleaved stream
(probe/models/constructions/newton.py writes column j of M_k into column token j), in the prefix run
of each example's x token (it sees the same examples). There the vector a target applies its
matrix to is e_j instead of x_j: column j of S/t, (S/t)^3 and M_k; the weight targets are the same
at every column token. The floor is the probe on e_j alone (what the token's identity gives).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from ..capture.stream_store import StreamReader
from ..capture.streams import LayerStreams, by_position_streams, column_count, column_streams
from ..core import budget
from ..core.allocator import release_free_memory
from ..core.errors import ConfigError
from ..core.seeds import Stream, stream_generator
from ..core.validate import check_device, check_model, positive_int
from ..data.config import TaskConfig
from ..data.tasks import sample_prompts
from ..learners.iterative import batched_eigh, newton_alpha
from ..models.sizes import shape_of
from .stats import percentile_interval
from .token_ridge import ALPHAS, LayerFeatures, RidgeHeads, ridge_fit, ridge_fit_kinds, ridge_score, ridge_score_kinds

TOKEN_TARGETS = ("sx", "s3x", "newton_mx", "w_newton", "w_gd", "w_ols")
TOKEN_KINDS = ("x", "y", "column")  # column: the column tokens a planted Newton model keeps
TOKENS = TOKEN_KINDS
ITERATED = ("newton_mx", "w_newton", "w_gd")  # targets with an iteration count
NEWTON_TARGETS = ("newton_mx", "w_newton")  # those iterated one step at a time (w_gd is closed-form)
LEVEL = 0.90


@dataclass(frozen=True)
class TokenTarget:
    """One target: its name, and for newton_mx the iteration count and alpha rule."""

    name: str
    iterations: int = 0
    alpha: float | str = "spectral"  # Newton's rule (newton_mx, w_newton); GD's step (w_gd)

    @property
    def label(self) -> str:
        return f"{self.name}[k={self.iterations}]" if self.name in ITERATED else self.name


def token_moments(xs: Tensor, token: str) -> Tensor:
    """(B, n, d, d): the normalised second moment each example's `token` can see (module docstring)."""
    xs = xs.double()
    outer = xs.unsqueeze(-1) * xs.unsqueeze(-2)
    through = torch.cumsum(outer, dim=1)  # examples 0..j
    count = torch.arange(1, xs.shape[1] + 1, dtype=xs.dtype, device=xs.device).view(1, -1, 1, 1)
    if token == "y":
        return through / count
    if token in ("x", "column"):
        return (through - outer) / (count - 1).clamp_min(1)
    raise ConfigError(f"token must be one of {TOKENS}, got {token!r}")


def token_moments_b(xs: Tensor, ys: Tensor, token: str) -> Tensor:
    """(B, n, d): X^T y / t over the examples each example's `token` can see (as `token_moments`)."""
    xy = xs.double() * ys.double().unsqueeze(-1)
    through = torch.cumsum(xy, dim=1)
    count = torch.arange(1, xs.shape[1] + 1, dtype=xy.dtype, device=xy.device).view(1, -1, 1)
    return through / count if token == "y" else (through - xy) / (count - 1).clamp_min(1)


def token_targets(xs: Tensor, target: TokenTarget, token: str, ys: Tensor | None = None) -> Tensor:
    """(B, n, d): `target` at every example's `token` (module docstring); the weight targets need ys.
    Token "column": (B, n, d, d), [..., j, :] the target at column token j of example j's run."""
    return TokenMoments(xs, token, ys).target(target)


class TokenMoments:
    """What the targets at one token kind are computed from, each computed once for all of them:
    S/t (`token_moments`), its spectrum (one eigendecomposition per prefix of every prompt, shared
    by every Newton iteration count) and X^T y / t."""

    def __init__(self, xs: Tensor, token: str, ys: Tensor | None = None):
        self.xs, self.token, self.ys = xs, token, ys
        self.s = token_moments(xs, token)
        self._spectrum: tuple[Tensor, Tensor] | None = None

    @property
    def spectrum(self) -> tuple[Tensor, Tensor]:
        if self._spectrum is None:
            self._spectrum = _spectrum(self.s)
        return self._spectrum

    def target(self, target: TokenTarget) -> Tensor:
        """`token_targets` of this token kind's prompts."""
        s, xs, token = self.s, self.xs, self.token
        d = xs.shape[-1]
        # the vectors the matrix targets apply to, as columns: x_j, or e_1..e_d at the column tokens
        x = torch.eye(d, dtype=s.dtype, device=s.device) if token == "column" else xs.double().unsqueeze(-1)
        if target.name.startswith("w_"):
            if self.ys is None:
                raise ConfigError(f"token target {target.name} needs the labels ys")
            w = _weights(self.spectrum, token_moments_b(xs, self.ys, token), target)
            return w.unsqueeze(-2).expand(*w.shape[:-1], d, d) if token == "column" else w
        if target.name == "sx":
            out = s @ x
        elif target.name == "s3x":
            out = s @ s @ s @ x
        elif target.name == "newton_mx":
            lam, vecs = self.spectrum
            out = vecs @ (_newton_iterate(lam, target).unsqueeze(-1) * (vecs.transpose(-1, -2) @ x))
        else:
            raise ConfigError(f"unknown token target {target.name!r}; known: {', '.join(TOKEN_TARGETS)}")
        return out.transpose(-1, -2) if token == "column" else out.squeeze(-1)


def _spectrum(s: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues (clamped at 0: S/t is a Gram matrix) and eigenvectors of S/t (`batched_eigh`: on
    the CPU split over its threads, bit for bit eigh's)."""
    lam, vecs = batched_eigh(s)
    return lam.clamp_min(0), vecs


def _newton_iterate(lam: Tensor, target: TokenTarget) -> Tensor:
    """M_k per eigenvalue of S/t: m_0 = alpha lambda, m_(k+1) = 2 m_k - lambda m_k^2 (Fu et al. 2024, eq. 8)."""
    ones = torch.ones(lam.shape[-2], dtype=lam.dtype, device=lam.device)
    m = newton_alpha(lam, target.alpha, ones) * lam
    for _ in range(target.iterations):
        m = 2 * m - lam * m**2
    return m


def _weights(spectrum: tuple[Tensor, Tensor], b: Tensor, target: TokenTarget) -> Tensor:
    """w_newton, w_gd or w_ols from the normalised moments, per eigenvalue of S/t (`spectrum`; zero
    eigenvalues give 0, the pseudo-inverse's convention)."""
    lam, vecs = spectrum
    c = (vecs.transpose(-1, -2) @ b.unsqueeze(-1)).squeeze(-1)  # V^T b
    inverse = torch.where(lam > 1e-12 * lam.amax(-1, keepdim=True), 1 / lam.clamp_min(1e-300), torch.zeros_like(lam))
    if target.name == "w_ols":
        gain = inverse
    elif target.name == "w_newton":
        gain = _newton_iterate(lam, target)
    elif target.name == "w_gd":
        top = lam.amax(-1, keepdim=True)
        auto = torch.where(top > 0, 1 / top.clamp_min(1e-300), torch.zeros_like(top))  # 1 / lambda_max
        eta = auto if target.alpha in ("auto", "spectral") else torch.full_like(top, float(target.alpha))
        gain = (1 - (1 - eta * lam) ** target.iterations) * inverse  # k steps from 0 (Fu et al. 2024, eq. 6)
    else:
        raise ConfigError(f"unknown token target {target.name!r}; known: {', '.join(TOKEN_TARGETS)}")
    return (vecs @ (gain * c).unsqueeze(-1)).squeeze(-1)


def expand_targets(
    names: Sequence[str],
    iterations: Sequence[int],
    alpha: float | str,
    gd_steps: Sequence[int] = (),
    eta: float | str = "auto",
) -> list[TokenTarget]:
    """The targets of `names`: newton_mx and w_newton once per iteration count (Newton's alpha),
    w_gd once per step count of `gd_steps` (GD's eta)."""
    out = []
    for name in names:
        if name not in TOKEN_TARGETS:
            raise ConfigError(f"unknown token target {name!r}; known: {', '.join(TOKEN_TARGETS)}")
        if name in ("newton_mx", "w_newton"):
            out += [TokenTarget(name, positive_int(k, "iterations", 0), alpha) for k in iterations]
        elif name == "w_gd":
            out += [TokenTarget(name, positive_int(k, "gd_steps", 0), eta) for k in gd_steps]
        else:
            out.append(TokenTarget(name))
    return out


def settings_targets(settings, model_config) -> list[TokenTarget]:
    """The targets of a [token_probes] section (TokenProbeSettings) on a checkpoint of `model_config`."""
    return expand_targets(
        settings.targets,
        settings.iterations,
        settings.alpha_for(model_config),
        settings.gd_steps,
        settings.eta_for(model_config),
    )


def _positions(token: str, n: int) -> tuple[Tensor, Tensor]:
    """(examples, stream positions) of a token kind: x tokens of examples 1..n-1 (example 0's sees
    nothing), y tokens of 0..n-2 (the last example's label follows the last query: nothing reads it);
    column tokens in the runs of the x tokens 1..n-1 (no stream position: `column_streams`)."""
    examples = torch.arange(0, n - 1) if token == "y" else torch.arange(1, n)
    return examples, 2 * examples + (1 if token == "y" else 0)


def _features(
    token: str, states: Tensor | LayerStreams, columns: Tensor | None, xs: Tensor
) -> tuple[LayerFeatures, Tensor]:
    """A token kind's probe features (L+1, N, J, D), layer by layer, and the floor's (1, N, J, d): the
    example's own x, or at column token j the one-hot e_j; column tokens are J = runs x d rows per prompt."""
    examples, pos = _positions(token, xs.shape[1])
    if token != "column":
        layers, _, n_prompts, width = states.shape
        shape = (layers, n_prompts, len(pos), width)
        own = xs[:, examples].double().unsqueeze(0)
        return LayerFeatures(states, lambda block: block[:, pos].double().permute(0, 2, 1, 3), shape), own
    if columns is None:
        raise ConfigError("token 'column' needs the column tokens' states (probe.capture.streams.column_streams)")
    layers, n_prompts, _, extra, width = columns.shape
    d = xs.shape[-1]
    if extra != d:
        raise ConfigError(
            f"the model keeps {extra} column tokens for d = {d}: column tokens hold one column of a d x d matrix each"
        )
    shape = (layers, n_prompts, len(examples) * d, width)
    feats = LayerFeatures(columns, lambda block: block[:, :, examples].double().reshape(len(block), *shape[1:]), shape)
    own = torch.eye(d, dtype=torch.float64, device=xs.device).expand(1, n_prompts, len(examples), d, d)
    own = own.reshape(1, n_prompts, -1, d)
    return feats, own


def _whole(features: Tensor) -> LayerFeatures:
    """Features already held whole (the floor's), as `LayerFeatures`."""
    k, n, j, width = features.shape
    return LayerFeatures(features, lambda block: block, (k, n, j, width))


def fit_token_probes(
    train_states: Tensor,
    train_xs: Tensor,
    test_states: Tensor,
    test_xs: Tensor,
    targets: Sequence[TokenTarget],
    train_ys: Tensor | None = None,
    test_ys: Tensor | None = None,
    *,
    tokens: Sequence[str] = TOKENS,
    n_boot: int = 1000,
    seed: int = 0,
    train_columns: Tensor | None = None,
    test_columns: Tensor | None = None,
) -> pd.DataFrame:
    """Rows (layer, token, target, iterations, r2 with r2_low / r2_high, floor_r2, gain = r2 -
    floor_r2 with a paired interval, penalty): every layer boundary's ridge probe for every target
    at every token kind; states (L+1, 2n, N, D) as `by_position_streams` gives, and for token
    "column" the column tokens' states (L+1, N, n, d, D) as `column_streams` gives. The floor is the
    same probe on the example's own x alone (what any layer holding x_j gives: at large t, S/t is
    near I), at a column token on its e_j."""
    heads = fit_token_heads(train_states, train_xs, targets, train_ys, tokens=tokens, columns=train_columns)
    return score_token_heads(
        heads, test_states, test_xs, targets, test_ys, tokens=tokens, n_boot=n_boot, seed=seed, columns=test_columns
    )


def _targets_at(token: str, xs: Tensor, ys: Tensor | None, targets: Sequence[TokenTarget]) -> dict[str, Tensor]:
    """Each target (N, J, d) at the probed tokens of one kind, by label."""
    examples, _ = _positions(token, xs.shape[1])
    moments = TokenMoments(xs, token, ys)
    return {t.label: moments.target(t)[:, examples].reshape(len(xs), -1, xs.shape[-1]) for t in targets}


def _token_kinds(
    tokens: Sequence[str],
    states: Tensor | LayerStreams,
    columns: Tensor | None,
    xs: Tensor,
    ys: Tensor | None,
    targets: Sequence[TokenTarget],
) -> list[tuple[tuple[LayerFeatures, Tensor], dict[str, Tensor]]]:
    """Per token kind: its features with the floor's, and its targets by label."""
    kinds = [(_features(token, states, columns, xs), _targets_at(token, xs, ys, targets)) for token in tokens]
    release_free_memory()  # the targets' temporaries (every prefix's S/t and its eigenvectors: 0.36 GB at paper scale)
    return kinds


def fit_token_heads(
    states: Tensor | LayerStreams,
    xs: Tensor,
    targets: Sequence[TokenTarget],
    ys: Tensor | None = None,
    *,
    tokens: Sequence[str] = TOKENS,
    columns: Tensor | None = None,
) -> dict[str, dict[str, tuple[RidgeHeads, RidgeHeads]]]:
    """The first half of `fit_token_probes`: per token kind and target label, the ridge heads of
    every layer and the floor's, from the training streams (which the caller may free before the
    test streams exist; `LayerStreams` makes them a block of layers at a time, every token kind
    reading a block before the next is made)."""
    kinds = _token_kinds(tokens, states, columns, xs, ys, targets)
    fits = ridge_fit_kinds([(feats, list(y.values())) for (feats, _), y in kinds])
    out = {}
    for token, ((_, own), y), fitted in zip(tokens, kinds, fits):
        floors = ridge_fit(_whole(own), list(y.values()))  # every target's probes on one factorisation
        out[token] = dict(zip(y, zip(fitted, floors)))
    return out


def score_token_heads(
    heads: dict[str, dict[str, tuple[RidgeHeads, RidgeHeads]]],
    states: Tensor | LayerStreams,
    xs: Tensor,
    targets: Sequence[TokenTarget],
    ys: Tensor | None = None,
    *,
    tokens: Sequence[str] = TOKENS,
    n_boot: int = 1000,
    seed: int = 0,
    columns: Tensor | None = None,
) -> pd.DataFrame:
    """The second half of `fit_token_probes`: the heads of `fit_token_heads` scored on the test streams."""
    kinds = _token_kinds(tokens, states, columns, xs, ys, targets)
    scored = ridge_score_kinds(
        [(feats, [heads[token][t][0] for t in y], list(y.values())) for token, ((feats, _), y) in zip(tokens, kinds)],
        n_boot,
        seed,
    )
    rows = []
    for token, ((_, own), y), fits in zip(tokens, kinds, scored):
        tests, fitted = list(y.values()), [heads[token][t][1] for t in y]
        floors = dict(zip(y, ridge_score(_whole(own), fitted, tests, n_boot, seed)))
        by_label = dict(zip(y, fits))
        for target in targets:
            rows += _target_rows(token, target, by_label[target.label], floors[target.label])
    return pd.DataFrame(rows)


def _target_rows(token: str, target: TokenTarget, fit: tuple, floor: tuple) -> list[dict]:
    """One target's rows at one token kind, a row per layer: R^2 with its 90% interval, and its gain
    over the floor probe with a paired interval (the same test-prompt resamples)."""
    (r2, draws, chosen), (floor_r2, floor_draws, _) = fit, floor
    lo, hi = percentile_interval(draws.T, LEVEL)
    gain_lo, gain_hi = percentile_interval((draws - floor_draws).T, LEVEL)
    return [
        {
            "layer": layer,
            "token": token,
            "target": target.label,
            "iterations": target.iterations if target.name in ITERATED else None,
            "r2": float(r2[layer]),
            "r2_low": float(lo[layer]),
            "r2_high": float(hi[layer]),
            "floor_r2": float(floor_r2[0]),
            "gain": float(r2[layer] - floor_r2[0]),
            "gain_low": float(gain_lo[layer]),
            "gain_high": float(gain_hi[layer]),
            "penalty": float(chosen[layer]),
        }
        for layer in range(len(r2))
    ]


def probed_tokens(model, tokens: Sequence[str]) -> list[str]:
    """The token kinds of a recipe's `tokens` that `model` has: "column" only where it keeps column
    tokens (a planted Newton model; FamilyTraits.n_extra_tokens)."""
    return [t for t in tokens if t != "column" or column_count(model) > 0]


def token_estimates(
    shape,
    points: int,
    n_train: int,
    n_test: int,
    n_boot: int,
    targets: Sequence[TokenTarget],
    n_tokens: int,
    columns: int = 0,
    read: tuple[str, ...] = (),
) -> list[budget.Estimate]:
    """The streams of the training and test prompts (float64, every layer; those whose knob is in
    `read` are read from a store, not run: probe/capture/stream_store.py), the `columns` column
    tokens' states of every prefix run where probed, the Newton targets' iterations (each k from
    scratch, per eigenvalue of every prefix of every prompt: `_newton_iterate`) and the bootstrap of
    every (target x token kind) probe at every layer: the report's check and the study's."""
    probes = len(targets) * n_tokens
    newton = [t.iterations for t in targets if t.name in NEWTON_TARGETS]
    out = [
        budget.prompt_estimate(knob, n, shape, points, 0 if knob in read else 2)
        for knob, n in (("token_probes.prompts", n_train), ("token_probes.test", n_test))
    ]
    if columns:
        per_prompt = 8.0 * (shape.layers + 1) * points * columns * shape.width
        out += [
            budget.Estimate(knob, n, n * per_prompt)
            for knob, n in (("token_probes.prompts", n_train), ("token_probes.test", n_test))
        ]
    if newton:
        flop = 4.0 * sum(newton) * (n_train + n_test) * points * shape.d
        out.append(budget.Estimate("token_probes.iterations", max(newton), 0.0, flop))
    out.append(
        budget.Estimate(
            "token_probes.targets", len(targets), 0.0, _fit_flop(shape, points, n_train, n_test, targets, n_tokens)
        )
    )
    return out + [budget.bootstrap_estimate("similarity.bootstrap", n_boot, n_test, (shape.layers + 1) * probes)]


# the token probes' fits run at a fifth of the report's median rate per counted flop: float64 (about
# half float32's rate) and passes over (penalties x rows x d) arrays and the features' copies that
# the count leaves out. Set from one quiet run of benchmarks/estimates.py --paper-scale (2026-11-29):
# with a weight of 2 the stage ran x3.6 slower than the report's median rate at the default checkpoint
# and x2.0 at Garg et al.'s standard shape; with 5, x1.4 and x1.25 on the same runs
FIT_FLOP_WEIGHT = 5.0


def _fit_flop(shape, points: int, n_train: int, n_test: int, targets: Sequence[TokenTarget], n_tokens: int) -> float:
    """The work beyond the streams: every token kind's targets (an eigendecomposition of each prefix's
    S per prompt, `TokenMoments`) and, per layer boundary and token kind, the ridge probes of
    `ridge_fit_kinds` (the features' Gram matrix, its eigendecomposition and Fc V: 4 M F^2 + 10 F^3
    on M = prompts x examples rows; per target the projections, the leave-one-out fits and leverages
    at every penalty and the head) and `ridge_score_kinds` (each target's test predictions), each
    flop counted FIT_FLOP_WEIGHT times."""
    rows, test_rows, width, d = n_train * points, n_test * points, shape.width, shape.d
    f = min(width, rows)
    basis = 4.0 * rows * f * width + 10.0 * f**3
    per_target = 2.0 * rows * f * (len(ALPHAS) * (d + 1) + 2 * d) + width**3 / 3 + 2.0 * test_rows * width * d
    moments = 10.0 * (n_train + n_test) * points * d**3
    return FIT_FLOP_WEIGHT * n_tokens * (moments + (shape.layers + 1) * (basis + len(targets) * per_target))


def token_probe_study(
    model,
    task: TaskConfig,
    targets: Sequence[TokenTarget],
    n_train: int = 512,
    n_test: int = 256,
    seed: int = 0,
    device: str = "cpu",
    tokens: Sequence[str] = ("x", "y"),
    n_boot: int = 1000,
    streams: StreamReader | None = None,
) -> pd.DataFrame:
    """`fit_token_probes` on the model's streams over fresh prompts of its task (the probes' train
    and test streams of probe/core/seeds.py), in float64; token "column" needs a model that keeps
    column tokens (`probed_tokens`). `streams`: a report's stream store, from which streams the probe
    study kept are read instead of computed (probe/capture/stream_store.py). On models that resume a
    forward from a layer (GPT-2) the features, targets and ridge fits are on `device`; otherwise the
    whole streams are captured to the host and fitted there."""
    check_model(model)
    device = check_device(device)
    n_train, n_test = positive_int(n_train, "prompts"), positive_int(n_test, "test prompts")
    n_columns = column_count(model) if "column" in tokens else 0
    if "column" in tokens and not n_columns:
        raise ConfigError(
            f"this {type(model).__name__} keeps no column tokens (only planted linear-attention Newton models "
            "do): probe its x and y tokens"
        )
    budget.check(
        token_estimates(shape_of(model), task.n_points, n_train, n_test, n_boot, targets, len(tokens), n_columns)
    )
    prompts = [
        sample_prompts(task, size, generator=stream_generator(seed, stream))
        for size, stream in ((n_train, Stream.PROBE_TRAIN), (n_test, Stream.PROBE_TEST))
    ]

    def states(p, stream: Stream) -> tuple[Tensor | LayerStreams, Tensor | None, Tensor, Tensor]:
        """The streams (a block of layers at a time where the model resumes a forward), the column
        tokens' states, and the prompts on the device the features are on."""
        if "column" not in tokens and getattr(model, "key_value_cache", False):
            share = None if streams is None else streams.share(stream, len(p.xs))
            layers = LayerStreams(model, p.xs, p.ys, device, share=share, blocks_on_device=True)
            return layers, None, p.xs.to(device), p.ys.to(device)
        whole = by_position_streams(model, p.xs, p.ys, device, dtype=torch.float64)
        return whole, column_streams(model, p.xs, p.ys, device) if "column" in tokens else None, p.xs, p.ys

    train, columns, xs, ys = states(prompts[0], Stream.PROBE_TRAIN)
    heads = fit_token_heads(train, xs, targets, ys, tokens=tokens, columns=columns)
    del train, columns  # the training streams go before the test streams exist (float64 streams are GBs)
    test, columns, xs, ys = states(prompts[1], Stream.PROBE_TEST)
    return score_token_heads(heads, test, xs, targets, ys, tokens=tokens, n_boot=n_boot, seed=seed, columns=columns)
