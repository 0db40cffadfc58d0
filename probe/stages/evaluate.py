"""The error curve, the report's first stage: the model's squared error / d against the number of
in-context examples beside least squares, 3-NN and averaging (Wu et al. 2024, Fig. 2), and on ReLU-network
tasks R^2 beside training the task's network directly (Wu et al. 2024, App. G). It has no recipe section
of its own ([prompts].curve sets its size) and runs in every report; its blocks, icl_error and
icl_r2, are top-level keys of summary.json."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.evaluate import (
    DIRECT_EPOCHS,
    DIRECT_PROMPTS,
    direct_network_estimates,
    error_curve,
    paired_error_difference,
    plot_error_curve,
    r2_curve,
)
from ..core import budget
from ..core.stages import OMIT, AnalysisStage, register_stage
from ..models.sizes import shape_of
from ..reporting import figures as plots
from ..reporting.columns import column, columns
from .sections import template_page


@dataclass
class IclError:
    """Squared error / d of the model's predictions by number of examples, with its 90% band, the
    baselines', and the margin below the better of the zero predictor and averaging with its paired
    90% interval (`probe.analysis.evaluate.trivial_margin`: the evidence table's precondition)."""

    n_examples: list[int]
    model: list[float]
    model_lo: list[float]
    model_hi: list[float]
    least_squares: list[float]
    knn3: list[float]
    averaging: list[float]
    zero: list[float] = field(default_factory=list)
    trivial_margin: list[float] = field(default_factory=list)
    trivial_margin_lo: list[float] = field(default_factory=list)
    trivial_margin_hi: list[float] = field(default_factory=list)


@dataclass
class Evaluation:
    """The error curve (and, on ReLU-network tasks, the R^2 curve), each a top-level key."""

    icl_error: IclError
    icl_r2: dict[str, list] | None = field(default=None, metadata=OMIT)


class EvaluateStage(AnalysisStage):
    """Error curve: the report's `evaluate` stage (module docstring)."""

    name = "evaluate"
    papers = (
        "Garg et al. 2022: the error against the number of in-context examples",
        "Wu et al. 2024, App. G: R^2 beside training the task's network directly (ReLU-network tasks)",
    )
    block = Evaluation
    title = "Error curve"
    description = (
        "The model's in-context error against the number of examples, beside least squares, 3-NN and averaging."
    )
    commands = ("evaluate",)
    merged = True

    def run(self, c) -> dict[str, pd.DataFrame]:
        task, prompts = c.ckpt.config.task, c.recipe.prompts
        tables = {"icl_error": error_curve(c.ckpt.model, task, prompts.curve, prompts.seed, device=c.device)}
        if task.name == "relu_network":  # Wu et al. 2024, App. G: R^2 beside direct training of the network
            tables["icl_r2"] = r2_curve(c.ckpt.model, task, prompts.curve, prompts.seed, device=c.device)
        return tables

    def summarise(self, t, recipe) -> Evaluation:
        r2 = {name: column(t["icl_r2"], name) for name in t["icl_r2"].columns} if "icl_r2" in t else None
        return Evaluation(columns(t["icl_error"], IclError), r2)

    def figures(self, t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        name = context.ckpt.name
        out = {"icl_error": plots.icl_error(t["icl_error"], fig_dir / "icl_error", f"{name}: error vs examples")[0]}
        if "icl_r2" in t:
            fig_dir.mkdir(parents=True, exist_ok=True)
            plot_error_curve(t["icl_r2"], fig_dir / "icl_r2.png", f"{name}: R^2 vs examples")
            out["icl_r2"] = fig_dir / "icl_r2.png"
        return out

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        """The curve's forward; on ReLU-network tasks also r2_curve's direct networks (at its default
        epochs, on min(prompts.curve, its default prompts) prompts: prompts.curve is the knob)."""
        task, curve = ckpt.config.task, recipe.prompts.curve
        out = [budget.prompt_estimate("prompts.curve", curve, shape_of(ckpt.config.model), task.n_points)]
        if task.name == "relu_network":
            networks = min(curve, DIRECT_PROMPTS)
            direct = direct_network_estimates(task, networks, task.n_points, DIRECT_EPOCHS, ("prompts.curve",) * 2)
            out += [replace(estimate, value=curve) for estimate in direct]
        return out

    def findings(self, block: Evaluation, summary: Any) -> str | None:
        """The error at 2d + 1 examples, with its band and least squares'."""
        icl, t = block.icl_error, 2 * summary.checkpoint.task["n_dims"] + 1
        if t not in icl.n_examples:
            return None
        i = icl.n_examples.index(t)
        return (
            f"In-context error / d at 2d+1 = {t} examples: {icl.model[i]:.4f} "
            f"(90% band {icl.model_lo[i]:.4f}-{icl.model_hi[i]:.4f}); least squares {icl.least_squares[i]:.4f}."
        )

    def compare(self, mine, theirs, context):
        """Where the two share a task: per number of examples, the paired difference of their own
        predictions' error / d on the same prompts (summary.json: at d and 2d+1 examples)."""
        if not context.same_task:
            return {}, {}
        ckpt, other, p = mine.ckpt, theirs.ckpt, context.recipe.prompts
        paired = paired_error_difference(ckpt.model, other.model, ckpt.config.task, p.curve, p.seed, context.device)
        d = ckpt.config.task.n_dims
        at = paired[paired.n_examples.isin([d, 2 * d + 1])]
        lower = {"a": ckpt.name, "b": other.name}
        paired_error = [
            {"n_examples": int(r.n_examples), "difference": float(r.difference), "ci_low": float(r.ci_low),
             "ci_high": float(r.ci_high), "lower": lower.get(r.lower)}
            for r in at.itertuples()
        ]  # fmt: skip
        return {"comparison_paired": paired}, {"paired_error": paired_error}

    def page(self, block, summary, figs, tables, context):
        """The model card and the error curve (templates/evaluate.html.j2)."""
        return template_page(
            self, "evaluate.html.j2", (("Model card", "model_card", ""),), block, summary, figs, tables, context
        )


register_stage(EvaluateStage())
