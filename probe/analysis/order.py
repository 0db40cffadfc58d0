"""Order sensitivity (Hataya & Imaizumi 2024, Discussion): does a layer's prediction move when the examples of
a prompt are permuted, the query kept?

For prefix t, prompt b and permutations pi_1..pi_P of its first t examples (pi_1 the identity),
f(b, p) is a predictor's prediction for x_{t+1} after the permuted examples: a layer's read-out
or a reference learner. The statistic is the share of variance due to order,

    S(t) = mean_b Var_p f(b, p) / Var_b mean_p f(b, p),

0 for a learner that sees its examples as a set (least squares, ridge, GD, Newton: to float
round-off) and positive for one that reads them in order (online GD; SGD whose minibatches are
fixed positions; Hataya & Imaizumi 2024, Thm. 2's random number from the last example). Intervals: bootstrap
over prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..capture import RESID, capture
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.memory import MemoryBudget
from ..core.seeds import Stream, stream_generator
from ..core.settings import SweepSettings
from ..learners import check_sweep, run_learner
from ..models.sizes import shape_of
from .stats import percentile_interval, resamples

LEARNER_BLOCK_BYTES = 64 << 20  # per-sequence moments and eigenvectors of one block of the learners' sequences


def permuted_prompts(xs: Tensor, ys: Tensor, t: int, n_perm: int, generator: torch.Generator):
    """(P, B, t + 1, d) and (P, B, t + 1): the first t examples of each prompt permuted (the first
    permutation is the identity), then the prompt's x_{t+1}, y_{t+1} as the query."""
    b = xs.shape[0]
    keys = torch.rand(n_perm, b, t, generator=generator)
    perm = keys.argsort(-1)
    perm[0] = torch.arange(t)
    xp = torch.gather(
        xs[:, :t].expand(n_perm, *xs[:, :t].shape), 2, perm.unsqueeze(-1).expand(-1, -1, -1, xs.shape[-1])
    )
    yp = torch.gather(ys[:, :t].expand(n_perm, *ys[:, :t].shape), 2, perm)
    query_x = xs[:, t : t + 1].expand(n_perm, -1, -1, -1)
    query_y = ys[:, t : t + 1].expand(n_perm, -1, -1)
    return torch.cat([xp, query_x], 2), torch.cat([yp, query_y], 2)


def order_share(preds, n_boot: int = 500, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """S of the module docstring for predictions (..., P, B): (value, ci_low, ci_high), each (...,).
    NaN where the predictions do not vary across prompts (0 / 0)."""
    f = torch.as_tensor(np.asarray(preds), dtype=torch.float64).movedim(-1, 0)  # (B, ..., P)
    within, means = f.var(-1, correction=0), f.mean(-1)  # (B, ...)

    def share(idx: Tensor) -> Tensor:  # idx (b, B) resamples -> (b, ...)
        return within[idx].mean(1) / means[idx].var(1, correction=0)

    value = share(torch.arange(f.shape[0]).unsqueeze(0))[0]
    boot = torch.cat([share(idx) for idx in resamples(f.shape[0], n_boot, seed, chunk=100)])
    lo, hi = percentile_interval(boot, ignore_nan=True)
    return value, lo, hi


ORDER_BOOTSTRAP = 500  # resamples of the prompts for every share's interval


def order_estimates(
    shape, points: int, prompts: int, permutations: int, prefixes: Sequence[int], learners: int, n_boot: int
) -> list[budget.Estimate]:
    """The order stage's work, one formula for the report's up-front check and the stage's own: the
    permuted prompts run once per prefix t, on its first t + 1 points only ((t + 1) / n of a forward:
    `order_table`), and the bootstrap of every layer's and learner's share at each prefix."""
    forwards = sum(t + 1 for t in prefixes) / points
    return [
        budget.prompt_estimate("order.prompts", prompts, shape, points),
        budget.prompt_estimate("order.permutations", prompts * permutations, shape, points, forwards, permutations),
        budget.bootstrap_estimate(
            "similarity.bootstrap", n_boot, prompts, (shape.layers + 1 + learners) * len(prefixes)
        ),
    ]


def order_table(
    model,
    readouts,
    xs: Tensor,
    ys: Tensor,
    prefixes: list[int],
    n_perm: int,
    learners: dict[str, dict],
    seed: int = 0,
    device: str = "cpu",
    memory: MemoryBudget | None = None,
    n_boot: int = ORDER_BOOTSTRAP,
) -> pd.DataFrame:
    """Rows (predictor, layer, prefix, sensitivity, ci_low, ci_high): every layer of the model
    (through `readouts`, a LayerReadouts or the model's own lens) and each learner (layer -1),
    at each prefix t, over P = n_perm orderings of the examples of every prompt."""
    shape, (n_prompts, n) = shape_of(model), xs.shape[:2]
    budget.check(order_estimates(shape, n, n_prompts, n_perm, prefixes, len(learners), n_boot))
    g = stream_generator(seed, Stream.ORDER_PERMUTATIONS)
    rows = []
    for t in prefixes:
        xp, yp = permuted_prompts(xs, ys, t, n_perm, g)
        flat_x, flat_y = xp.flatten(0, 1), yp.flatten(0, 1)
        # only the query x_{t+1} is read, and (causal models) it sees the first t + 1 points only:
        # the tokens after it are not run (a planted model runs only that prefix run)
        states = capture(
            model,
            flat_x[:, : t + 1],
            flat_y[:, : t + 1],
            hooks=[RESID],
            positions=[2 * t],
            device=device,
            memory=memory,
        )
        at_query = np.asarray(states.acts[RESID])[:, :, 0]  # (L+1, P*B, D)
        layer_preds = readouts.predict(at_query).reshape(at_query.shape[0], n_perm, -1)
        value, lo, hi = order_share(layer_preds, n_boot, seed)
        rows += [_row("model", layer, t, value[layer], lo[layer], hi[layer]) for layer in range(len(value))]
        # the learners at the query's prefix alone (`last_prefix`: the closed-form and spectral ones
        # decompose that prefix only), a block of sequences at a time (each sequence's prediction is
        # its own): every prefix's moments of all P x B sequences would be ~1 GB at paper scale.
        # Every learner runs on a block before the next block, so that GD and Newton share its
        # eigendecomposition (learners.iterative.LAST_PROMPTS holds it while the block lives)
        block = max(1, LEARNER_BLOCK_BYTES // (8 * (t + 1) * flat_x.shape[-1] ** 2 * 6))
        parts: dict[str, list[Tensor]] = {name: [] for name in learners}
        for start in range(0, len(flat_x), block):
            bx, by = flat_x[start : start + block].to(device), flat_y[start : start + block].to(device)
            for name, spec in learners.items():
                result = run_learner(spec["learner"], bx, by, last_prefix=True, **spec.get("grid", {}))
                parts[name].append(result.preds[0, :, 0].cpu())
        for name, preds in parts.items():
            value, lo, hi = order_share(torch.cat(preds).reshape(n_perm, -1), n_boot, seed)
            rows.append(_row(name, -1, t, value, lo, hi))
    return pd.DataFrame(rows)


def _row(predictor: str, layer: int, prefix: int, value, lo, hi) -> dict:
    return {
        "predictor": predictor,
        "layer": layer,
        "prefix": prefix,
        "sensitivity": float(value),
        "ci_low": float(lo),
        "ci_high": float(hi),
    }


# ---------------------------------------------------------------- the recipe section (the stage: probe/stages/)


def _order_learners() -> list[SweepSettings]:
    return [
        SweepSettings("least_squares", "least_squares"),
        SweepSettings("ridge", "ridge", grid={"lam": [0.1]}),
        SweepSettings("gd[8]", "gd", grid={"steps": [8]}),
        SweepSettings("newton[4]", "newton", grid={"iterations": [4]}),
        SweepSettings("ogd", "ogd"),
        SweepSettings("sgd[8]", "sgd", grid={"steps": [8], "eta": [0.02], "batch_size": [4], "masks_seed": 0}),
    ]


@dataclass
class OrderSettings(Section):
    """Order sensitivity (this module, Hataya & Imaizumi 2024, Discussion): recipe section [order], `icl-probe
    order` flags."""

    SECTION = "order"
    enabled: bool = setting(True, "measure order sensitivity in reports")
    prompts: int = setting(256, "prompts whose examples are permuted")
    permutations: int = setting(8, "orderings per prompt (the first is the prompt's own)", minimum=2)
    prefixes: tuple[int, ...] = setting((), "numbers of examples t before the query (empty: d, 2d+1 and n-1)")
    # learners measured beside the model: one setting each (deterministic ones give 0)
    learners: list[SweepSettings] = dataclasses.field(default_factory=_order_learners)

    def prefixes_for(self, d: int, n: int) -> list[int]:
        """The prefixes to measure for prompts of n points in d dimensions (each < n)."""
        chosen = self.prefixes or [d, 2 * d + 1, n - 1]
        bad = [t for t in chosen if t >= n]
        if self.prefixes and bad:
            raise ConfigError(f"order.prefixes {bad} leave no query: prompts have {n} points, so use t <= {n - 1}")
        return sorted({min(t, n - 1) for t in chosen if min(t, n - 1) >= 1})

    def __post_init__(self) -> None:
        super().__post_init__()
        for s in self.learners:
            check_sweep(s, "order learner")
