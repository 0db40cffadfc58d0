"""The report's [steering] stage (probe/core/stages.py): causal probes, the residual stream steered
along what a linear probe decodes (the analysis: probe/interventions/steer.py) - its summary.json
block, figure and findings line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core import budget
from ..core.errors import ConfigError
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream, stream_generator
from ..core.stages import AnalysisStage, register_stage
from ..data.tasks import sample_prompts
from ..interventions.steer import SteeringSettings, check_cells, steering_refusal, steering_summary, steering_table
from ..models.sizes import shape_of


@dataclass
class SteeringBlock:
    """summary.json's `steering`: {target: {edit: {prefix: {layer, slope, slope_low, slope_high, r2,
    probe_r2}}}} (`steering_summary`)."""

    by_target: dict

    def to_json_value(self) -> dict:
        return self.by_target

    @classmethod
    def from_json_value(cls, value: dict) -> SteeringBlock:
        return cls(value)

    @classmethod
    def json_schema_value(cls, schema) -> dict:
        return {"type": "object"}


def steering_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Steering slope by layer (one panel per probe target), per prefix, with 90% intervals; the
    random-edit control dashed."""
    plt = pyplot()
    targets = sorted(table.target.unique())
    fig, axes = plt.subplots(1, len(targets), figsize=(4.6 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets):
        for i, (t, rows) in enumerate(table[table.target == target].groupby("prefix")):
            for edit, style in (("probe", "-o"), ("random", "--")):
                r = rows[rows.edit == edit].sort_values("layer")
                label = f"t = {t}" + (" (random edit)" if edit == "random" else "")
                ax.plot(r.layer, r.slope, style, color=f"C{i}", ms=3, label=label)
                if edit == "probe":
                    ax.fill_between(r.layer, r.slope_low, r.slope_high, color=f"C{i}", alpha=0.15)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set(xlabel="layer edited", ylabel="observed / expected move (slope)", title=f"probe of {target}")
    legend_outside(axes[0][-1], 7)
    return save_png(fig, stem)


class SteeringStage(AnalysisStage):
    """Causal probes: the report's `steering` stage (module docstring)."""

    name = "steering"
    papers = ("Akyurek et al. 2023, eq. 20-22: the attention-pooled probe whose direction is written",)
    settings = SteeringSettings
    block = SteeringBlock
    title = "Causal probes"
    description = (
        "Fit a linear attention-pooled probe of w_OLS or X^T y at each layer and prefix, edit the stream by the "
        "smallest change that moves what the probe decodes by a random delta, run the remaining layers, and "
        "measure whether the prediction moves as the decoded quantity says (x . delta for w_OLS; x . S^+ delta "
        "for X^T y, least squares' map), beside a random edit of the same size. Slope 1: the layers use what the "
        "probe reads; slope 0: the probe reads what they ignore."
    )
    captions = (
        (
            "steering",
            "Causal probes: at each layer boundary and prefix t, a linear probe of w_OLS (left) or X^T y (right) "
            "is fitted; the first 2t tokens are edited by the smallest change that moves what the probe decodes "
            "by a random delta, and the remaining layers run. Slope of the prediction's move against the move "
            "the decoded quantity implies, with 90% bootstrap intervals over prompts; dashed: a random edit of "
            "the same size. 1: the layers use what the probe reads; 0: they ignore it.",
        ),
    )
    cli = "steer"

    def run(self, c) -> dict[str, pd.DataFrame]:
        """Causal probes at the [steering] cells (refused for a model without a
        runner, and cells out of range, before any work)."""
        ckpt, recipe, device = c.ckpt, c.recipe, c.device
        settings, task, seed = recipe.steering, ckpt.config.task, recipe.prompts.seed
        if steering_refusal(ckpt):
            raise ConfigError(
                f"steering edits a transformer's residual stream; this checkpoint is a {ckpt.config.model.family} "
                "model (use a GPT-2 family, linear self-attention or planted checkpoint)"
            )
        layers, prefixes = settings.cells(ckpt.config.model.n_layer, task.n_dims, task.n_points)
        check_cells(ckpt.model, layers, prefixes, settings.targets, task.n_points)
        train, test = (
            sample_prompts(task, size, generator=stream_generator(seed, stream))
            for size, stream in (
                (settings.train_prompts, Stream.STEER_TRAIN),
                (settings.test_prompts, Stream.STEER_TEST),
            )
        )
        table = steering_table(
            ckpt.model,
            (train.xs, train.ys),
            (test.xs, test.ys),
            layers,
            prefixes,
            settings.targets,
            seed=seed,
            device=device,
        )
        return {"steering": table}

    def summarise(self, tables, recipe):
        return SteeringBlock(steering_summary(tables["steering"]))

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"steering": steering_figure(tables["steering"], fig_dir / "steering")[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        st, shape, n = recipe.steering, shape_of(ckpt.config.model), ckpt.config.task.n_points
        edits = (len(st.layers) or shape.layers + 1) * (len(st.prefixes) or 3) * len(st.targets) * 2
        return [
            budget.prompt_estimate("steering.train_prompts", st.train_prompts, shape, n),
            budget.prompt_estimate("steering.test_prompts", st.test_prompts, shape, n, edits),
        ]

    def findings(self, block: SteeringBlock, summary) -> str | None:
        """Per target, the probe edit's largest slope (layer, prefix) with its interval."""
        parts = []
        for target, by_edit in block.by_target.items():
            cells = [
                (series["slope"][i], series["slope_low"][i], series["slope_high"][i], series["layer"][i], t)
                for t, series in by_edit.get("probe", {}).items()
                for i in range(len(series["layer"]))
                if series["slope"][i] is not None
            ]
            if cells:
                slope, low, high, layer, t = max(cells)
                parts.append(f"{target}: slope {slope:.2f} [{low:.2f}, {high:.2f}] at layer {layer}, t = {t}")
        return (
            "Causal probes (the largest slope of a probe edit; 1: the layers use what it decodes): "
            + "; ".join(parts)
            + "."
            if parts
            else None
        )

    def refuses(self, ckpt):
        return steering_refusal(ckpt)


STEERING = register_stage(SteeringStage())
