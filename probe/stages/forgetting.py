"""The report's [forgetting] stage (probe/core/stages.py): the forgetting curves of the model and its
comparison learners (Fu et al. 2024, App. A.4, eq. 16; the analysis: probe/analysis/forgetting.py) -
its summary.json block and figure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..analysis.forgetting import ForgettingSettings, forgetting_table
from ..analysis.labels import label
from ..core import budget
from ..core.plotting import examples_axis, legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.stages import AnalysisStage, register_stage
from ..data.tasks import sample_prompts
from ..models.sizes import shape_of


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


class ForgettingStage(AnalysisStage):
    """Forgetting: the report's `forgetting` stage (module docstring)."""

    name = "forgetting"
    papers = ("Fu et al. 2024, App. A.4, eq. 16: forgetting",)
    settings = ForgettingSettings
    block = ForgettingCurves
    title = "Forgetting"
    description = (
        "After n - 1 examples, the model is asked again for an earlier example's x_i and scored against its "
        "y_i (Fu et al. 2024, App. A.4, eq. 16), by how long ago it was seen, beside the [forgetting] learners."
    )
    captions = (
        (
            "forgetting",
            "Squared error / d when an earlier example x_i is asked again after n-1 examples, by how long ago it "
            "was seen (Fu et al. 2024, App. A.4), for the model and reference learners.",
        ),
    )

    def run(self, c) -> dict[str, pd.DataFrame]:
        """The model's and each [forgetting] learner's curve on fresh prompts."""
        s = c.recipe.forgetting
        p = sample_prompts(
            c.ckpt.config.task, s.prompts, generator=stream_generator(c.recipe.prompts.seed, Stream.FORGETTING)
        )
        learners = {sweep.label: {"learner": sweep.learner, "grid": sweep.grid} for sweep in s.learners}
        return {"forgetting": forgetting_table(c.ckpt.model, p.xs, p.ys, learners, c.device, c.memory)}

    def summarise(self, tables, recipe):
        return forgetting_block(tables["forgetting"])

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"forgetting": forgetting_figure(tables["forgetting"], fig_dir / "forgetting")[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        points, shape = ckpt.config.task.n_points, shape_of(ckpt.config.model)
        return [budget.prompt_estimate("forgetting.prompts", recipe.forgetting.prompts, shape, points)]


FORGETTING = register_stage(ForgettingStage())
