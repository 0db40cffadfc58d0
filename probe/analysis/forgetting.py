"""Forgetting (Fu et al. 2024, App. A.4, eq. 16): after n examples, re-ask the model for an earlier
example's x_i and measure the squared error against its y_i, by the gap n - i."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from ..core import budget
from ..core.config import Section, setting
from ..core.memory import MemoryBudget
from ..core.plotting import examples_axis, legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.settings import SweepSettings
from ..core.stages import AnalysisStage, register_stage
from ..data.metrics import error_per_dim
from ..data.tasks import sample_prompts
from ..learners import check_sweep, run_learner
from ..models.sizes import shape_of
from .labels import label
from .states import query_predictions


def forgetting_table(
    model,
    xs: torch.Tensor,
    ys: torch.Tensor,
    learners: dict[str, dict],
    device: str = "cpu",
    memory: MemoryBudget | None = None,
) -> pd.DataFrame:
    """Rows (predictor, gap, error) for the model (its own prediction) and each learner.

    The prompt's first n-1 examples are the context; the queries are x_1..x_{n-1} themselves.
    """
    _, n, d = xs.shape
    t = n - 1
    queries = xs[:, :t]
    pred = query_predictions(model, xs[:, : t + 1], ys[:, : t + 1], queries, device, start=t, memory=memory)[:, 0]
    target = ys[:, :t].double()
    gaps = t - torch.arange(t)  # example i (0-based) was seen t - i examples ago
    rows = [
        {"predictor": "model", "gap": int(g), "error": float(e)}
        for g, e in zip(gaps, error_per_dim(pred, target, d).mean(0))
    ]
    for name, spec in learners.items():
        res = run_learner(spec["learner"], xs[:, : t + 1], ys[:, : t + 1], queries, **spec.get("grid", {}))
        assert res.query_preds is not None  # queries were given
        q = res.query_preds[0, :, t]  # (B, Q): after t examples
        rows += [
            {"predictor": name, "gap": int(g), "error": float(e)}
            for g, e in zip(gaps, error_per_dim(q, target, d).mean(0))
        ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the report stage (probe/core/stages.py)


def _forgetting_learners() -> list[SweepSettings]:
    return [
        SweepSettings("newton[3]", "newton", grid={"iterations": [3]}),
        SweepSettings("newton[10]", "newton", grid={"iterations": [10]}),
        SweepSettings("ogd", "ogd"),
        SweepSettings("least_squares", "least_squares"),
    ]


@dataclass
class ForgettingSettings(Section):
    """Forgetting curves (this module): recipe section [forgetting]."""

    SECTION = "forgetting"
    enabled: bool = setting(True, "draw forgetting curves in reports")
    prompts: int = setting(256, "prompts for the forgetting curves")
    # learners whose curves are drawn beside the model's (Fu et al. 2024, App. A.4, Fig. 11)
    learners: list[SweepSettings] = dataclasses.field(default_factory=_forgetting_learners)

    def __post_init__(self) -> None:
        super().__post_init__()
        for s in self.learners:
            check_sweep(s, "forgetting learner")


@dataclass
class ForgettingCurves:
    """Squared error / d on a reused x_i by the gap n - i, per predictor (the model and each learner):
    in summary.json {predictor: {gap: [...], error: [...]}}."""

    curves: dict[str, dict[str, list]]

    def to_json_value(self) -> dict[str, dict[str, list]]:
        return self.curves

    @classmethod
    def from_json_value(cls, value: dict[str, dict[str, list]]) -> ForgettingCurves:
        return cls(value)

    @classmethod
    def json_schema_value(cls, schema) -> dict:
        return {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"type": "array"}}}


def forgetting_block(table: pd.DataFrame) -> ForgettingCurves:
    return ForgettingCurves(
        {
            str(name): {"gap": [int(g) for g in r.gap], "error": [None if pd.isna(e) else float(e) for e in r.error]}
            for name, r in table.groupby("predictor")
        }
    )


def _run(c) -> dict[str, pd.DataFrame]:
    """The report stage: the model's and each [forgetting] learner's curve on fresh prompts."""
    s = c.recipe.forgetting
    p = sample_prompts(
        c.ckpt.config.task, s.prompts, generator=stream_generator(c.recipe.prompts.seed, Stream.FORGETTING)
    )
    learners = {sweep.label: {"learner": sweep.learner, "grid": sweep.grid} for sweep in s.learners}
    return {"forgetting": forgetting_table(c.ckpt.model, p.xs, p.ys, learners, c.device, c.memory)}


def _estimates(recipe, ckpt) -> list[budget.Estimate]:
    points, shape = ckpt.config.task.n_points, shape_of(ckpt.config.model)
    return [budget.prompt_estimate("forgetting.prompts", recipe.forgetting.prompts, shape, points)]


def _figures(tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
    return {"forgetting": forgetting_figure(tables["forgetting"], fig_dir / "forgetting")[0]}


def forgetting_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Error / d on a reused x_i by the gap n - i, the model and each learner (Fu et al. 2024, Fig. 11)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for name, rows in table.groupby("predictor"):
        ax.plot(rows.gap, rows.error.clip(lower=1e-12), "-o" if name == "model" else "--", label=label(name), ms=3)
    examples_axis(ax, "time-stamp gap n - i")
    ax.set(ylabel="squared error / d on reused x_i", yscale="log")
    legend_outside(ax, 7)
    return save_png(fig, stem)


FORGETTING = register_stage(
    AnalysisStage(
        name="forgetting",
        papers=("Fu et al. 2024, App. A.4, eq. 16: forgetting",),
        settings=ForgettingSettings,
        run=_run,
        block=ForgettingCurves,
        summarise=lambda tables, recipe: forgetting_block(tables["forgetting"]),
        title="Forgetting",
        description=(
            "After n - 1 examples, the model is asked again for an earlier example's x_i and scored against its "
            "y_i (Fu et al. 2024, App. A.4, eq. 16), by how long ago it was seen, beside the [forgetting] learners."
        ),
        figures=_figures,
        estimates=_estimates,
        captions=(
            (
                "forgetting",
                "Squared error / d when an earlier example x_i is asked again after n-1 examples, by how long ago it "
                "was seen (Fu et al. 2024, App. A.4), for the model and reference learners.",
            ),
        ),
    )
)
