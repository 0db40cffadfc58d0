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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..capture import RESID, capture
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.memory import MemoryBudget
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.settings import SweepSettings
from ..core.stages import AnalysisStage, register_stage
from ..data.tasks import sample_prompts
from ..learners import check_sweep, run_learner
from ..models.sizes import shape_of
from .labels import Titles, label, sweep_titles
from .pipeline import LayerSettings, fit_readouts
from .readout import LayerReadouts
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
            bx, by = flat_x[start : start + block], flat_y[start : start + block]
            for name, spec in learners.items():
                result = run_learner(spec["learner"], bx, by, last_prefix=True, **spec.get("grid", {}))
                parts[name].append(result.preds[0, :, 0])
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


# ---------------------------------------------------------------- the report stage (probe/core/stages.py)

ORDER_FREE = 1e-6  # an order share below this is float round-off: the predictor ignores order
ORDER_LIKE_OGD = 0.5  # a share whose interval lies at or above this fraction of online GD's reads as online GD


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


@dataclass
class OrderSeries:
    """An order share with its 90% interval (lists by layer for the model, one value for a learner)."""

    sensitivity: Any
    ci_low: Any
    ci_high: Any


@dataclass
class OrderSensitivity:
    """Share of prediction variance due to example order: the model per
    prefix (string key) and layer, each learner per prefix."""

    prefixes: list[int]
    layer: list[int]
    model: dict[str, OrderSeries]
    learners: dict[str, dict[str, OrderSeries]]
    definition: str = (
        "mean over prompts of the variance of the prediction across orderings of the first t examples, "
        "divided by the variance across prompts of its mean over orderings (0: order-free)"
    )


def order_block(table: pd.DataFrame) -> OrderSensitivity:
    """The model per prefix (a string key) by layer with intervals; each learner per prefix."""
    model = table[table.predictor == "model"]
    column = lambda rows, name: [None if pd.isna(v) else float(v) for v in rows[name]]
    series = lambda rows: OrderSeries(*(column(rows, name) for name in ("sensitivity", "ci_low", "ci_high")))
    return OrderSensitivity(
        prefixes=sorted(int(t) for t in table.prefix.unique()),
        layer=sorted(int(l) for l in model.layer.unique()),
        model={str(t): series(r.sort_values("layer")) for t, r in model.groupby("prefix")},
        learners={
            name: {
                str(int(r.prefix)): OrderSeries(sensitivity=r.sensitivity, ci_low=r.ci_low, ci_high=r.ci_high)
                for r in rows.itertuples()
            }
            for name, rows in table[table.predictor != "model"].groupby("predictor", sort=False)
        },
    )


def _run(c) -> dict[str, pd.DataFrame]:
    """Order sensitivity of every layer and of the [order] learners. The layers' read-outs are the
    layers stage's (its "readouts" data), or refitted exactly as that stage fits them when it did
    not run."""
    ckpt, recipe, settings, task = c.ckpt, c.recipe, c.recipe.order, c.ckpt.config.task
    prefixes = settings.prefixes_for(task.n_dims, task.n_points)  # refuses prefixes without a query first
    p = sample_prompts(task, settings.prompts, generator=stream_generator(recipe.prompts.seed, Stream.ORDER))
    fitted = c.before("readouts", "data")
    if fitted is not None:
        readouts = LayerReadouts.from_json(fitted)
    else:
        readouts, _, _ = fit_readouts(ckpt.model, task, LayerSettings.from_recipe(recipe, c.device, c.memory))
    learners = {s.label: {"learner": s.learner, "grid": s.grid} for s in settings.learners}
    table = order_table(
        ckpt.model,
        readouts,
        p.xs,
        p.ys,
        prefixes,
        settings.permutations,
        learners,
        recipe.prompts.seed,
        c.device,
        c.memory,
    )
    return {"order": table}


def _estimates(recipe, ckpt) -> list[budget.Estimate]:
    o, shape, n = recipe.order, shape_of(ckpt.config.model), ckpt.config.task.n_points
    prefixes = o.prefixes_for(shape.d, n)
    return order_estimates(shape, n, o.prompts, o.permutations, prefixes, len(o.learners), ORDER_BOOTSTRAP)


def _figures(tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
    recipe = context.recipe
    return {"order": order_figure(tables["order"], fig_dir / "order", sweep_titles(recipe.sweeps))[0]}


ORDER_FLOOR = 1e-8  # order shares below this (float round-off of order-free predictors) are drawn at it


def order_figure(table: pd.DataFrame, stem: Path, titles: Titles | None = None) -> list[Path]:
    """Share of prediction variance due to example order, per layer and prefix, with learners at
    the longest prefix as horizontal lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    model = table[table.predictor == "model"]
    for t, rows in model.groupby("prefix"):
        line = ax.plot(rows.layer, rows.sensitivity.clip(lower=ORDER_FLOOR), "-o", ms=3, label=f"model, t = {t}")
        lo, hi = rows.ci_low.clip(lower=ORDER_FLOOR), rows.ci_high.clip(lower=ORDER_FLOOR)
        ax.fill_between(rows.layer, lo, hi, color=line[0].get_color(), alpha=0.15)
    longest = table[(table.predictor != "model") & (table.prefix == table.prefix.max())]
    for i, r in enumerate(longest.itertuples()):
        ax.axhline(
            max(r.sensitivity, ORDER_FLOOR),
            ls="--",
            lw=1,
            color=f"C{(i + 4) % 10}",
            label=f"{label(r.predictor, titles)} (t = {r.prefix})",
        )
    ax.set(xlabel="layer", ylabel="order share of variance", yscale="log")
    legend_outside(ax, 7)
    return save_png(fig, stem)


def _findings(block: OrderSensitivity, summary) -> str | None:
    """The final layer's order share at the longest prefix, and which learners are order-free."""
    titles = summary.titles
    t = str(block.prefixes[-1])
    model = block.model[t]
    final = model.sensitivity[-1]
    if final is None:
        return None
    share = {name: by_prefix[t].sensitivity for name, by_prefix in block.learners.items()}
    sensitive = [n for n, v in share.items() if v >= ORDER_FREE]
    free = [n for n, v in share.items() if v < ORDER_FREE]
    verdict = "order-free (float round-off)" if model.ci_high[-1] < ORDER_FREE else "order-sensitive"
    return (
        f"Order of the examples (t = {t}): the final layer's order share of variance is {final:.3g} "
        f"[{model.ci_low[-1]:.3g}, {model.ci_high[-1]:.3g}], {verdict}; "
        f"order-sensitive learners: {', '.join(label(n, titles) for n in sensitive) or 'none'} "
        f"({', '.join(format(share[n], '.3g') for n in sensitive)}); "
        f"order-free: {', '.join(label(n, titles) for n in free) or 'none'}."
    )


ORDER_LIKE_OGD = 0.5  # a share whose interval lies at or above this fraction of online GD's reads as online GD


def _evidence(block: OrderSensitivity, summary, a: str, b: str) -> list[dict]:
    """The evidence table's row for GD against online GD: order-free reads as GD, a share like
    online GD's as online GD."""
    if {a, b} != {"gd", "ogd"}:
        return []
    t = str(block.prefixes[-1])
    model = block.model[t]
    share, lo, hi = model.sensitivity[-1], model.ci_low[-1], model.ci_high[-1]
    if share is None:
        return []
    ogd = block.learners.get("ogd", {}).get(t)
    like_ogd = ogd is not None and lo >= ORDER_LIKE_OGD * ogd.sensitivity
    favours = "gd" if hi < ORDER_FREE else "ogd" if lo > ORDER_FREE and like_ogd else None
    words = f"final layer's order share {share:.3g} [{lo:.3g}, {hi:.3g}] at t = {t}; GD is order-free (0)"
    if ogd is not None:
        words += f", online GD {ogd.sensitivity:.3g}"
    if favours is None and lo > ORDER_FREE:
        words += f" (order-sensitive, but below {ORDER_LIKE_OGD:g} x online GD's share: neither)"
    return [
        {
            "instrument": "order sensitivity",
            "favours": favours,
            "effect": words,
            "difference": share,
            "ci_low": lo,
            "ci_high": hi,
            "cannot_tell_apart": "any order-sensitive learner (SGD, a finite-memory model) reads as online GD here",
        }
    ]


ORDER = register_stage(
    AnalysisStage(
        name="order",
        papers=("Hataya & Imaizumi 2024, Discussion: order sensitivity",),
        key="order_sensitivity",
        settings=OrderSettings,
        run=_run,
        block=OrderSensitivity,
        summarise=lambda tables, recipe: order_block(tables["order"]),
        title="Order sensitivity",
        description=(
            "How much permuting the examples of a prompt (same query) moves each layer's read-out prediction, as a "
            "share of its variance across prompts (Hataya & Imaizumi 2024, Discussion), beside reference learners: 0 for least "
            "squares, ridge, GD and Newton; positive for online GD and SGD with fixed minibatch positions."
        ),
        figures=_figures,
        estimates=_estimates,
        findings=_findings,
        evidence=_evidence,
        reads=("readout",),
        captions=(
            (
                "order",
                "Share of the prediction's variance due to the order of the examples (Hataya & Imaizumi 2024, Discussion): the "
                "variance across orderings of the first t examples (same query), averaged over prompts, over the "
                "variance across prompts; per layer for the model (90% bootstrap band over prompts), dashed for "
                "reference learners at the longest prefix. Values below 1e-8 (float round-off of order-free "
                "predictors such as least squares, GD and Newton) are drawn at 1e-8.",
            ),
        ),
    )
)
