"""Forgetting (Fu et al. 2024, App. A.4, eq. 16): after n examples, re-ask the model for an earlier
example's x_i and measure the squared error against its y_i, by the gap n - i."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd
import torch

from ..core.config import Section, setting
from ..core.memory import MemoryBudget
from ..core.settings import SweepSettings
from ..data.metrics import error_per_dim
from ..learners import check_sweep, run_learner
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


# ---------------------------------------------------------------- the recipe section (the stage: probe/stages/)


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
