"""Attention-pooled probes (seed 002 §5, eq. 20-22, App. C.8), fitted as one batched model.

A probe for (layer l, prefix t, target) reads the hidden states h_1..h_P of the first t
examples' tokens (P = 2t), pools them with learned position weights alpha = softmax(s), maps
them with W_v, and regresses the target with a linear head or a 2-layer GELU MLP:

    target ~ FF( W_v sum_p alpha_p h_p ).

W_v is followed by the head's first linear map, so the two are one linear map; it is stored
folded (same function class, fewer parameters and a third of the compute).

Targets: the moment vector X^T y and the least-squares weights w_OLS of the prefix. Each
target coordinate is standardised with the training prompts' mean and standard deviation per
(prefix, coordinate); R^2 is scikit-learn's r2_score (uniform average over coordinates).
Every (layer, prefix, target) probe trains at once: parameters carry a leading probe axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_array, check_is_fitted, validate_data
from torch import Tensor, nn

from ..errors import ConfigError
from ..learners import prefix_moments
from ..learners.closed_form import least_squares_weights
from ..stats import r2_score


def probe_targets(xs: Tensor, ys: Tensor, name: str) -> Tensor:
    """(B, n, d): the target after each prefix t (t examples seen), for 'xty' or 'w_ols'."""
    xs, ys = xs.double(), ys.double()
    if name == "xty":
        return prefix_moments(xs, ys)[1]
    if name == "w_ols":
        return least_squares_weights(xs, ys)
    raise ValueError(f"unknown probe target {name!r} (xty, w_ols)")


class ProbeGrid(nn.Module):
    """L x M independent attention-pooled probes: M probes (prefix, target) on each of L layers,
    over P positions of width D, outputs of width d. Parameters carry the flat probe axis G = L*M."""

    def __init__(
        self,
        n_layers: int,
        n_per_layer: int,
        n_positions: int,
        width: int,
        out_dim: int,
        kind: str,
        hidden: int = 128,
        seed: int = 0,
    ):
        super().__init__()
        self.n_layers, self.n_per_layer = n_layers, n_per_layer
        self.groups: list[tuple[slice, int]] = []  # (probes of each layer, positions they read), see fit_probes
        n_probes = n_layers * n_per_layer
        # every probe of the grid starts from the same draw (seeded by `seed`), so a probe trained
        # alone (AttentionPoolProbe) starts where it would in any grid
        g = torch.Generator().manual_seed(seed)
        init = lambda n, *shape, fan: (torch.randn(*shape, generator=g) / math.sqrt(fan)).expand(n, *shape).clone()
        self.kind = kind
        self.scores = nn.Parameter(torch.zeros(n_probes, n_positions))  # s, uniform attention at start
        if kind == "linear":  # W_v folded into the head: (G, D, d)
            self.head = nn.ParameterList(
                [
                    nn.Parameter(init(n_probes, width, out_dim, fan=width)),
                    nn.Parameter(torch.zeros(n_probes, 1, out_dim)),
                ]
            )
        elif kind == "mlp":  # W_v folded into the first layer: (G, D, hidden)
            self.head = nn.ParameterList(
                [
                    nn.Parameter(init(n_probes, width, hidden, fan=width)),
                    nn.Parameter(torch.zeros(n_probes, 1, hidden)),
                    nn.Parameter(init(n_probes, hidden, out_dim, fan=hidden)),
                    nn.Parameter(torch.zeros(n_probes, 1, out_dim)),
                ]
            )
        else:
            raise ValueError(f"unknown probe kind {kind!r} (linear, mlp)")

    def attention(self, mask: Tensor) -> Tensor:
        """alpha (G, P): softmax of the scores over each probe's allowed positions (mask (G, P))."""
        return torch.softmax(self.scores.masked_fill(~mask, float("-inf")), dim=-1)

    def forward(self, states: Tensor, mask: Tensor, layout: str = "lnpd") -> Tensor:
        """states (L, N, P, D) -- or (L, P, N, D) with layout "lpnd", which pools with one bmm --
        shared by the layer's M probes -> predictions (G, N, d)."""
        alpha = self.attention(mask).view(self.n_layers, self.n_per_layer, -1)
        if layout == "lpnd":
            _, n_pos, n, width = states.shape
            # probes that read only the first P' positions pool over those alone (one bmm per group)
            groups = self.groups or [(slice(0, self.n_per_layer), n_pos)]
            pooled = [torch.bmm(alpha[:, rows, :used], states[:, :used].flatten(2)) for rows, used in groups]
            v = torch.cat(pooled, dim=1).view(-1, n, width)  # (G, N, D)
        else:
            v = torch.einsum("lmp,lnpd->lmnd", alpha, states).flatten(0, 1)  # (G, N, D), no per-probe copies
        if self.kind == "linear":
            return torch.bmm(v, self.head[0]) + self.head[1]
        hidden = nn.functional.gelu(torch.bmm(v, self.head[0]) + self.head[1])
        return torch.bmm(hidden, self.head[2]) + self.head[3]


def _prefix_groups(prefixes: list[int]) -> list[tuple[slice, int]]:
    """Runs of consecutive probes with the same prefix t, each reading 2t positions."""
    groups, start = [], 0
    for i in range(1, len(prefixes) + 1):
        if i == len(prefixes) or prefixes[i] != prefixes[start]:
            groups.append((slice(start, i), 2 * prefixes[start]))
            start = i
    return groups


@dataclass
class _Fit:
    """One training run of a probe grid: per probe (L+1, M) its validation R^2, the step of its
    best validation score, whether it stopped before the step limit, and test predictions."""

    val_r2: Tensor
    steps: Tensor
    converged: Tensor
    pred: Tensor | None  # (L+1, M, N_test, d), when test states were given
    alpha: Tensor  # (L+1, M, P)
    grid: ProbeGrid


def _predict(grid: ProbeGrid, states_by_position: Tensor, mask: Tensor, shape: tuple[int, int, int]) -> Tensor:
    with torch.no_grad():
        n_layers, m, d = shape
        return grid(states_by_position, mask, layout="lpnd").view(n_layers, m, -1, d)


def _minibatches(n: int, batch_size: int, seed: int) -> Iterator[slice]:
    """Endless minibatches of prompts as contiguous blocks [i, i + B): every epoch visits the blocks
    in a fresh random order. Prompts are i.i.d. draws, so fixed blocks are random minibatches, and
    a block of the by-position layout (L, P, N, D) is a view that bmm reads in place (no gather)."""
    b = min(batch_size, n)
    starts = torch.arange(0, n - b + 1, b)
    g = torch.Generator().manual_seed(seed)
    while True:
        for i in starts[torch.randperm(len(starts), generator=g)].tolist():
            yield slice(i, i + b)


def _train_until_stable(
    grid: ProbeGrid,
    fit_states: Tensor,
    y_fit: Tensor,
    val_states: Tensor,
    y_val: Tensor,
    mask: Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    eval_every: int,
    patience: int,
    seed: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Adam on minibatches of prompts; every `eval_every` steps each probe's validation R^2 is
    computed and its parameters kept when they improve it by more than 1e-4. A probe has
    converged once `patience` evaluations in a row bring no improvement, and its kept parameters
    are final from then on (so a probe's result does not depend on the others in its grid);
    training stops when all have converged, or at `steps`. The grid ends with every probe's best
    parameters.
    States are by position, (L+1, P, N, D). Returns (best validation R^2, step of the best,
    converged), each (L+1, M)."""
    n_layers, m, d = grid.n_layers, y_fit.shape[0], y_fit.shape[-1]
    opt = torch.optim.Adam(grid.parameters(), lr=lr)
    batches = _minibatches(fit_states.shape[2], batch_size, seed)
    best = torch.full((n_layers * m,), -math.inf)
    best_step, stale = torch.zeros(n_layers * m, dtype=torch.long), torch.zeros(n_layers * m, dtype=torch.long)
    kept = [p.detach().clone() for p in grid.parameters()]
    for step in range(1, steps + 1):
        rows = next(batches)
        pred = grid(fit_states[:, :, rows], mask, layout="lpnd").view(n_layers, m, -1, d)
        loss = ((pred - y_fit[:, rows]) ** 2).mean(dim=(2, 3)).sum()  # independent probes
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % eval_every and step != steps:
            continue
        val = r2_score(y_val.unsqueeze(0), _predict(grid, val_states, mask, (n_layers, m, d))).mean(-1).flatten().cpu()
        better = (val > best + 1e-4) & (stale < patience)
        best, best_step = torch.where(better, val, best), torch.where(better, step, best_step)
        stale = torch.where(better, 0, stale + 1)
        for keep, param in zip(kept, grid.parameters()):
            keep[better.to(keep.device)] = param.detach()[better.to(keep.device)]
        if bool((stale >= patience).all()):
            break
    with torch.no_grad():
        for keep, param in zip(kept, grid.parameters()):
            param.copy_(keep)
    shape = (n_layers, m)
    return best.view(shape), best_step.view(shape), (stale >= patience).view(shape)


def _fit_once(
    states: tuple[Tensor, Tensor, Tensor | None],
    targets: tuple[Tensor, Tensor],
    combos,
    kind: str,
    lr: float,
    hidden: int,
    opts: dict,
) -> _Fit:
    """Train one grid (one learning rate and width) with early stopping; predict the test prompts."""
    fit_states, val_states, test_states = states
    y_fit, y_val = targets
    n_layers, n_pos, _, width = fit_states.shape
    m, d = len(combos), y_fit.shape[-1]
    prefixes = torch.tensor([t for t, _ in combos]).repeat(n_layers)  # (G,)
    mask = (torch.arange(n_pos).view(1, -1) < (2 * prefixes).view(-1, 1)).to(fit_states.device)
    grid = ProbeGrid(n_layers, m, n_pos, width, d, kind, hidden=hidden, seed=opts["seed"])
    grid = grid.to(device=fit_states.device, dtype=fit_states.dtype)
    grid.groups = _prefix_groups([t for t, _ in combos])
    val_r2, steps, converged = _train_until_stable(grid, fit_states, y_fit, val_states, y_val, mask, lr=lr, **opts)
    pred = None if test_states is None else _predict(grid, test_states, mask, (n_layers, m, d)).cpu().double()
    alpha = grid.attention(mask).detach().cpu().view(n_layers, m, -1)
    return _Fit(val_r2, steps, converged, pred, alpha, grid)


def fit_probes(
    train_states: Tensor,
    train_targets: dict[str, Tensor],
    test_states: Tensor,
    test_targets: dict[str, Tensor],
    combos: Sequence[tuple[int, str]],
    kind: str,
    steps: int = 300,
    lr: float | Sequence[float] = 1e-3,
    batch_size: int = 128,
    seed: int = 0,
    device: str = "cpu",
    hidden: int | Sequence[int] = 128,
    eval_every: int = 25,
    patience: int = 5,
    val_fraction: float = 0.2,
    layout: str = "lnpd",
    precision: str = "float64",
) -> pd.DataFrame:
    """Train a probe for every layer x (prefix, target) combination at once; score on held-out prompts.

    states (L+1, N, 2n, D) at all token positions, or (L+1, 2n, N, D) with layout "lpnd" (used in
    place, no copy: `by_position_streams`); targets name -> (N, n, d); combos [(t, target)].
    The last `val_fraction` of the training prompts is held out for validation: early stopping
    (see _train_until_stable) and the choice, per probe, of the learning rate in `lr` and the MLP
    width in `hidden`. Returns one row per probe: layer, prefix, target, kind, r2 (test), nmse,
    val_r2, lr, hidden, steps (of the kept parameters), converged (False: stopped by the step
    limit), y_mass (attention on y tokens), last_example_mass, peak_position.
    `precision` "float64" (default) trains in double precision, so that another machine's kernels
    give the same numbers to 1e-6; "float32" is about twice as fast.
    """
    if layout not in ("lnpd", "lpnd"):
        raise ConfigError(f"states layout must be 'lnpd' or 'lpnd', got {layout!r}")
    dtype = probe_dtype(precision)
    if layout == "lnpd":  # by position (L+1, P, N, D): a minibatch is a block of prompts (see _minibatches)
        train_states, test_states = (s.to(dtype).transpose(1, 2).contiguous() for s in (train_states, test_states))
    _, n_pos, n_train, _ = train_states.shape
    n_val = max(1, round(n_train * val_fraction))
    if n_train - n_val < 1:
        raise ConfigError(f"probes need at least 2 training prompts (one for validation), got {n_train}")
    fit_part = slice(0, n_train - n_val)
    # standardise targets per (prefix, coordinate) with the fitting prompts' statistics
    stats = {
        k: (v[fit_part].mean(0, keepdim=True), v[fit_part].std(0, keepdim=True).nan_to_num(1.0).clamp_min(1e-8))
        for k, v in train_targets.items()
    }
    norm = lambda k, v: (v - stats[k][0]) / stats[k][1]
    y_train = torch.stack([norm(tg, train_targets[tg])[:, t] for t, tg in combos]).to(dtype)  # (M, N, d)
    y_test = torch.stack([norm(tg, test_targets[tg])[:, t] for t, tg in combos]).to(dtype)
    on_device = lambda s: s.to(device=device, dtype=dtype)
    fit_states, val_states = on_device(train_states[:, :, fit_part]), on_device(train_states[:, :, n_train - n_val :])
    opts = {"steps": steps, "batch_size": batch_size, "eval_every": eval_every, "patience": patience, "seed": seed}
    configs = _configs(kind, lr, hidden)
    targets = (y_train[:, fit_part].to(device), y_train[:, n_train - n_val :].to(device))
    fits = [
        _fit_once((fit_states, val_states, on_device(test_states)), targets, combos, kind, r, h or 128, opts)
        for r, h in configs
    ]
    choice = torch.stack([f.val_r2 for f in fits]).argmax(0)  # (L+1, M): best configuration per probe
    return _probe_rows(fits, configs, choice, y_test.double().unsqueeze(0), combos, kind, n_pos)


def probe_dtype(precision: str) -> torch.dtype:
    """The training dtype of a probe precision name."""
    if precision not in PRECISIONS:
        raise ConfigError(f"probe precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


def _configs(kind: str, lr: float | Sequence[float], hidden: int | Sequence[int]) -> list[tuple[float, int]]:
    """(learning rate, MLP width) pairs tried per probe; linear probes have no width (0)."""
    return [(float(r), int(h)) for r in np.atleast_1d(lr) for h in (np.atleast_1d(hidden) if kind == "mlp" else [0])]


def _probe_rows(
    fits: list[_Fit], configs: list[tuple[float, int]], choice: Tensor, truth: Tensor, combos, kind: str, n_pos: int
) -> pd.DataFrame:
    """The table of fit_probes from each probe's chosen configuration."""
    pick = lambda name: torch.stack([getattr(f, name) for f in fits])  # (C, L+1, M, ...)
    sel = lambda t: t.gather(0, choice.view(1, *choice.shape, *([1] * (t.dim() - 3))).expand(1, *t.shape[1:]))[0]
    pred, alpha = sel(torch.stack([f.pred for f in fits if f.pred is not None])), sel(pick("alpha"))
    val_r2, steps, converged = sel(pick("val_r2")), sel(pick("steps")), sel(pick("converged"))
    r2 = r2_score(truth, pred).mean(-1)  # (L+1, M): sklearn's multioutput="uniform_average"
    nmse = ((pred - truth) ** 2).mean((2, 3)) / truth.var(dim=(2, 3)).clamp_min(1e-12)
    is_y = (torch.arange(n_pos) % 2 == 1).float()
    rows = []
    for layer in range(pred.shape[0]):
        for i, (t, target) in enumerate(combos):
            a = alpha[layer, i]
            lr, hidden = configs[int(choice[layer, i])]
            rows.append(
                {
                    "layer": layer,
                    "prefix": t,
                    "target": target,
                    "kind": kind,
                    "r2": float(r2[layer, i]),
                    "nmse": float(nmse[layer, i]),
                    "val_r2": float(val_r2[layer, i]),
                    "lr": lr,
                    "hidden": hidden,
                    "steps": int(steps[layer, i]),
                    "converged": bool(converged[layer, i]),
                    "y_mass": float((a * is_y).sum()),
                    "last_example_mass": float(a[2 * t - 2 : 2 * t].sum()),
                    "peak_position": int(a.argmax()),
                }
            )
    return pd.DataFrame(rows)


class AttentionPoolProbe(RegressorMixin, BaseEstimator):
    """One attention-pooled probe (seed 002 eq. 20-22) as a scikit-learn estimator: fit(H (N, P, D), Y (N, d)).

    The engine the reports run: `fit` holds out the last `val_fraction` of the prompts, standardises
    Y with the others' mean and standard deviation, and trains as `fit_probes` does (same start,
    minibatches, early stopping, and choice of learning rate and MLP width on the held-out
    prompts). With a report's [probes] settings and one (layer, prefix t, target), H being that
    layer's stream at the first 2t tokens, it reproduces the report's probe (tested). Defaults are
    the quick recipe's. get_params / set_params / clone, score (R^2 averaged over targets),
    NotFittedError before fit, n_features_in_ = D; fitted: lr_, hidden_, n_steps_, converged_.
    """

    def __init__(
        self,
        kind: str = "linear",
        steps: int = 300,
        lr: float | tuple[float, ...] = (0.1, 0.01),
        hidden: int | tuple[int, ...] = 128,
        batch_size: int = 128,
        eval_every: int = 25,
        patience: int = 5,
        val_fraction: float = 0.2,
        random_state: int = 0,
        precision: str = "float64",
    ):
        self.kind, self.steps, self.lr, self.hidden = kind, steps, lr, hidden
        self.batch_size, self.eval_every, self.patience = batch_size, eval_every, patience
        self.val_fraction, self.random_state, self.precision = val_fraction, random_state, precision

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # Y may be (N, d)
        return tags

    def _as_states(self, H, reset: bool) -> torch.Tensor:
        """H (N, P, D) as a float32 tensor; a 2-D H (N, D) is one position per prompt (so that
        scikit-learn's generic checks, which make 2-D data, apply)."""

        if (H.ndim if isinstance(H, (np.ndarray, torch.Tensor)) else np.asarray(H).ndim) != 3:
            return torch.from_numpy(np.array(validate_data(self, H, dtype=np.float32, reset=reset))[:, None, :])
        h = np.asarray(H, dtype=np.float32)
        if 0 in h.shape:
            raise ValueError(f"AttentionPoolProbe expects H of shape (N, P, D) with N, P, D >= 1, got {h.shape}")
        if not np.isfinite(h).all():
            raise ValueError("AttentionPoolProbe: H contains NaN or infinity")
        if reset:
            self.n_features_in_ = h.shape[2]
        return torch.from_numpy(np.array(h))

    def fit(self, H, Y) -> AttentionPoolProbe:

        if Y is None:
            raise ValueError("AttentionPoolProbe requires y to be passed, but the target y is None")
        h = self._as_states(H, reset=True)
        y = check_array(Y, dtype=np.float64, ensure_2d=False, input_name="Y")
        self.single_target_ = y.ndim == 1
        y = y[:, None] if y.ndim == 1 else y
        if y.ndim != 2 or len(y) != len(h):
            raise ValueError(f"AttentionPoolProbe.fit expects Y (N, d) with N = {len(h)}, got shape {y.shape}")
        if self.kind not in ("linear", "mlp"):
            raise ValueError(f"AttentionPoolProbe kind must be 'linear' or 'mlp', got {self.kind!r}")
        n_val = max(1, round(len(h) * self.val_fraction))
        if len(h) - n_val < 1:
            raise ValueError(f"AttentionPoolProbe needs 2 samples or more (one held out), got {len(h)} sample")
        self.n_positions_ = h.shape[1]
        targets = torch.from_numpy(y)
        fit_y = targets[: len(h) - n_val]
        self.mean_ = fit_y.mean(0)
        self.std_ = fit_y.std(0).nan_to_num(1.0).clamp_min(1e-8)
        dtype = probe_dtype(self.precision)
        y_std = ((targets - self.mean_) / self.std_).to(dtype)[None]  # (1, N, d): one probe
        states = h.to(dtype).transpose(0, 1)[None]  # (1, P, N, D): by position, as fit_probes trains
        fit_part, val_part = slice(0, len(h) - n_val), slice(len(h) - n_val, len(h))
        opts = {
            "steps": self.steps,
            "batch_size": self.batch_size,
            "eval_every": self.eval_every,
            "patience": self.patience,
            "seed": self.random_state,
        }
        combos = [((self.n_positions_ + 1) // 2, "")]  # a prefix whose 2t tokens cover all P positions
        configs = _configs(self.kind, self.lr, self.hidden)
        fits = [
            _fit_once(
                (states[:, :, fit_part], states[:, :, val_part], None),
                (y_std[:, fit_part], y_std[:, val_part]),
                combos,
                self.kind,
                r,
                hid or 128,
                opts,
            )
            for r, hid in configs
        ]
        best = int(torch.stack([f.val_r2.flatten() for f in fits]).argmax())
        self.grid_ = fits[best].grid
        self.lr_, self.hidden_ = configs[best]
        self.n_steps_, self.converged_ = int(fits[best].steps), bool(fits[best].converged)
        return self

    def predict(self, H) -> np.ndarray:

        check_is_fitted(self)
        h = self._as_states(H, reset=False)
        if h.shape[1:] != (self.n_positions_, self.n_features_in_):
            raise ValueError(
                f"H has {tuple(h.shape[1:])} (positions, width) but the probe was fitted on "
                f"{(self.n_positions_, self.n_features_in_)}"
            )
        mask = torch.ones(1, h.shape[1], dtype=torch.bool)
        with torch.no_grad():
            out = self.grid_(h.to(probe_dtype(self.precision)).transpose(0, 1)[None], mask, layout="lpnd")[0].double()
        pred = (out * self.std_ + self.mean_).numpy()
        return pred[:, 0] if self.single_target_ else pred

    @property
    def attention_(self) -> np.ndarray:
        return self.grid_.attention(torch.ones(1, self.grid_.scores.shape[1], dtype=torch.bool))[0].detach().numpy()


PRECISIONS = {"float64": torch.float64, "float32": torch.float32}
