"""Per-layer read-out retraining (Fu et al. 2024, §4.1), the first of the layer analyses: a fresh
linear read-out on every frozen layer's residual stream at the x tokens, fitted on training prompts
(its penalty chosen on validation prompts) and scored on held-out prompts, error / d per layer and
number of examples. It provides the read-outs and their predictions on the held-out prompts (data
`readouts`, `layer_predictions`) to the induced weights (induced.py), the layers stage and the order
stage. It reads [readout] and runs in every report; its block is summary.json's `readout`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.pipeline import LayerSettings, ModelLens, analysis_prompts, fit_readouts, readout_costs
from ..analysis.readout import LayerReadouts, readout_table
from ..core import budget
from ..core.stages import AnalysisStage, Command, StageTables, register_stage
from ..models.sizes import shape_of
from ..reporting import figures as plots
from ..reporting.layer_blocks import Readout, readout_block
from ..reporting.page import table as html_table
from .sections import template_page

PAGE = (("Per-layer readout retraining", "readout", ""),)  # its macro in templates/layers.html.j2
# the layer analyses' command flags: the read-outs' prompts, method and intervals ...
READOUT_FLAGS = (
    (
        "prompts",
        {"train": "train-prompts", "val": "val-prompts", "test": ("test-prompts", "eval-prompts"), "seed": "seed"},
    ),
    ("readout", {"method": "readout-method"}),
    ("similarity", ["bootstrap"]),
)
# ... and the induced weights' prompts and queries
INDUCED_FLAGS = (("prompts", {"induced": ("induced-prompts", "simw-prompts"), "queries": "queries"}),)


def _show(tables, block: Readout) -> list[str]:
    by_layer = pd.DataFrame({"layer": block.layer, "error": block.error})
    return [
        "mean error / d over examples >= 1, per layer:",
        by_layer.to_string(index=False, float_format=lambda v: f"{v:.4f}"),
    ]


READOUT = Command(
    "readout",
    help="Per-layer readout retraining: error / d per layer",
    doc="""Per-layer readout retraining (Fu et al. 2024, §4.1): a fresh linear read-out on every frozen layer,
fitted on training prompts and scored on held-out prompts (error / d per layer and examples).

examples:
  icl-probe readout checkpoints/gpt2-default --out reports/readout
  icl-probe readout checkpoints/lstm-default --out reports/readout-lstm --readout-method adam""",
    flags=READOUT_FLAGS,
    show=_show,
)


def fitted_readouts(data: Any, model: Any) -> LayerReadouts | ModelLens:
    """The read-outs this stage fitted, from its data (`get(name)`): the retrained ones, or the
    model's own lens (readout method 'model', which keeps no arrays)."""
    fitted = data("readouts")
    return ModelLens(model) if fitted is None else LayerReadouts.from_json(fitted)


def held_out_prompts(c: Any, settings: LayerSettings):
    """The layer analyses' held-out prompts (drawn from their own seed stream, as `fit_readouts`
    draws them)."""
    return analysis_prompts(c.ckpt.config.task, settings, "test", settings.prompts.test)


class ReadoutStage(AnalysisStage):
    """Per-layer readout retraining: the report's `readout` stage (module docstring)."""

    name = "readout"
    papers = ("Fu et al. 2024, §4.1: per-layer read-out retraining",)
    block = Readout
    title = "Per-layer readout retraining"
    description = "A fresh linear read-out on every frozen layer, scored on held-out prompts."
    reads = ("readout", "similarity")  # [similarity] bootstrap: the read-out errors' intervals
    commands = (READOUT,)

    def run(self, c) -> StageTables:
        settings = LayerSettings.from_recipe(c.recipe, c.device, c.memory)
        task = c.ckpt.config.task
        readouts, ev, predictions = fit_readouts(c.ckpt.model, task, settings, progress=c.progress)
        table = readout_table(
            predictions, ev.ys.numpy(), task.n_dims, settings.similarity.bootstrap, settings.prompts.seed
        )
        alphas = getattr(readouts, "alpha", None)
        data = {
            "readout_alpha": None if alphas is None else list(map(float, alphas)),
            "readouts": readouts.to_json() if isinstance(readouts, LayerReadouts) else None,
            "layer_predictions": predictions,  # (L+1, test prompts, n): what the layers stage matches
        }
        return StageTables({"readout": table}, data)

    def summarise(self, t, recipe) -> Readout:
        return readout_block(t["readout"], t.ckpt.config.task.n_dims, recipe, t.data.get("readout_alpha"))

    def figures(self, t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"readout": plots.readout_error(t["readout"], fig_dir / "readout", context.ckpt.config.task.n_dims)[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        return readout_costs(shape_of(ckpt.config.model), ckpt.config.task, LayerSettings.from_recipe(recipe))

    def tables(self, block: Readout, summary: Any, t: dict[str, pd.DataFrame]) -> dict[str, str]:
        """The HTML table its macro reads (templates/layers.html.j2): each layer's mean error."""
        ro = pd.DataFrame({"layer": block.layer, "error / d (mean over t >= 1)": block.error})
        if block.error_at_2d1:
            ro["error / d at t = 2d+1"] = block.error_at_2d1
        return {"readout": html_table(ro)}

    def compare(self, mine, theirs, context):
        """summary.json: the compared model's read-out errors (mean over t >= 1, per layer)."""
        readout = theirs["readout"]
        entry = {
            "layer": sorted(int(i) for i in readout.layer.unique()),
            "error": [float(v) for v in readout[readout.n_examples >= 1].groupby("layer").error.mean().values],
        }
        return {}, {"readout": entry}

    def compare_figures(self, mine, theirs, fig_dir: Path) -> dict[str, Path]:
        """Both models' mean read-out error per layer (compare_readout)."""
        if "readout" not in theirs:
            return {}
        name = theirs.ckpt.name if theirs.ckpt is not None else "compare"
        curves = {mine.ckpt.name: mine["readout"], name: theirs["readout"]}
        return {"compare_readout": plots.readout_comparison(curves, fig_dir / "compare_readout")[0]}

    def page(self, block, summary, figs, tables, context):
        """The read-outs' table and figure (templates/layers.html.j2)."""
        return template_page(self, "layers.html.j2", PAGE, block, summary, figs, tables, context)


register_stage(ReadoutStage())
