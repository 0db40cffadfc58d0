"""GD with linear attention (von Oswald et al. 2023, eq. 1-2; `planted="gd"`, eta = planted_scale).

Tokens [x-slot, r-slot, xq-slot]; examples start as (x_i, y_i), the query as (x_q, 0). One head
with Q = K = x (xq for the query), V = -eta r: r_j <- r_j - eta/t sum_i r_i <x_i, x_j>, so after
l layers r_i = y_i - w_l.x_i and r_q = -w_l.x_q, w_l being l steps of GD on ||y - Xw||^2/(2t)
from 0 (Fu et al. 2024, eq. 6, paper convention). Read-out: -r_q. Layer l = GD step l.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Construction, PlantOptions, check_step, construction, gd_stable_limit, select

if TYPE_CHECKING:
    from ...core.settings import SweepSettings
    from ..config import ModelConfig
    from ..planted import PlantedICL


def fit_gd_sweeps(sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
    """GD sweeps compare with the planted step (paper convention) at every step count up to the depth."""
    for sweep in sweeps:
        if sweep.learner == "gd":
            sweep.grid = {
                **sweep.grid,
                "eta": [cfg.planted_scale],
                "convention": ["paper"],
                "steps": sorted(set(sweep.grid.get("steps", [])) | set(range(cfg.n_layer + 1))),
            }


@construction
class GD(Construction):
    name = "gd"
    title = "GD with linear attention (von Oswald et al.)"
    learner = "gd"
    first, per_step = 0, 1
    heads = 2
    matching_sweep = "gd"
    target_slot = "r"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        return [("x", d), ("r", 1), ("xq", d)]

    def plant(self, model: PlantedICL) -> None:
        """Head 0 of each layer: r_j -= eta/t sum_i r_i <x_i, x_j> (the construction's second head stays zero)."""
        cfg, s = model.config, model.layout
        for l in range(cfg.n_layer):
            model.q[l, 0] = select(s, "x", "x") + select(s, "x", "xq")  # query: x_j (or x_q)
            model.k[l, 0] = select(s, "x", "x")  # keys: examples' x (zero elsewhere)
            model.v[l, 0] = select(s, "r", "r", -cfg.planted_scale)
            model.per_example[l, 0] = 1
        model.read[s["r"]] = -1.0

    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        limit = gd_stable_limit(d)
        step = limit / 2 if options.step_size is None else options.step_size
        return {"n_head": 1, "planted_scale": check_step(step, limit, d, "GD on ||y - Xw||^2/(2t)")}

    def adapt_sweeps(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        fit_gd_sweeps(sweeps, cfg)
