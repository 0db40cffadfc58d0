"""The error curve, the report's first stage: the model's squared error / d against the number of
in-context examples beside least squares, 3-NN and averaging (Wu et al. 2024, Fig. 2), and on ReLU-network
tasks R^2 beside training the task's network directly (Wu et al. 2024, App. G). It has no recipe section
of its own ([prompts].curve sets its size) and runs in every report; its blocks, icl_error and
icl_r2, are top-level keys of summary.json. Its command, `icl-probe evaluate`, also takes the prompt
shifts of Garg et al. and which learner the model tracks under one (the command's options)."""

from __future__ import annotations

import argparse
import dataclasses
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
    shifted_error_curve,
)
from ..core import budget
from ..core.errors import ConfigError
from ..core.stages import OMIT, Command, FieldsAsKeys, StageTables, register_stage
from ..models.sizes import shape_of
from ..reporting import figures as plots
from ..reporting.columns import column, columns
from .sections import template_page

CURVE_OPTIONS = ("points", "mixture", "param_mean", "shift", "track", "epochs", "direct_prompts")


def _curve_arguments(p: argparse.ArgumentParser) -> None:
    """`icl-probe evaluate`'s arguments beside --prompts and --seed (its options)."""
    from ..core.settings import positive_int_flag as positive_int

    p.add_argument(
        "--points", type=positive_int, default=None, help="examples per prompt (default: the training task's)"
    )
    p.add_argument("--mixture", help="input mixture weights w1,w2 of w1 N(-2,I) + w2 N(2,I) (ReLU tasks)")
    p.add_argument("--param-mean", type=float, help="mean of the network parameters (ReLU tasks)")
    p.add_argument(
        "--shift",
        metavar="NAME[=VALUE]",
        help="one of Garg et al.'s evaluation prompt families (linear tasks; probe/data/shifts.py)",
    )
    p.add_argument(
        "--track",
        action="store_true",
        help="with --shift: which reference learner the model tracks under the shift, each at the member matched "
        "to the model in distribution (probe/analysis/shift_tracking.py); writes shift_tracking.csv",
    )
    p.add_argument("--epochs", type=positive_int, default=None, help="direct-training epochs (ReLU tasks, default 100)")
    p.add_argument(
        "--direct-prompts",
        type=positive_int,
        default=None,
        help="prompts the direct-training baseline runs on (ReLU tasks, default 256)",
    )


def _curve_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options `icl-probe evaluate` was given (those left at their defaults are left out)."""
    given = {name: getattr(args, name) for name in CURVE_OPTIONS}
    return {name: value for name, value in given.items() if value not in (None, False)}


def _checked_curve(recipe, args: argparse.Namespace, ckpt):
    """The command's options refused before any work where the checkpoint cannot take them."""
    task = evaluated_task(ckpt.config.task, _curve_options(args))
    if args.points and args.points > ckpt.config.model.n_positions:
        raise ConfigError(f"--points {args.points} exceeds the model's {ckpt.config.model.n_positions} positions")
    if args.track and args.shift is None:
        raise ConfigError("--track compares learners under a shift: give --shift NAME[=VALUE] too")
    if args.shift is not None:
        from ..data.shifts import parse_shift

        parse_shift(args.shift)
        if task.name != "linear_regression" or task.covariance != "isotropic":
            raise ConfigError(f"--shift applies to isotropic linear regression; this checkpoint's task is {task.name}")
    return recipe


def evaluated_task(task, options: dict[str, Any]):
    """The checkpoint's task with the options' distribution shifts applied (mixture weights and
    parameter mean of ReLU-network tasks, the number of examples)."""
    changes: dict[str, Any] = {}
    if options.get("mixture") is not None:
        try:
            changes["mixture_weights"] = tuple(float(v) for v in options["mixture"].split(","))
        except ValueError:
            raise ConfigError(f"--mixture must look like 0.9,0.1, got {options['mixture']!r}") from None
    if options.get("param_mean") is not None:
        changes["param_mean"] = options["param_mean"]
    if changes and task.name != "relu_network":
        raise ConfigError("--mixture and --param-mean apply to ReLU-network tasks only")
    if options.get("points"):
        changes["n_points"] = options["points"]
    return dataclasses.replace(task, **changes) if changes else task


def _show_curve(t: StageTables, block) -> list[str]:
    """The curves as tables, and under a shift with --track the learners and which one the model tracks."""
    ckpt = t.ckpt
    task = ckpt.config.task
    number = lambda v: f"{v:.4f}"
    prompts = t.recipe.prompts
    lines = [
        f"{ckpt.path} ({ckpt.format}, {task.name}, d={task.n_dims}); {prompts.curve} prompts, seed {prompts.seed}; "
        "squared error / d:"
    ]
    lines.append(t["icl_error"].to_string(index=False, float_format=number))
    if "icl_r2" in t:
        lines += ["R^2:", t["icl_r2"].to_string(index=False, float_format=number)]
    if "shift_tracking" in t:
        lines.append(
            t["shift_tracking"].drop(columns="shift").to_string(index=False, float_format=lambda v: f"{v:.4g}")
        )
        lines.append(t.data["shift_tracking"]["words"])
    return lines


EVALUATE = Command(
    "evaluate",
    help="Error vs number of in-context examples, beside baselines",
    doc="""Squared error / d against the number of in-context examples, beside least squares,
3-nearest neighbours and averaging, with a bootstrap 5-95% band for the model (icl_error.csv,
icl_error.png). For ReLU-network tasks also R^2 (scikit-learn's, over prompts, per number of
examples) beside training the N-layer network directly on each prompt's examples (Wu et al. 2024,
App. G; icl_r2.csv). Shifts: --mixture (input mixture weights), --param-mean (network parameter
mean), --points beyond the training length (ReLU tasks); --shift NAME[=VALUE], Garg et al.'s
evaluation prompt families for isotropic linear regression (probe/data/shifts.py: random_quadrants,
opposite_quadrants, orthogonal_train_test, overlapping_train_test, half_subspace, skewed,
scale_x=S, scale_y=S, noisy=SIGMA), every baseline asked the same shifted queries; with --track,
which reference learner (each at its member matched to the model in distribution) the model
tracks under the shift (probe/analysis/shift_tracking.py: shift_tracking.csv and .json).
evaluate_summary.json holds the curves, the options given, the recipe and provenance.

examples:
  icl-probe evaluate checkpoints/gpt2-default
  icl-probe evaluate checkpoints/gpt2-default --prompts 1280 --seed 0 --out /tmp/eval
  icl-probe evaluate checkpoints/gpt2-relu3 --mixture 0.7,0.3 --param-mean 0.5 --points 32
  icl-probe evaluate checkpoints/gpt2-default --shift scale_x=3 --out /tmp/eval-scale3
  icl-probe evaluate checkpoints/planted/gd --shift scale_x=3 --track""",
    flags=(("prompts", {"curve": "prompts", "seed": "seed"}),),
    arguments=_curve_arguments,
    adjust=_checked_curve,
    options=_curve_options,
    show=_show_curve,
)


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


class EvaluateStage(FieldsAsKeys):
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
    commands = (EVALUATE,)
    files = ("shift_tracking",)

    def run(self, c) -> StageTables:
        """The curves on [prompts].curve prompts; `icl-probe evaluate`'s options (`CURVE_OPTIONS`)
        shift the task or the prompts (a report gives none)."""
        o, prompts, model = c.options, c.recipe.prompts, c.ckpt.model
        task, points = evaluated_task(c.ckpt.config.task, o), o.get("points")
        if o.get("shift") is not None:
            curve = shifted_error_curve(model, task, o["shift"], None, prompts.curve, prompts.seed, points, c.device)
            if not o.get("track"):
                return StageTables({"icl_error": curve})
            table, answer = self._tracking(c, task)
            return StageTables({"icl_error": curve, "shift_tracking": table}, {"shift_tracking": answer})
        tables = {"icl_error": error_curve(model, task, prompts.curve, prompts.seed, points, device=c.device)}
        if task.name == "relu_network":  # Wu et al. 2024, App. G: R^2 beside direct training of the network
            tables["icl_r2"] = r2_curve(
                model,
                task,
                prompts.curve,
                prompts.seed,
                points,
                device=c.device,
                epochs=o.get("epochs", DIRECT_EPOCHS),
                direct_prompts=o.get("direct_prompts", DIRECT_PROMPTS),
                progress=c.progress,
            )
        return StageTables(tables)

    @staticmethod
    def _tracking(c, task) -> tuple[pd.DataFrame, dict[str, Any]]:
        """(the shift tracking's table, its answer): which learner the model tracks under the
        command's shift (probe/analysis/shift_tracking.py)."""
        from ..analysis.shift_tracking import track_under_shift, tracking_words

        prompts = c.recipe.prompts
        tracking = track_under_shift(c.ckpt.model, task, c.options["shift"], prompts.curve, prompts.seed, c.device)
        best = tracking.best
        answer = {
            "tracks": tracking.tracks,
            "runner_up": tracking.runner_up,
            "criterion": best.criterion,
            "difference": best.difference,
            "ci_low": best.low,
            "ci_high": best.high,
            "separable": tracking.separable,
            "tie": best.tie,  # non-empty: `tracks` is only the nearest family, and the model tracks none
            "words": tracking_words(tracking),
        }
        return tracking.table, answer

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
