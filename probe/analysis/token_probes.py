"""Probes for the state a learner keeps in the tokens (issue 60 item 2): per token, a function of
the second moment S the token can see, applied to its own x.

A Newton-type learner keeps a d x d matrix built from S = X^T X; GD keeps a d-vector. The seeds'
construction of Iterative Newton (seed 003 Thm. 1, App. B) keeps M_k x_i in example i's token
(probe/models/constructions/newton_relu.py), and M_1 = 2 alpha S - alpha^2 S^3 (eq. 8). So the
targets, per token of example j (0-indexed), with S the normalised moment the token can see
(causality): the x token of example j sees the j examples before it (S_j / j), the y token sees
example j too (S_{j+1} / (j + 1)):

    sx          (S/t) x_j
    s3x         (S/t)^3 x_j
    newton_mx   M_k x_j, M_0 = alpha S/t, M_{k+1} = 2 M_k - M_k (S/t) M_k (seed 003 eq. 8), for each
                k of `iterations`; alpha a fixed number (a planted model's) or "spectral"
                (1 / lambda_max(S/t)^2, the learners' default rule)
    w_newton    the Newton weight iterate M_k b, b = X^T y / t over the same examples, for each k
    w_gd        the GD weight iterate after k steps from 0 on ||y - X w||^2 / (2t) (seed 003 eq. 6),
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
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from ..capture.streams import by_position_streams, column_count, column_streams
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.stages import AnalysisStage, register_stage
from ..core.validate import check_device, check_model, positive_int
from ..data.config import TaskConfig
from ..data.tasks import sample_prompts
from ..learners.iterative import newton_alpha
from ..models.sizes import shape_of
from .ridge import choose_penalty, ridge_head, ridge_penalties
from .stats import percentile_interval, resamples

TOKEN_TARGETS = ("sx", "s3x", "newton_mx", "w_newton", "w_gd", "w_ols")
TOKEN_KINDS = ("x", "y", "column")  # column: the column tokens a planted Newton model keeps
TOKENS = TOKEN_KINDS
ITERATED = ("newton_mx", "w_newton", "w_gd")  # targets with an iteration count
ALPHAS = (1e-8, 1e-6, 1e-4, 1e-2, 1.0)  # ridge penalties, fractions of the mean eigenvalue
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
    s = token_moments(xs, token)
    d = xs.shape[-1]
    # the vectors the matrix targets apply to, as columns: x_j, or e_1..e_d at the column tokens
    x = torch.eye(d, dtype=s.dtype, device=s.device) if token == "column" else xs.double().unsqueeze(-1)
    if target.name.startswith("w_"):
        if ys is None:
            raise ConfigError(f"token target {target.name} needs the labels ys")
        w = _weights(s, token_moments_b(xs, ys, token), target)
        return w.unsqueeze(-2).expand(*w.shape[:-1], d, d) if token == "column" else w
    if target.name == "sx":
        out = s @ x
    elif target.name == "s3x":
        out = s @ s @ s @ x
    elif target.name == "newton_mx":
        lam, vecs = _spectrum(s)
        out = vecs @ (_newton_iterate(lam, target).unsqueeze(-1) * (vecs.transpose(-1, -2) @ x))
    else:
        raise ConfigError(f"unknown token target {target.name!r}; known: {', '.join(TOKEN_TARGETS)}")
    return out.transpose(-1, -2) if token == "column" else out.squeeze(-1)


def _spectrum(s: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues (clamped at 0: S/t is a Gram matrix) and eigenvectors of S/t."""
    lam, vecs = torch.linalg.eigh(s)
    return lam.clamp_min(0), vecs


def _newton_iterate(lam: Tensor, target: TokenTarget) -> Tensor:
    """M_k per eigenvalue of S/t: m_0 = alpha lambda, m_(k+1) = 2 m_k - lambda m_k^2 (seed 003 eq. 8)."""
    ones = torch.ones(lam.shape[-2], dtype=lam.dtype, device=lam.device)
    m = newton_alpha(lam, target.alpha, ones) * lam
    for _ in range(target.iterations):
        m = 2 * m - lam * m**2
    return m


def _weights(s: Tensor, b: Tensor, target: TokenTarget) -> Tensor:
    """w_newton, w_gd or w_ols from the normalised moments, per eigenvalue of S/t (zero eigenvalues
    give 0, the pseudo-inverse's convention)."""
    lam, vecs = _spectrum(s)
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
        gain = (1 - (1 - eta * lam) ** target.iterations) * inverse  # k steps from 0 (seed 003 eq. 6)
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


def _features(token: str, states: Tensor, columns: Tensor | None, xs: Tensor) -> tuple[Tensor, Tensor]:
    """A token kind's probe features (L+1, N, J, D) and the floor's (1, N, J, d): the example's own
    x, or at column token j the one-hot e_j; column tokens are J = runs x d rows per prompt."""
    examples, pos = _positions(token, xs.shape[1])
    if token != "column":
        return states[:, pos].double().permute(0, 2, 1, 3), xs[:, examples].double().unsqueeze(0)
    if columns is None:
        raise ConfigError("token 'column' needs the column tokens' states (probe.capture.streams.column_streams)")
    layers, n_prompts, _, extra, width = columns.shape
    d = xs.shape[-1]
    if extra != d:
        raise ConfigError(
            f"the model keeps {extra} column tokens for d = {d}: column tokens hold one column of a d x d matrix each"
        )
    feats = columns[:, :, examples].double().reshape(layers, n_prompts, -1, width)
    own = torch.eye(d, dtype=torch.float64).expand(1, n_prompts, len(examples), d, d).reshape(1, n_prompts, -1, d)
    return feats, own


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
    n = train_xs.shape[1]
    rows = []
    for token in tokens:
        examples, _ = _positions(token, n)
        (feat_train, own_train), (feat_test, own_test) = (
            _features(token, states, columns, xs)
            for states, columns, xs in ((train_states, train_columns, train_xs), (test_states, test_columns, test_xs))
        )
        for target in targets:
            y_train, y_test = (
                token_targets(xs, target, token, ys)[:, examples].reshape(len(xs), -1, xs.shape[-1])
                for xs, ys in ((train_xs, train_ys), (test_xs, test_ys))
            )
            r2, draws, chosen = _ridge_r2(feat_train, y_train, feat_test, y_test, n_boot, seed)
            floor, floor_draws, _ = _ridge_r2(own_train, y_train, own_test, y_test, n_boot, seed)
            lo, hi = percentile_interval(draws.T, LEVEL)
            gain_lo, gain_hi = percentile_interval((draws - floor_draws).T, LEVEL)  # paired: the same resamples
            rows += [
                {
                    "layer": layer,
                    "token": token,
                    "target": target.label,
                    "iterations": target.iterations if target.name in ITERATED else None,
                    "r2": float(r2[layer]),
                    "r2_low": float(lo[layer]),
                    "r2_high": float(hi[layer]),
                    "floor_r2": float(floor[0]),
                    "gain": float(r2[layer] - floor[0]),
                    "gain_low": float(gain_lo[layer]),
                    "gain_high": float(gain_hi[layer]),
                    "penalty": float(chosen[layer]),
                }
                for layer in range(len(r2))
            ]
    return pd.DataFrame(rows)


def _ridge_r2(f_train, y_train, f_test, y_test, n_boot, seed) -> tuple[Tensor, Tensor, Tensor]:
    """Ridge probes of a batch of K feature sets (K, N, J, F) for one target (N, J, d) at once:
    held-out R^2 (K,), its resamples over test prompts (K, n_boot), and the penalties chosen."""
    k, n_train, j, width = f_train.shape
    fc = f_train.reshape(k, n_train * j, width)
    f_mean = fc.mean(1, keepdim=True)
    y = y_train.reshape(1, n_train * j, -1).expand(k, -1, -1)
    y_mean = y.mean(1, keepdim=True)
    fc, yc = fc - f_mean, y - y_mean
    penalties = ridge_penalties(fc, ALPHAS)
    best, _ = choose_penalty(fc, yc, penalties)
    chosen = penalties.gather(1, best.unsqueeze(1)).squeeze(1)
    coef = ridge_head(fc, yc, chosen)  # (K, F, d)
    pred = (f_test - f_mean.unsqueeze(1)) @ coef.unsqueeze(1) + y_mean.unsqueeze(1)  # (K, N_test, J, d)
    sse = (pred - y_test).pow(2).sum((2, 3))  # (K, N_test): per prompt, so prompts resample
    sst = (y_test - y_mean.unsqueeze(1)).pow(2).sum((2, 3)).expand_as(sse)
    draws = torch.cat(
        [1 - sse[:, idx].sum(-1) / sst[:, idx].sum(-1) for idx in resamples(sse.shape[1], n_boot, seed, 100)], 1
    )
    return 1 - sse.sum(1) / sst.sum(1), draws, chosen


def probed_tokens(model, tokens: Sequence[str]) -> list[str]:
    """The token kinds of a recipe's `tokens` that `model` has: "column" only where it keeps column
    tokens (a planted Newton model; FamilyTraits.n_extra_tokens)."""
    return [t for t in tokens if t != "column" or column_count(model) > 0]


def token_estimates(
    shape, points: int, n_train: int, n_test: int, n_boot: int, probes: int, columns: int = 0
) -> list[budget.Estimate]:
    """The streams of the training and test prompts (float64, every layer), the `columns` column
    tokens' states of every prefix run where probed, and the bootstrap of `probes` (target x token
    kind) probes at every layer: the report's check and the study's."""
    out = [
        budget.prompt_estimate("token_probes.prompts", n_train, shape, points, 2),
        budget.prompt_estimate("token_probes.test", n_test, shape, points, 2),
    ]
    if columns:
        per_prompt = 8.0 * (shape.layers + 1) * points * columns * shape.width
        out += [
            budget.Estimate(knob, n, n * per_prompt)
            for knob, n in (("token_probes.prompts", n_train), ("token_probes.test", n_test))
        ]
    return out + [budget.bootstrap_estimate("similarity.bootstrap", n_boot, n_test, (shape.layers + 1) * probes)]


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
) -> pd.DataFrame:
    """`fit_token_probes` on the model's streams over fresh prompts of its task (the probes' train
    and test streams of probe/core/seeds.py), in float64; token "column" needs a model that keeps
    column tokens (`probed_tokens`)."""
    check_model(model)
    device = check_device(device)
    n_train, n_test = positive_int(n_train, "prompts"), positive_int(n_test, "test prompts")
    columns = column_count(model) if "column" in tokens else 0
    if "column" in tokens and not columns:
        raise ConfigError(
            f"this {type(model).__name__} keeps no column tokens (only planted linear-attention Newton models "
            "do): probe its x and y tokens"
        )
    budget.check(
        token_estimates(shape_of(model), task.n_points, n_train, n_test, n_boot, len(targets) * len(tokens), columns)
    )
    prompts = [
        sample_prompts(task, size, generator=stream_generator(seed, stream))
        for size, stream in ((n_train, Stream.PROBE_TRAIN), (n_test, Stream.PROBE_TEST))
    ]
    states = [by_position_streams(model, p.xs, p.ys, device, dtype=torch.float64) for p in prompts]
    cols = [column_streams(model, p.xs, p.ys, device) if "column" in tokens else None for p in prompts]
    return fit_token_probes(
        states[0],
        prompts[0].xs,
        states[1],
        prompts[1].xs,
        targets,
        prompts[0].ys,
        prompts[1].ys,
        tokens=tokens,
        n_boot=n_boot,
        seed=seed,
        train_columns=cols[0],
        test_columns=cols[1],
    )


# ---------------------------------------------------------------- the report stage (probe/core/stages.py)


def _positive_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


@dataclass
class TokenProbeSettings(Section):
    """Per-token state probes (this module, issue 60): recipe section [token_probes],
    `icl-probe token-probes`."""

    SECTION = "token_probes"
    enabled: bool = setting(True, "probe each example's tokens for S x, S^3 x and Newton's M_k x in reports")
    targets: tuple[str, ...] = setting(
        TOKEN_TARGETS[:3], "targets (also w_newton, w_gd, w_ols)", TOKEN_TARGETS, nonempty=True, noun="token target"
    )
    tokens: tuple[str, ...] = setting(
        TOKEN_KINDS,
        "token kinds probed (column: where the model keeps column tokens, a planted Newton model; left out elsewhere)",
        TOKEN_KINDS,
        nonempty=True,
        noun="token",
    )
    iterations: tuple[int, ...] = setting(tuple(range(9)), "Newton iteration counts k of newton_mx", minimum=0)
    alpha: str = setting(
        "auto",
        "newton_mx's M_0 = alpha S/t: auto (a planted Newton model's own alpha, else spectral), spectral, or a number",
    )
    gd_steps: tuple[int, ...] = setting((1, 2, 4, 8, 16, 32, 64), "GD step counts k of w_gd", minimum=0)
    eta: str = setting(
        "auto", "w_gd's step: auto (a planted GD model's own step, else 1 / lambda_max(S/t)) or a number"
    )
    prompts: int = setting(512, "training prompts")
    test: int = setting(256, "held-out prompts")

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, rules in (("eta", ("auto",)), ("alpha", ("auto", "spectral"))):
            if getattr(self, key) not in rules and not _positive_number(getattr(self, key)):
                raise ConfigError(
                    f"token_probes.{key} must be {', '.join(rules)} or a positive number, got {getattr(self, key)!r}"
                )

    def eta_for(self, model_config) -> float | str:
        """GD's step for a checkpoint: "auto" is a planted GD model's own fixed step, else 1/lambda_max."""
        if self.eta == "auto":
            return float(model_config.planted_scale) if model_config.planted == "gd" else "auto"
        return float(self.eta)

    def alpha_for(self, model_config) -> float | str:
        """The alpha rule for a checkpoint: "auto" is a planted Newton model's own fixed alpha."""
        if self.alpha == "auto":
            planted = model_config.planted in ("newton", "newton-relu")
            return float(model_config.planted_scale) if planted else "spectral"
        return self.alpha if self.alpha == "spectral" else float(self.alpha)


@dataclass
class TokenProbeSeries:
    """One per-token probe by layer: held-out R^2 and its gain over the floor (the same probe on the
    example's own x; at a column token, on its e_j), each with a 90% interval (the gain's paired)."""

    token: str
    target: str
    iterations: int | None
    floor_r2: float
    r2: list[float]
    r2_low: list[float]
    r2_high: list[float]
    gain: list[float]
    gain_low: list[float]
    gain_high: list[float]


@dataclass
class TokenProbes:
    """What each example's tokens hold of the state a learner keeps, layer by layer."""

    layer: list[int]
    series: list[TokenProbeSeries]
    definition: str = (
        "ridge read-out of each example token's residual stream, one map per layer and token kind, of (S/t) x, "
        "(S/t)^3 x and Newton's M_k x with S the normalised moment the token can see (at a planted Newton model's "
        "column token j: the matrices' column j); R^2 on held-out prompts"
    )


def token_probe_block(table: pd.DataFrame) -> TokenProbes:
    """summary.json's block: every probe's series by layer (rows of `fit_token_probes`)."""
    series = []
    for (token, target), rows in table.groupby(["token", "target"], sort=False):
        rows = rows.sort_values("layer")
        k = rows.iterations.iloc[0]
        series.append(
            TokenProbeSeries(
                token=str(token),
                target=str(target),
                iterations=None if pd.isna(k) else int(k),
                floor_r2=float(rows.floor_r2.iloc[0]),
                **{c: [float(v) for v in rows[c]] for c in COLUMNS},  # NaN: null in summary.json (strict)
            )
        )
    return TokenProbes(sorted(int(v) for v in table.layer.unique()), series)


COLUMNS = ("r2", "r2_low", "r2_high", "gain", "gain_low", "gain_high")


def _run(c) -> dict[str, pd.DataFrame]:
    """The report stage: the [token_probes] settings on the report's checkpoint."""
    s = c.recipe.token_probes
    targets = settings_targets(s, c.ckpt.config.model)
    tokens = probed_tokens(c.ckpt.model, s.tokens)
    if not tokens:
        raise ConfigError(
            f"token_probes.tokens = {list(s.tokens)}: this {type(c.ckpt.model).__name__} keeps no column tokens "
            "(only planted linear-attention Newton models do): probe its x and y tokens"
        )
    return {
        "token_probes": token_probe_study(
            c.ckpt.model,
            c.ckpt.config.task,
            targets,
            s.prompts,
            s.test,
            c.recipe.prompts.seed,
            c.device,
            tokens,
            c.recipe.similarity.bootstrap,
        )
    }


def _estimates(recipe, ckpt) -> list[budget.Estimate]:
    s = recipe.token_probes
    n_targets, tokens = len(settings_targets(s, ckpt.config.model)), probed_tokens(ckpt.model, s.tokens)
    columns = column_count(ckpt.model) if "column" in tokens else 0
    shape, points = shape_of(ckpt.config.model), ckpt.config.task.n_points
    return token_estimates(
        shape, points, s.prompts, s.test, recipe.similarity.bootstrap, n_targets * len(tokens), columns
    )


def _figures(tables: dict[str, pd.DataFrame], fig_dir: Path, recipe) -> dict[str, Path]:
    return {"token_probes": token_probe_figure(tables["token_probes"], fig_dir / "token_probes")[0]}


def token_probe_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """R^2 of each per-token probe by layer (probe/analysis/token_probes.py), one panel per token
    kind, 90% bands; Newton's M_k x in shades of one colour by k."""
    plt = pyplot()
    tokens = list(dict.fromkeys(table.token))
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.8 * len(tokens), 3.4), squeeze=False, sharey=True)
    newton = sorted(table.iterations.dropna().unique())
    shades = plt.get_cmap("Blues")
    for ax, token in zip(axes[0], tokens):
        part = table[table.token == token]
        for i, (name, r) in enumerate(part.groupby("target", sort=False)):
            r = r.sort_values("layer")
            k = r.iterations.iloc[0]
            color = shades(0.35 + 0.6 * newton.index(k) / max(len(newton) - 1, 1)) if pd.notna(k) else f"C{i + 1}"
            ax.plot(r.layer, r.r2, "-o", ms=3, color=color, label=name)
            ax.fill_between(r.layer, r.r2_low, r.r2_high, color=color, alpha=0.12)
        ax.set(xlabel="layer boundary", title=f"{token} tokens", ylim=(min(-0.05, part.r2.min()), 1.02))
    axes[0][0].set_ylabel("held-out R^2")
    legend_outside(axes[0][-1], 7)
    return save_png(fig, stem)


def _best(block: TokenProbes, series: list[TokenProbeSeries], by: str) -> tuple[TokenProbeSeries, int]:
    """The series and layer index with the largest `by` (r2 or gain)."""
    return max(((s, i) for s in series for i in range(len(block.layer))), key=lambda p: getattr(p[0], by)[p[1]])


FAMILIES = (("sx", "S x"), ("s3x", "S^3 x"), ("newton_mx", "M_k x"))


def _findings(block: TokenProbes, titles) -> str | None:
    """Per token kind: the largest gain over the floor (the example x alone; at a column token its
    e_j) of S x and S^3 x, and of Newton's M_k x (over k); at column tokens, the matrices' columns."""
    parts = []
    for token in dict.fromkeys(s.token for s in block.series):
        column = token == "column"
        floor = "e_j alone" if column else "x alone"
        for name, words in FAMILIES:
            words = words.replace(" x", " columns") if column else words
            series = [s for s in block.series if s.token == token and s.target.startswith(name)]
            if not series:
                continue
            best, i = _best(block, series, "gain")
            k = "" if best.iterations is None else f", k = {best.iterations}"
            parts.append(
                f"{words} at {token} tokens: R^2 {best.r2[i]:.2f} at layer {block.layer[i]}{k}, "
                f"{best.gain[i]:+.2f} [{best.gain_low[i]:+.2f}, {best.gain_high[i]:+.2f}] over {floor} "
                f"({best.floor_r2:.2f})"
            )
    intro = "State in the tokens (the largest gain over a probe of what the token alone holds): "
    return intro + "; ".join(parts) + "." if parts else None


def _page_tables(block: TokenProbes) -> dict[str, pd.DataFrame]:
    """Per token kind and target family, the layer with the largest gain over the floor."""
    rows = []
    for token in dict.fromkeys(s.token for s in block.series):
        for name, words in FAMILIES:
            series = [s for s in block.series if s.token == token and s.target.startswith(name)]
            if series:
                s, i = _best(block, series, "gain")
                rows.append(
                    {
                        "token": token,
                        "target": words.replace(" x", " columns") if token == "column" else words,
                        "k": "" if s.iterations is None else s.iterations,
                        "layer": block.layer[i],
                        "R^2": s.r2[i],
                        "floor R^2": s.floor_r2,
                        "gain": s.gain[i],
                        "gain 90%": f"[{s.gain_low[i]:+.3f}, {s.gain_high[i]:+.3f}]",
                    }
                )
    return {"The largest gain over the floor per token kind and target (Newton's M_k x: over k)": pd.DataFrame(rows)}


HELD = 0.99  # R^2 at which a token holds Newton's M_k x as the seeds' construction does
VALIDATED_ON = (
    "planted Newton and Newton-ReLU (M_k x held at R^2 1 where the constructions write it: newton); planted GD "
    "(nothing beyond x: undecided, never newton): tests/test_token_probes.py, tests/test_evidence.py"
)


def _evidence(block: TokenProbes, a: str, b: str) -> list[dict]:
    """The evidence table's row for Newton against GD: newton where some layer's token holds M_k x at
    R^2 >= HELD beyond what the token alone gives; otherwise undecided (a model without that state
    is not thereby GD)."""
    newton = [s for s in block.series if s.target.startswith("newton_mx")]
    if {a, b} != {"newton", "gd"} or not newton:
        return []
    s, i = _best(block, newton, "r2")
    held = s.r2[i] >= HELD and s.gain_low[i] > 0
    return [
        {
            "instrument": "state in the tokens",
            "favours": "newton" if held else None,
            "effect": f"best M_k x probe: R^2 {s.r2[i]:.3f} [{s.r2_low[i]:.3f}, {s.r2_high[i]:.3f}] at layer "
            f"{block.layer[i]}, k = {s.iterations}, {s.token} tokens ({'e_j' if s.token == 'column' else 'x'} alone "
            f"{s.floor_r2:.2f}); held as the construction holds it at R^2 >= {HELD}",
            "validated_on": VALIDATED_ON,
            "cannot_tell_apart": "a model without a per-token Newton state may keep it in another form (spread over "
            "tokens, nonlinear): absence never reads as GD",
        }
    ]


DESCRIPTION = (
    "What each example's tokens hold of the state a learner keeps: a Newton-type learner builds a d x d matrix "
    "from S = X^T X (the seeds' construction keeps M_k x_i in example i's token; M_1 = 2 alpha S - alpha^2 S^3), "
    "GD keeps a d-vector. Per layer boundary and token kind (x token: the examples before it; y token: through "
    "it; a planted Newton model's column token j: column j of the matrices), one ridge map reads (S/t) x, "
    "(S/t)^3 x and M_k x (M_0 = alpha S/t) from the token's stream; held-out R^2 with 90% bands. At large t S/t "
    "is near I, so what the token alone holds (its x, or e_j) already gives part of S x: each layer is compared "
    "with that floor (the gain, with a paired interval, is in summary.json and data/token_probes.csv). Known "
    "answers: the planted Newton models hold M_k x exactly (R^2 1) where their constructions write it; the "
    "planted GD model holds no more than its raw tokens."
)

TOKEN_PROBES = register_stage(
    AnalysisStage(
        name="token_probes",
        settings=TokenProbeSettings,
        run=_run,
        block=TokenProbes,
        summarise=lambda tables, recipe: token_probe_block(tables["token_probes"]),
        title="State in the tokens",
        description=DESCRIPTION,
        figures=_figures,
        estimates=_estimates,
        findings=_findings,
        tables=_page_tables,
        evidence=_evidence,
        reads=("similarity",),
        flags=(("test", "test-prompts"),),
        captions=(
            (
                "token_probes",
                "Held-out R^2 per layer boundary, one panel per token kind; Newton's M_k x in blue shades by k.",
            ),
        ),
    )
)
