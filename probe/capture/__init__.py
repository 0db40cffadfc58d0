"""Activation capture: TransformerLens hooks for transformers, `run` for everything else."""

from .capture import RESID, Capture, capture, check_prompts_for
from .hooks import FINAL, READOUT, attn_pattern, resid, resid_names

__all__ = ["Capture", "capture", "check_prompts_for", "RESID", "FINAL", "READOUT", "resid", "resid_names", "attn_pattern"]
