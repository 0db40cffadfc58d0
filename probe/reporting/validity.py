"""Where an answer holds: the conditions each instrument's known answers cover, the model's own
conditions, and the precondition that the model learns in context at all.

An evidence row counts as validated only inside its `Domain` (the observable conditions of the
known-answer models its tests ran on); outside, it is shown as "unvalidated here (outside: ...)".
A question gets no answer at all when the model does not beat the predictors that need no in-context
learning (`learns_in_context`). Every block that gives no answer says so in one vocabulary:
`status` (STATUSES), `reason`, and the `knob` that would change it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..core.settings import induced_count
from ..core.validity import STATUSES, Domain, Validity

__all__ = ["STATUSES", "Domain", "Precondition", "Validity", "conditions", "learns_in_context"]


def conditions(summary: Any) -> dict[str, Any]:
    """The model's observable conditions from its summary: d, kappa (1 for isotropic inputs), label
    noise, the read-out the layer analyses used and the prompts their induced weights were measured
    on. Empty for a study's blocks (no checkpoint)."""
    ckpt = getattr(summary, "checkpoint", None)
    if ckpt is None:
        return {}
    task = ckpt.task if hasattr(ckpt, "task") else ckpt.get("task", {})
    out: dict[str, Any] = {"d": task.get("n_dims")}
    out["kappa"] = float(task.get("kappa", 1.0)) if task.get("covariance") == "ill_conditioned" else 1.0
    out["noise_std"] = float(task.get("noise_std", 0.0))
    readout = _get(summary, "readout")
    if readout is not None:
        out["readout"] = getattr(readout, "method", None)
    prompts = (getattr(summary, "recipe", None) or {}).get("prompts") or {}
    if "induced" in prompts:  # the prompts the layers' induced weights (spectral, SimW) are measured on
        out["prompts"] = induced_count(prompts["induced"], prompts.get("test", prompts["induced"]))
    return out


def _get(summary: Any, name: str) -> Any:
    try:
        return getattr(summary, name)
    except AttributeError:
        return None


@dataclass
class Precondition:
    """Whether the model learns in context: `status` "answered" (it does) or "no answer" / "not
    measured", with the reason in words and the knob that would change it."""

    status: str
    reason: str = ""
    knob: str = ""
    values: dict[str, float] = field(default_factory=dict)


def learns_in_context(summary: Any) -> Precondition:
    """The evidence table's precondition: at 2d + 1 examples (the last the prompts hold, if fewer),
    the model's error / d is below the better of the zero predictor and the averaging estimator
    x_q . X^T y / t, judged by the paired 90% interval of the margin (error curve, `trivial_margin`).
    A model above it (a 200-step model that never learned: error / d 0.70 at d = 4 where averaging
    gives about (d + 1) / t = 0.56) gets no algorithm answer."""
    curve = _get(summary, "icl_error")
    if curve is None or not getattr(curve, "trivial_margin", None):
        return Precondition("answered", "the error curve's margin was not measured (a summary from before it)")
    d = conditions(summary).get("d")
    n = list(curve.n_examples)
    at = n.index(2 * d + 1) if d is not None and 2 * d + 1 in n else len(n) - 1
    margin, lo, hi = curve.trivial_margin[at], curve.trivial_margin_lo[at], curve.trivial_margin_hi[at]
    values = {"n_examples": n[at], "model": curve.model[at], "margin": margin, "margin_lo": lo, "margin_hi": hi}
    if lo is not None and not math.isnan(lo) and lo > 0:
        return Precondition("answered", values=values)
    baseline = min(curve.zero[at], curve.averaging[at])
    reason = (
        f"no answer: the model's error / d at {n[at]} examples ({curve.model[at]:.3g}) is not below the better of "
        f"the zero predictor and the averaging estimator x_q . X^T y / t ({baseline:.3g}; paired 90% interval of "
        f"the margin [{lo:.3g}, {hi:.3g}]): the model does not learn in context here"
    )
    knob = "prompts.curve (the interval reaches 0)" if margin > 0 else "the model (train it further)"
    return Precondition("no answer", reason, knob, values)
