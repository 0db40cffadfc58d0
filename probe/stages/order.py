"""The report's [order] stage (probe/core/stages.py): order sensitivity, does a layer's prediction
move when a prompt's examples are permuted (Hataya & Imaizumi 2024, Discussion; the analysis:
probe/analysis/order.py) - its summary.json block, figure, findings line and evidence-table row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.labels import Titles, label, sweep_titles
from ..analysis.order import ORDER_BOOTSTRAP, OrderSettings, order_estimates, order_table
from ..core import budget
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.stages import AnalysisStage, register_stage
from ..data.tasks import sample_prompts
from ..models.sizes import shape_of
from .readout import fitted_readouts

ORDER_FREE = 1e-6  # an order share below this is float round-off: the predictor ignores order
ORDER_LIKE_OGD = 0.5  # a share whose interval lies at or above this fraction of online GD's reads as online GD


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


class OrderStage(AnalysisStage):
    """Order sensitivity: the report's `order` stage (module docstring)."""

    name = "order"
    papers = ("Hataya & Imaizumi 2024, Discussion: order sensitivity",)
    settings = OrderSettings
    block = OrderSensitivity
    title = "Order sensitivity"
    description = (
        "How much permuting the examples of a prompt (same query) moves each layer's read-out prediction, as a "
        "share of its variance across prompts (Hataya & Imaizumi 2024, Discussion), beside reference learners: 0 for least "
        "squares, ridge, GD and Newton; positive for online GD and SGD with fixed minibatch positions."
    )
    needs = ("readout",)
    captions = (
        (
            "order",
            "Share of the prediction's variance due to the order of the examples (Hataya & Imaizumi 2024, Discussion): the "
            "variance across orderings of the first t examples (same query), averaged over prompts, over the "
            "variance across prompts; per layer for the model (90% bootstrap band over prompts), dashed for "
            "reference learners at the longest prefix. Values below 1e-8 (float round-off of order-free "
            "predictors such as least squares, GD and Newton) are drawn at 1e-8.",
        ),
    )
    key = "order_sensitivity"

    def run(self, c) -> dict[str, pd.DataFrame]:
        """Order sensitivity of every layer and of the [order] learners, through the readout stage's
        read-outs."""
        ckpt, recipe, settings, task = c.ckpt, c.recipe, c.recipe.order, c.ckpt.config.task
        prefixes = settings.prefixes_for(task.n_dims, task.n_points)  # refuses prefixes without a query first
        p = sample_prompts(task, settings.prompts, generator=stream_generator(recipe.prompts.seed, Stream.ORDER))
        readouts = fitted_readouts(lambda name: c.before(name, "data"), ckpt.model)
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

    def summarise(self, tables, recipe):
        return order_block(tables["order"])

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        recipe = context.recipe
        return {"order": order_figure(tables["order"], fig_dir / "order", sweep_titles(recipe.sweeps))[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        o, shape, n = recipe.order, shape_of(ckpt.config.model), ckpt.config.task.n_points
        prefixes = o.prefixes_for(shape.d, n)
        return order_estimates(shape, n, o.prompts, o.permutations, prefixes, len(o.learners), ORDER_BOOTSTRAP)

    def findings(self, block: OrderSensitivity, summary) -> str | None:
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

    def evidence(self, block: OrderSensitivity, summary, a: str, b: str) -> list[dict]:
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


ORDER = register_stage(OrderStage())
