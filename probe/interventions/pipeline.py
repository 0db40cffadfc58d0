"""The causal checks end to end: prompts -> ablations, patching heatmap, iteration-consistent patching.

    settings = InterventionSettings(n_prompts=256)
    result = run_interventions(model, task, settings, layer_maps={"newton": (sweep, {0: 0, ...})})
    result.summary   # what summary.json stores under "interventions"

The layer maps come from the heatmap's best matches (`layer_maps_from_best`); the CLI computes
them with the layer analyses when no report's best_match.csv is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from ..config import TaskConfig
from ..errors import ConfigError
from .ablate import KINDS, ablate, summarise_ablation
from .patch import SITES, context_patching, iteration_patching, paired_prompts, patching_heatmap, spread_examples
from .runner import runner_for

HELD_OUT_SEED_OFFSET = 1  # mean-ablation means come from prompts of seed + 1


@dataclass
class InterventionSettings:
    n_prompts: int = 256  # evaluation prompts for ablations (and as many held out for mean-ablation)
    n_patch: int = 128  # prompt pairs for patching
    kinds: tuple[str, ...] = KINDS  # ablation kinds: zero, mean (per head and MLP), skip (per layer)
    heads: bool = True  # ablate single heads and MLPs (False: layer skips only)
    sites: tuple[str, ...] = ("resid",)  # patching sites: resid, attn_out, mlp_out
    query: int | None = None  # examples before the patching query (None: n - 1)
    max_positions: int = 0  # patching heatmap: the query token and this many - 1 before it (0: every token)
    max_queries: int = 0  # iteration check: pool at most this many numbers of examples t, evenly spread (0: all)
    ablate: bool = True
    patch: bool = True
    iteration: bool = True  # iteration-consistent patching of the layer maps given
    n_boot: int = 1000
    n_perm: int = 200
    seed: int = 0
    device: str = "cpu"
    layer_maps: dict = field(default_factory=dict, repr=False)  # filled by the caller: label -> (sweep, {boundary: k})

    def __post_init__(self) -> None:
        from ..validate import check_device, positive_int

        for name in ("n_prompts", "n_patch", "n_boot", "n_perm"):
            positive_int(getattr(self, name), f"interventions {name}")
        for name in ("max_positions", "max_queries"):
            positive_int(getattr(self, name), f"interventions {name}", 0)
        self.kinds, self.sites = tuple(self.kinds), tuple(self.sites)
        if set(self.kinds) - set(KINDS):
            raise ConfigError(f"interventions kinds must be among {KINDS}, got {list(self.kinds)}")
        if set(self.sites) - set(SITES):
            raise ConfigError(f"interventions sites must be among {SITES}, got {list(self.sites)}")
        check_device(self.device)


@dataclass
class InterventionResult:
    ablation: pd.DataFrame | None
    patching: pd.DataFrame | None
    iteration: dict[str, pd.DataFrame]
    summary: dict


def layer_maps_from_best(best: pd.DataFrame, sweeps, metric: str = "sime") -> dict:
    """label -> (sweep, {boundary: best-matching k}) from a heatmap's best-match table."""
    maps = {}
    for sweep in sweeps:
        rows = best[(best.sweep == sweep.label) & (best.metric == metric)]
        if sweep.axis is None or rows.empty:
            continue
        maps[sweep.label] = (sweep, {int(r.layer): _grid_value(r.k) for r in rows.itertuples()})
    return maps


def _grid_value(k):
    value = float(k)
    return int(value) if value.is_integer() else value


def run_interventions(
    model, task: TaskConfig, settings: InterventionSettings, progress: bool = False
) -> InterventionResult:
    runner = runner_for(model, settings.device)
    n = task.n_points
    summary: dict = {"settings": {k: v for k, v in settings.__dict__.items() if k != "layer_maps"}}
    ablation = patching = None
    iteration: dict[str, pd.DataFrame] = {}
    if settings.ablate:
        xs, ys, _ = paired_prompts(task, settings.n_prompts, settings.seed)
        hx, hy, _ = paired_prompts(task, settings.n_prompts, settings.seed + HELD_OUT_SEED_OFFSET)
        ablation = ablate(
            runner, xs, ys, (hx, hy), settings.kinds, settings.heads, settings.n_boot, settings.seed, progress=progress
        )
        summary["ablation"] = summarise_ablation(ablation, min(2 * task.n_dims + 1, n - 1))
    if settings.patch or (settings.iteration and settings.layer_maps):
        xs, ys, yc = paired_prompts(task, settings.n_patch, settings.seed)
        if settings.patch:
            patching = patching_heatmap(
                runner,
                xs,
                ys,
                yc,
                settings.sites,
                settings.query,
                settings.n_boot,
                settings.seed,
                progress=progress,
                max_positions=settings.max_positions,
            )
            summary["patching"] = summarise_patching(patching)
        if settings.iteration:
            summary["iteration"] = {}
            examples = spread_examples(n, settings.max_queries)
            patched = context_patching(
                runner, xs, ys, yc, list(range(runner.n_layers)), examples
            )  # shared by every map
            for label, (sweep, layer_map) in settings.layer_maps.items():
                frame, null = iteration_patching(
                    runner,
                    xs,
                    ys,
                    yc,
                    sweep,
                    layer_map,
                    n_boot=settings.n_boot,
                    n_perm=settings.n_perm,
                    seed=settings.seed,
                    patched=patched,
                )
                iteration[label] = frame
                summary["iteration"][label] = {
                    **null,
                    "boundary": frame.boundary.tolist(),
                    "k": frame.k.tolist(),
                    "observed": frame.observed.round(4).tolist(),
                    "expected": frame.expected.round(4).tolist(),
                    "consistency": frame.consistency.round(3).tolist(),
                }
    return InterventionResult(ablation, patching, iteration, summary)


def summarise_patching(frame: pd.DataFrame) -> dict:
    """Per site and layer: the token whose patch restores most, and the query token's share."""
    out = {}
    for site, rows in frame.groupby("site", sort=False):
        top = rows.loc[rows.groupby("layer").restored.idxmax()]
        query = rows[rows.position == rows.position.max()].sort_values("layer")
        out[site] = {
            "layer": top.layer.astype(int).tolist(),
            "top_token": top.token.tolist(),
            "top_restored": top.restored.round(4).tolist(),
            "query_restored": query.restored.round(4).tolist(),
        }
    return out


def iteration_verdict(label: str, entry: dict) -> str:
    """One sentence on the causal check of one learner's map."""
    dev, null, p = entry["deviation"], entry["null_deviation"], entry["p_value"]
    if math.isnan(dev):
        return f"{label}: no layers to test"
    better = "closer to the claimed map than to shuffled maps" if p < 0.05 else "not closer than shuffled maps"
    return (
        f"{label}: patched predictions deviate from the map's expectation by {dev:.3f} on average "
        f"(shuffled maps {null:.3f}, p = {p:.3f}): {better}"
    )
