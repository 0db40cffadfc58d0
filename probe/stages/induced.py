"""Each layer's induced weights (Fu et al. 2024, eq. 11-12), a provider stage: the weight vector each
layer's read-out implies on the first prompts.induced held-out prompts, fitted to its predictions at
fresh queries from the prompt's own input distribution (and from each half of them: the spectral
instrument's query-noise correction). The layers stage's SimW and span test and the spectral stage
read them (data induced_*, arrays the stage cache keeps); measured only where [similarity] simw is
on. No block, page or command of its own."""

from __future__ import annotations

from ..analysis.pipeline import LayerSettings, induced_costs, induced_layer_weights, induced_on
from ..core import budget
from ..core.settings import check_induced_queries
from ..core.stages import AnalysisStage, StageTables, register_stage
from ..models.sizes import shape_of
from .readout import fitted_readouts, held_out_prompts


class InducedStage(AnalysisStage):
    """The induced weights: the report's `induced` provider (module docstring)."""

    name = "induced"
    title = "Induced weights"
    description = "Each layer's induced weight vector on the held-out prompts (SimW's and the spectral filter's input)."
    reads = ("readout", "similarity")
    needs = ("readout",)

    def run(self, c) -> StageTables:
        settings = LayerSettings.from_recipe(c.recipe, c.device, c.memory)
        if not settings.similarity.simw:
            return StageTables()
        readouts = fitted_readouts(lambda name: c.before(name, "data"), c.ckpt.model)
        ev = held_out_prompts(c, settings)
        weights, queries, halves = induced_layer_weights(
            c.ckpt.model, c.ckpt.config.task, settings, readouts, ev, progress=c.progress
        )
        return StageTables({}, induced_on(weights, ev, settings, halves, queries).to_arrays())

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        """SimW's query forwards; a recipe whose SimW would be underdetermined is refused here, before
        any work."""
        if not recipe.similarity.simw:
            return []
        check_induced_queries(
            recipe.prompts.queries, ckpt.config.model.n_dims, where=ckpt.name, off="--set similarity.simw=false"
        )
        return induced_costs(shape_of(ckpt.config.model), ckpt.config.task, LayerSettings.from_recipe(recipe))


register_stage(InducedStage())
