"""Causal probes: steer the residual stream along what a linear probe decodes, and check that the
prediction moves the way the decoded quantity says.

A linear attention-pooled probe (Akyurek et al. 2023, eq. 20-22; probe/analysis/probes.py) at layer l and
prefix t decodes q = ((sum_p alpha_p h_p) W + b) * sigma + mu from the first 2t tokens. The
smallest edit of those tokens (Frobenius norm) that moves the decoded q by delta is

    dh_p = alpha_p u / sum_q alpha_q^2,   u = (delta / sigma) W^+   (u in W's row space),

and it moves the decoded q by exactly delta (the pooling weights do not depend on h). The
remaining layers run on the edited stream (hooks on the model's forward; probe/interventions/runner.py).
If the model computes its answer from q, the prediction for x_{t+1} moves by

    w_OLS:  x_{t+1} . delta
    X^T y:  x_{t+1} . S_t^+ delta    (least squares reads X^T y through S_t^+, S_t = X_t^T X_t)

Per layer and prefix the slope (least squares through the origin) and R^2 of the observed move
against the expected one are measured over prompts and random deltas, with bootstrap intervals
over prompts; the control is an edit of the same positions and Frobenius norm in a random
direction, scored against the same expected moves (slope near 0 when the probe's direction is
what matters).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..analysis.probes import AttentionPoolProbe, probe_targets
from ..analysis.stats import resamples
from ..capture import RESID, capture
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.seeds import Stream, stream_generator
from ..models.sizes import shape_of
from .runner import Runner, boundary_hook_name, runner_for, runner_refusal

STEERABLE_TARGETS = ("w_ols", "xty")
MIN_DECODED = 0.1  # a probe whose leave-one-out R^2 is below this is not steered (its cells' slopes are NaN)


@dataclass
class ProbeMap:
    """What a fitted linear probe decodes: q = ((sum_p alpha_p h_p) W + b) * std + mean."""

    alpha: Tensor  # (P,) pooling weights over the first 2t tokens
    weight: Tensor  # (D, d)
    std: Tensor  # (d,)

    @classmethod
    def of(cls, probe: AttentionPoolProbe) -> ProbeMap:
        if probe.kind != "linear":
            raise ConfigError(
                f"only linear probes can be steered (an {probe.kind} probe decodes through a nonlinearity, so no "
                "edit moves its output by a chosen delta everywhere); use kind 'linear'"
            )
        return cls(
            torch.as_tensor(probe.attention_, dtype=torch.float64),
            torch.as_tensor(probe.coef_, dtype=torch.float64),
            probe.std_.double(),
        )

    def edit(self, delta: Tensor) -> Tensor:
        """The smallest edit (N, P, D) of the pooled tokens that moves the decoded q by delta (N, d)."""
        u = (delta.double() / self.std) @ torch.linalg.pinv(self.weight)  # (N, D), u W = delta / std
        return self.alpha.view(1, -1, 1) * u.unsqueeze(1) / (self.alpha**2).sum()

    def decoded_change(self, edit: Tensor) -> Tensor:
        """The decoded q's change (N, d) under an edit (N, P, D)."""
        return torch.einsum("p,npd,de->ne", self.alpha, edit.double(), self.weight) * self.std


def expected_move(target: str, xs: Tensor, ys: Tensor, t: int, delta: Tensor) -> Tensor:
    """(N,): how the prediction for x_{t+1} moves if the model reads `target` after t examples."""
    xq = xs[:, t].double()
    if target == "w_ols":
        return (xq * delta).sum(-1)
    s = torch.einsum("nti,ntj->nij", xs[:, :t].double(), xs[:, :t].double())
    return torch.einsum("ni,nij,nj->n", xq, torch.linalg.pinv(s), delta.double())


def add_at_tokens(runner: Runner, boundary: int, edit: Tensor, query: int):
    """A hook adding `edit` (B, P, D) to the stream at `boundary` on the first P interleaved tokens,
    for a run that stops at the prediction for x_{query+1} (runner.predict(..., query=query))."""
    name = boundary_hook_name(boundary, runner.n_layers)
    mask = torch.zeros(1, 2 * query + 2, dtype=torch.bool)
    mask[:, : edit.shape[1]] = True
    where = runner.stream_mask(mask, edit.shape[0], query)  # (B runs, T, 1) in the native layout
    values = runner.native_values(edit, query)

    def add(value: Tensor, hook) -> Tensor:
        return value + torch.where(where, values.to(value.dtype), torch.zeros((), dtype=value.dtype))

    return name, add


def prefix_states(model, xs: Tensor, ys: Tensor, t: int, device: str) -> np.ndarray:
    """Every layer boundary's stream at the first 2t tokens (L+1, N, 2t, D): what a probe at prefix t reads."""
    states = capture(model, xs[:, : t + 1], ys[:, : t + 1], hooks=[RESID], device=device).acts[RESID]
    return np.asarray(states[:, :, : 2 * t])


def steering_table(
    model,
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    layers: list[int],
    prefixes: list[int],
    targets: tuple[str, ...] = STEERABLE_TARGETS,
    sizes: tuple[float, ...] = (0.5, 1.0),
    seed: int = 0,
    device: str = "cpu",
    n_boot: int = 500,
) -> pd.DataFrame:
    """Rows (target, layer, prefix, edit, slope, slope_low, slope_high, r2, probe_r2): per cell, the
    observed move of the prediction against the expected one (module docstring) over the test
    prompts and random deltas of each size (in units of the target's standard deviation), for the
    probe's edit and a random edit of the same norm (`edit` = "probe" / "random"). probe_r2 is
    the linear probe's R^2 on the test prompts. A cell whose probe decodes nothing (leave-one-out
    R^2 below MIN_DECODED) is not steered: its slopes are NaN (null in JSON)."""
    runner = runner_for(model, device)
    check_cells(model, layers, prefixes, targets, train[0].shape[1])
    shape, cells = shape_of(model), len(layers) * len(prefixes) * len(targets)
    budget.check(
        [
            budget.prompt_estimate(
                "steering.test_prompts", test[0].shape[0], shape, test[0].shape[1], 2 * cells * len(sizes)
            ),
            budget.bootstrap_estimate("similarity.bootstrap", n_boot, test[0].shape[0], 2 * cells * len(sizes)),
        ]
    )
    g = stream_generator(seed, Stream.STEER_DIRECTIONS)
    rows = []
    for t in prefixes:
        xt, yt = test[0][:, : t + 1], test[1][:, : t + 1]  # all the prediction for x_{t+1} depends on
        train_states, test_states = (prefix_states(model, *p, t, device) for p in (train, test))
        base = runner.predict(xt, yt, query=t).double()
        for target in targets:
            fit_y, test_y = (probe_targets(*p, target)[:, t].numpy() for p in (train, test))
            for layer in layers:
                probe = AttentionPoolProbe(kind="linear", random_state=seed).fit(train_states[layer], fit_y)
                cell = {
                    "target": target,
                    "layer": layer,
                    "prefix": t,
                    "probe_r2": float(probe.score(test_states[layer], test_y)),
                }
                if probe.loo_r2_ < MIN_DECODED:  # nothing decoded: the smallest edit is unbounded, no slope to measure
                    rows += [
                        {**cell, "edit": kind, "slope": np.nan, "slope_low": np.nan, "slope_high": np.nan, "r2": np.nan}
                        for kind in ("probe", "random")
                    ]
                    continue
                moves = _moves(runner, ProbeMap.of(probe), xt, yt, base, target, layer, t, sizes, g)
                for kind, (observed, expected) in moves.items():
                    slope, lo, hi, r2 = _fit_through_origin(observed, expected, n_boot, seed)
                    rows.append({**cell, "edit": kind, "slope": slope, "slope_low": lo, "slope_high": hi, "r2": r2})
    return pd.DataFrame(rows)


def _moves(
    runner: Runner, pmap: ProbeMap, xs, ys, base, target, layer, t, sizes, g
) -> dict[str, tuple[Tensor, Tensor]]:
    """edit kind -> (observed, expected) moves (B, sizes) of the prediction for x_{t+1}."""
    out: dict[str, list[tuple[Tensor, Tensor]]] = {"probe": [], "random": []}
    for size in sizes:
        direction = torch.randn(len(xs), xs.shape[-1], generator=g, dtype=torch.float64)
        delta = size * pmap.std * direction / direction.norm(dim=-1, keepdim=True)
        edit = pmap.edit(delta)
        noise = torch.randn(edit.shape, generator=g, dtype=torch.float64)
        noise *= edit.flatten(1).norm(dim=1).view(-1, 1, 1) / noise.flatten(1).norm(dim=1).view(-1, 1, 1)
        expected = expected_move(target, xs, ys, t, delta)
        for kind, e in (("probe", edit), ("random", noise)):
            moved = runner.predict(xs, ys, [add_at_tokens(runner, layer, e.float(), t)], query=t)
            out[kind].append((moved.double() - base, expected))
    return {k: (torch.stack([o for o, _ in v], 1), torch.stack([e for _, e in v], 1)) for k, v in out.items()}


def _fit_through_origin(
    observed: Tensor, expected: Tensor, n_boot: int, seed: int
) -> tuple[float, float, float, float]:
    """Slope of observed ~ slope * expected (rows = prompts), its bootstrap interval over prompts,
    and R^2 = 1 - SS_res / SS_tot of that fit."""

    def slope(idx: Tensor) -> Tensor:  # idx (b, B)
        o, e = observed[idx], expected[idx]
        return (o * e).sum((1, 2)) / (e * e).sum((1, 2)).clamp_min(1e-300)

    value = float(slope(torch.arange(len(observed)).unsqueeze(0))[0])
    boot = torch.cat([slope(idx) for idx in resamples(len(observed), n_boot, seed, chunk=100)])
    lo, hi = torch.quantile(boot, torch.tensor([0.05, 0.95], dtype=boot.dtype)).tolist()
    resid = observed - value * expected
    total = ((observed - observed.mean()) ** 2).sum()
    r2 = float(1 - (resid**2).sum() / total) if total > 0 else float("nan")
    return value, lo, hi, r2


def steering_summary(table: pd.DataFrame) -> dict:
    """summary.json's `steering`: {target: {edit: {prefix: {layer, slope, slope_low, slope_high, r2, probe_r2}}}}."""
    out: dict = {}
    for (target, edit, t), rows in table.groupby(["target", "edit", "prefix"]):
        rows = rows.sort_values("layer")
        block = {
            c: [None if pd.isna(v) else float(v) for v in rows[c]]
            for c in ("slope", "slope_low", "slope_high", "r2", "probe_r2")
        }
        out.setdefault(target, {}).setdefault(edit, {})[str(int(t))] = {"layer": [int(v) for v in rows.layer], **block}
    return out


def check_cells(model, layers: list[int], prefixes: list[int], targets, n_points: int) -> None:
    """One clear error for a layer, prefix or target that cannot be steered, before any work."""
    bad = [layer for layer in layers if not 0 <= layer <= model.n_layers]
    if bad:
        raise ConfigError(f"--layers {bad} out of range: this model's layer boundaries are 0..{model.n_layers}")
    bad = [t for t in prefixes if not 1 <= t < n_points]
    if bad:
        raise ConfigError(f"--prefixes {bad} out of range: use 1..{n_points - 1} examples before the query")
    bad = [target for target in targets if target not in STEERABLE_TARGETS]
    if bad:
        raise ConfigError(f"steering targets must be among {list(STEERABLE_TARGETS)}, got {bad}")


# ---------------------------------------------------------------- the recipe section (the stage: probe/stages/)


@dataclass
class SteeringSettings(Section):
    """Causal probes (this module): recipe section [steering], `icl-probe steer`."""

    SECTION = "steering"
    enabled: bool = setting(False, "steer along linear probes in reports (transformers only; on in the full recipe)")
    layers: tuple[int, ...] = setting((), "layer boundaries to edit (empty: all)", minimum=0)
    prefixes: tuple[int, ...] = setting((), "examples before the query (empty: d, 2d+1 and n-1)")
    targets: tuple[str, ...] = setting(
        ("w_ols", "xty"), "probe targets steered", ("w_ols", "xty"), nonempty=True, noun="target"
    )
    train_prompts: int = setting(1024, "prompts the steered probes are fitted on")
    test_prompts: int = setting(128, "prompts that are steered")

    def cells(self, n_layers: int, d: int, n: int) -> tuple[list[int], list[int]]:
        """(layers, prefixes) to steer for a model of n_layers blocks on prompts of n points in d dims."""
        layers = list(self.layers) or list(range(n_layers + 1))
        prefixes = list(self.prefixes) or sorted({min(t, n - 1) for t in (d, 2 * d + 1, n - 1)})
        return layers, prefixes


def steering_refusal(ckpt) -> str:
    """Steering edits a transformer's residual stream: a GPT-2 family, linear self-attention or
    planted checkpoint (one with an intervention runner); why not, "" where it can."""
    return runner_refusal(ckpt.model)
