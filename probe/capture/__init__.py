"""Activation capture: TransformerLens-named hook points for transformers, `run` for everything else."""

from .activations import RESID, Capture, capture, check_prompts_for
from .hooks import FINAL, READOUT, attn_pattern, resid, resid_names

__all__ = [
    "FINAL",
    "READOUT",
    "RESID",
    "Capture",
    "attn_pattern",
    "capture",
    "check_prompts_for",
    "resid",
    "resid_names",
]
