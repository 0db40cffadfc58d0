"""Causal interventions with TransformerLens-named hooks on the model's own forward (ablations,
activation patching), and the public TransformerBridge for TransformerLens's own tools.

to_bridge(checkpoint_or_model)   a TransformerBridge fed (xs, ys) prompts   (probe/capture/handle.py)
ablate(runner, ...)              heads / MLPs / layer updates removed        (ablate.py)
patching_heatmap(runner, ...)    clean -> corrupted patching per layer x token (patch.py)
iteration_patching(runner, ...)  the causal check of a layer-to-iteration map (patch.py)
"""

from ..capture.handle import to_bridge
from .ablate import ablate, components
from .patch import iteration_patching, paired_prompts, patching_heatmap
from .runner import runner_for

__all__ = [
    "ablate",
    "components",
    "iteration_patching",
    "paired_prompts",
    "patching_heatmap",
    "runner_for",
    "to_bridge",
]
