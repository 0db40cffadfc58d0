"""The report's [probes] stage (probe/core/stages.py): attention-pooled probes for X^T y and w at
every layer (Akyurek et al. 2023, §5, App. C.8; the study: probe/analysis/probe_study.py) - its settings,
summary.json block, figure, page section, findings line and caveats."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.labels import label
from ..analysis.probe_study import ProbeSettings, probe_intervals, probe_study
from ..analysis.probes import without_r2_draws
from ..core import budget
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream
from ..core.stages import OMIT, AnalysisStage, StageTables, register_stage
from ..models import random_weights_model
from ..models.sizes import shape_of


@dataclass
class ProbeFit:
    """Held-out R^2 of one target and probe kind by layer (mean over prefixes), with controls."""

    layer: list[int]
    r2: list[float]
    control_r2: list[float]
    shuffled_r2: list[float]
    best_layer: int
    by_prefix: dict[int, list[float]]
    converged_share: float | None = field(default=None, metadata=OMIT)  # of the model's own probes
    max_iterations: int | None = field(default=None, metadata=OMIT)  # L-BFGS iterations of the slowest pooling fit
    max_grad_norm: float | None = field(default=None, metadata=OMIT)  # largest final |gradient|_inf
    # 90% intervals over resamples of the test prompts (probe/analysis/probe_study.py probe_intervals)
    r2_low: list[float] | None = field(default=None, metadata=OMIT)
    r2_high: list[float] | None = field(default=None, metadata=OMIT)
    best_layer_low: int | None = field(default=None, metadata=OMIT)
    best_layer_high: int | None = field(default=None, metadata=OMIT)


@dataclass
class ProbeOrder:
    """Which of two targets a probe kind decodes at an earlier layer, paired over resamples of the
    test prompts: `difference` is then's best layer minus first's, with its 90% interval; `earlier`
    names the target the interval puts first, None where it contains 0."""

    kind: str
    first: str
    then: str
    difference: int
    ci_low: int
    ci_high: int
    earlier: str | None = None


PROBE_KEYS = ("target_normalisation", "order")  # the Probes block's keys that are not targets


@dataclass
class Probes:
    """target -> kind -> ProbeFit; in JSON the targets sit beside `target_normalisation` and `order`."""

    fits: dict[str, dict[str, ProbeFit]]
    target_normalisation: str = "standardised per prefix and coordinate with training-prompt mean and std"
    order: list[ProbeOrder] | None = None

    def to_json_value(self) -> dict[str, Any]:
        out = {**self.fits, "target_normalisation": self.target_normalisation}
        return out if self.order is None else {**out, "order": self.order}

    @classmethod
    def json_schema_value(cls, schema) -> dict[str, Any]:
        """Targets as keys beside target_normalisation and order."""
        return {
            "type": "object",
            "description": (cls.__doc__ or "").strip(),
            "properties": {
                "target_normalisation": {"type": "string"},
                "order": {"type": "array", "items": schema(ProbeOrder)},
            },
            "required": ["target_normalisation"],
            "additionalProperties": {"type": "object", "additionalProperties": schema(ProbeFit)},
        }

    @classmethod
    def from_json_value(cls, value: dict[str, Any]) -> Probes:
        fits = {
            target: {kind: ProbeFit(**fit) for kind, fit in kinds.items()}
            for target, kinds in value.items()
            if target not in PROBE_KEYS
        }
        order = [ProbeOrder(**o) for o in value["order"]] if value.get("order") is not None else None
        return cls(fits, value["target_normalisation"], order)

    def each(self) -> list[tuple[str, str, ProbeFit]]:
        """(target, kind, fit) of every probe."""
        return [(target, kind, fit) for target, kinds in self.fits.items() for kind, fit in kinds.items()]


def probe_summary(table: pd.DataFrame, intervals: dict[str, Any] | None = None) -> dict[str, dict[str, ProbeFit]]:
    """Per target and kind: R^2 by layer (mean over all probed prefixes), with the random-model
    and shuffled controls aligned by layer, and the best layer; with `intervals`
    (probe_study.probe_intervals), their 90% intervals over test-prompt resamples."""
    out: dict[str, dict[str, ProbeFit]] = {}
    extra = (intervals or {}).get("fits", {})
    for (target, kind), rows in table.groupby(["target", "kind"]):
        by = rows.groupby(["control", "layer"]).r2.mean()
        layers = sorted(rows.layer.unique())
        main = [float(by.get(("none", l), np.nan)) for l in layers]
        own = rows[rows.control == "none"]
        converged = "converged" in rows
        out.setdefault(target, {})[kind] = ProbeFit(
            layer=layers,
            r2=main,
            control_r2=[float(by.get(("random_model", l), np.nan)) for l in layers]
            if (rows.control == "random_model").any()
            else [],  # no random-weights control (planted models)
            shuffled_r2=[float(by.get(("shuffled", l), np.nan)) for l in layers],
            best_layer=int(layers[int(np.nanargmax(main))]),
            by_prefix={
                int(t): [float(v) for v in g.groupby("layer").r2.mean().reindex(layers)]
                for t, g in own.groupby("prefix")
            },
            converged_share=float(own.converged.mean()) if converged else None,
            max_iterations=int(own.iterations.max()) if converged else None,
            max_grad_norm=float(own.grad_norm.max()) if converged else None,
            **extra.get(target, {}).get(kind, {}),
        )
    return out


def probe_block(tables: dict[str, pd.DataFrame]) -> Probes:
    """The summary.json block of the probes' table and, where `tables` is a StageTables carrying
    them, their resampled intervals (the stage's data)."""
    intervals = getattr(tables, "data", {}).get("probe_intervals")
    order = [ProbeOrder(**o) for o in intervals["order"]] if intervals else None
    return Probes(probe_summary(tables["probes"], intervals), order=order)


def probe_control_model(ckpt, seed: int):
    """The probes' random-weights control (probe/core/seeds.py); None where the family has none
    (planted constructions: the report says so)."""
    return random_weights_model(ckpt.config.model, seed)


CONTROL_NAMES = {"none": "model", "random_model": "random-weights model", "shuffled": "shuffled targets"}


def probe_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """R^2 by layer for each target and probe kind, beside the controls."""
    plt = pyplot()
    combos = sorted(table.groupby(["target", "kind"]).groups)
    fig, axes = plt.subplots(1, len(combos), figsize=(3.2 * len(combos), 3.0), sharey=True, squeeze=False)
    for ax, (target, kind) in zip(axes[0], combos):
        rows = table[(table.target == target) & (table.kind == kind)]
        for control, style in (("none", "-o"), ("random_model", "--"), ("shuffled", ":")):
            r = rows[rows.control == control].groupby("layer").r2.mean()
            if len(r):
                ax.plot(r.index, r.values, style, label=CONTROL_NAMES[control])
        ax.set(title=f"{target} ({kind})", xlabel="layer")
    axes[0][0].set_ylabel("held-out R^2 (mean over prefixes)")
    legend_outside(axes[0][-1], 7)
    return save_png(fig, stem)


def _no_model_control(block: Probes) -> bool:
    """The controls ran (shuffled targets scored) but no random-weights model had any: the family
    has no random initialisation (a planted construction)."""
    fits = [fit for _, _, fit in block.each()]
    shuffled = any(v is not None and not math.isnan(v) for fit in fits for v in fit.shuffled_r2)
    return shuffled and not any(fit.control_r2 for fit in fits)


def probe_order_words(o: ProbeOrder) -> str:
    """Which target a probe kind decodes first, from the paired interval alone (`ProbeOrder`)."""
    diff = f"best layer of {label(o.then)} minus {label(o.first)} {o.difference:+d} [{o.ci_low:+d}, {o.ci_high:+d}]"
    if o.earlier is None:
        return (
            f"The {o.kind} probes do not decide whether {label(o.first)} or {label(o.then)} is decoded first ({diff})"
        )
    later = o.then if o.earlier == o.first else o.first
    return f"The {o.kind} probes decode {label(o.earlier)} at an earlier layer than {label(later)} ({diff})"


CONVERGED_ENOUGH = 0.99  # share of converged probes below which the caveats say so


FITTING = (
    "Fitting: the head of each probe is a ridge regression in closed form, its penalty chosen by leave-one-out on "
    "the training prompts; the pooling weights are fitted by variable projection (L-BFGS on the pooling scores with "
    "the head eliminated) until the largest gradient entry is at most probes.gtol or an iteration lowers the "
    "objective by at most probes.ftol. The MLP probe adds a fixed random GELU layer beside the linear features "
    "(random features), pools as the linear probe and is fitted in closed form too. Share of probes that "
    "converged, L-BFGS iterations and the largest final gradient:"
)


DESCRIPTION = (
    "Attention-pooled probes (Akyurek et al. 2023, §5) per layer, prefix and target; targets standardised per prefix and "
    "coordinate with training statistics. Controls: the same probes on a random-weights model of the same "
    "architecture, and on shuffled targets."
)


class ProbesStage(AnalysisStage):
    """Probes for X^T y and w: the report's `probes` stage (module docstring)."""

    name = "probes"
    papers = ("Akyurek et al. 2023, §5 and App. C.8: attention-pooled probes",)
    settings = ProbeSettings
    block = Probes
    title = "Probes for X^T y and w"
    description = DESCRIPTION
    reads = ("similarity",)
    prompt_flags = (("test", "test-prompts"),)
    captions = (
        (
            "probes",
            "Held-out R^2 of probes by layer (mean over probed prefixes) for each target and probe kind, beside "
            "both controls.",
        ),
    )

    def run(self, c) -> StageTables:
        settings, seed = c.recipe.probes, c.recipe.prompts.seed
        control = probe_control_model(c.ckpt, seed) if settings.controls else None
        task, n_test, n_boot = c.ckpt.config.task, c.recipe.prompts.test, c.recipe.similarity.bootstrap
        streams = c.streams.reader(self.name)  # the model's streams, kept for the token probes
        table = probe_study(
            c.ckpt.model, task, settings, n_test, seed, c.device, control, c.progress, c.memory, n_boot, streams
        )
        return StageTables({"probes": without_r2_draws(table)}, {"probe_intervals": probe_intervals(table)})

    def summarise(self, tables, recipe):
        return probe_block(tables)

    def probe_stream_sets(self, recipe, ckpt) -> tuple[tuple[int, int], ...]:
        """The model's training and test streams, where made a block of layers at a time (float64, a
        model that resumes a forward from a layer: `probe_study`'s `layer_blocks`)."""
        if recipe.probes.precision != "float64" or not getattr(ckpt.model, "key_value_cache", False):
            return ()
        return ((Stream.PROBE_TRAIN, recipe.probes.prompts), (Stream.PROBE_TEST, recipe.prompts.test))

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"probes": probe_figure(tables["probes"], fig_dir / "probes")[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        recipe.probes.check_for(ckpt.config.task.n_points)
        return budget.probe_estimates(
            shape_of(ckpt.config.model), ckpt.config.task.n_points, recipe.probes, recipe.prompts.test
        )

    def findings(self, block: Probes, summary) -> str | None:
        parts = []
        for target, kind, fit in block.each():
            best = max(range(len(fit.r2)), key=lambda i: fit.r2[i])
            control = fit.control_r2[best] if fit.control_r2 else None
            r2 = f"{fit.r2[best]:.2f}" + (
                f" [{fit.r2_low[best]:.2f}, {fit.r2_high[best]:.2f}]" if fit.r2_low and fit.r2_high else ""
            )
            where = f"layer {fit.layer[best]}" + (
                f" [{fit.best_layer_low}, {fit.best_layer_high}]" if fit.best_layer_low is not None else ""
            )
            parts.append(
                f"{kind} {label(target)} R^2 {r2} at {where}"
                + (f" (random-weights model {control:.2f})" if control is not None else "")
            )
        if not parts:
            return None
        return (
            "Probes (90% intervals over resamples of the test prompts): "
            + "; ".join(parts)
            + "."
            + "".join(f" {probe_order_words(o)}." for o in block.order or [])
            + (
                " No random-weights control: a planted model's weights are its construction."
                if _no_model_control(block)
                else ""
            )
        )

    def caveats(self, block: Probes, summary) -> list[str]:
        out = []
        for target, kind, fit in block.each():
            best = fit.layer.index(fit.best_layer)
            control = fit.control_r2[best] if fit.control_r2 else None
            if control is not None and fit.r2[best] is not None and control > fit.r2[best]:
                out.append(
                    f"At the {kind} probe's best layer for {label(target)} ({fit.best_layer}), the same probe on a "
                    f"random-weights model of the same architecture scores higher ({control:.2f} against "
                    f"{fit.r2[best]:.2f}): what it decodes there is not evidence of learning."
                )
            if fit.converged_share is not None and fit.converged_share < CONVERGED_ENOUGH:
                out.append(
                    f"Only {fit.converged_share * 100:.0f}% of the {kind} probes for {label(target)} reached the stopping "
                    f"rule (|gradient| <= probes.gtol) within probes.max_iter ({fit.max_iterations} iterations used, "
                    f"largest final gradient {fit.max_grad_norm:.1e}): those probes' R^2 may still move; raise "
                    "probes.max_iter."
                )
        return out

    def tables(self, block: Probes, summary, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Where the probes' attention falls; how their fits converged; those that did not."""
        own = tables["probes"][tables["probes"].control == "none"]
        attention = own.groupby(["target", "kind"])[["y_mass", "last_example_mass"]].mean().reset_index()
        out = {"Where the probes' attention falls (mean over layers and prefixes):": attention}
        if "converged" in own:
            steps = own.groupby(["target", "kind"]).agg(
                converged=("converged", "mean"),
                median_iterations=("iterations", "median"),
                max_iterations=("iterations", "max"),
                max_grad_norm=("grad_norm", "max"),
            )
            steps["max_grad_norm"] = steps.max_grad_norm.map("{:.1e}".format)
            out[FITTING] = steps.reset_index()
            stuck = own[~own.converged.astype(bool)]
            if len(stuck):
                cols = ["layer", "prefix", "target", "kind", "iterations", "grad_norm", "r2"]
                out["Probes that did not reach the stopping rule (their R^2 may still move):"] = stuck[cols].assign(
                    grad_norm=stuck.grad_norm.map("{:.1e}".format)
                )
        return out


PROBES = register_stage(ProbesStage())
