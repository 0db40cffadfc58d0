"""Paired verdicts: is the final layer closer to learner a or to learner b, and could the data tell?

Both candidates are scored on the same prompts, so the question is answered by the per-prompt
difference Sim(layer, a) - Sim(layer, b) and a percentile bootstrap of its mean over prompts
(resampling prompts, as every interval of the report), not by comparing two separate intervals.

Resolution: even a model that *is* learner a at its matched hyper-parameter k_a scores only
Sim(a_{k_a}, b_{k_b}) against b at the hyper-parameter matched to the layer, so the largest
difference the comparison can show is `resolution` = 1 - Sim(a_{k_a}, b_{k_b}) (its mean over the
same prompts). For Iterative Newton against tuned GD it is ~0.01 on SimE (Fu et al. 2024's Table 1 cannot
separate them by more); the iterations-per-layer trend measures a rate and cannot either, and the
spectral filter (probe/analysis/spectral.py) is the instrument validated on both.

Verdict (`decide`, the one rule; `verdict_words` its text): the winner a or b when the paired
interval excludes 0 and is narrower than the resolution (half-width below it); otherwise none, "not
separable at this resolution". Code reads `winner`, never the text.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from torch import Tensor

from .similarity import first_best, sime, simw
from .stats import bootstrap_mean

NOT_SEPARABLE = "not separable at this resolution"
CANNOT_TEST = "cannot test here"
NEITHER = "neither map confirmed"


def decide(low: float, high: float, resolution: float, a: str, b: str, testable: bool = True) -> str | None:
    """The paired rule, written once: the winner of a against b, or None. `low`, `high` bound the
    mean of (score favouring a - score favouring b); a wins when the interval lies above 0, b when
    it lies below, either only when its half-width is below the resolution (the largest
    difference the comparison could show)."""
    if not testable or (high - low) / 2 >= resolution:
        return None
    return a if low > 0 else b if high < 0 else None


def verdict_words(winner: str | None, testable: bool = True, confirmed: bool = True) -> str:
    """A decision in words, the one place they are written: "<winner> closer", "not separable at
    this resolution", "cannot test here" or (a causal map check where neither map comes within
    the check's noise floor, `confirmed` False) "neither map confirmed"."""
    if not testable:
        return CANNOT_TEST
    if not confirmed:
        return NEITHER
    return NOT_SEPARABLE if winner is None else f"{winner} closer"


@dataclass
class Candidate:
    """One learner as matched to the final layer: its key, the sweep and grid value, the layer's
    similarity with it on each prompt (P,), and what the metric compares for the learner itself at
    that grid value: its predictions (P, n) for SimE, its induced weights (P, n, d) for SimW."""

    key: str
    sweep: str
    k: object
    per_prompt: Tensor
    outputs: Tensor


def paired_verdict(
    claim: str, metric: str, a: Candidate, b: Candidate, between: Tensor, n_boot: int = 1000, seed: int = 0
) -> dict:
    """One verdict row (module docstring); `between` (P,) is Sim(a_{k_a}, b_{k_b}) per prompt."""
    diff = (a.per_prompt - b.per_prompt).double()
    low, high = bootstrap_mean(diff, n_boot=n_boot, seed=seed)
    difference, lo, hi = float(diff.mean()), float(low), float(high)
    resolution = float(1 - between.double().mean())
    winner = decide(lo, hi, resolution, a.key, b.key)
    return {
        "claim": claim,
        "a": a.key,
        "b": b.key,
        "metric": metric,
        "sweep_a": a.sweep,
        "sweep_b": b.sweep,
        "k_a": a.k,
        "k_b": b.k,
        "difference": difference,
        "ci_low": lo,
        "ci_high": hi,
        "resolution": resolution,
        "winner": winner,
        "verdict": verdict_words(winner),
    }


def final_layer_verdicts(
    candidates: dict[str, Candidate], metric: str, similarity, n_boot: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """Verdicts of the learner closest to the final layer (by mean similarity) against every other:
    `candidates` maps each learner key to its best-matching sweep; `similarity(outputs_a, outputs_b)`
    gives the per-prompt similarity (P,) of two learners' outputs (SimE or SimW)."""
    ranked = sorted(candidates.values(), key=lambda c: -float(c.per_prompt.double().mean()))
    if len(ranked) < 2:
        return pd.DataFrame()
    top = ranked[0]
    rows = [
        paired_verdict(
            "final layer (Table 1)", metric, top, other, similarity(top.outputs, other.outputs), n_boot, seed
        )
        for other in ranked[1:]
    ]
    return pd.DataFrame(rows)


def pick(values: Tensor) -> int:
    """Grid index of the best mean similarity (values (K, P)), as best_match's first-best rule."""
    return int(first_best(values.double().mean(-1)))


def sime_between(ys: Tensor, include_first: bool):
    """SimE per prompt between two learners' predictions (P, n) on prompts with targets ys."""
    return lambda a, b: sime(a.unsqueeze(0), b.unsqueeze(0), ys, include_first)[0, 0]


def simw_between(a: Tensor, b: Tensor) -> Tensor:
    """SimW per prompt between two learners' induced weights (P, n, d)."""
    return simw(a.unsqueeze(0), b.unsqueeze(0))[0, 0]
