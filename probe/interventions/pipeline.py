"""The causal checks end to end: prompts -> ablations, patching heatmap, iteration-consistent patching.

    settings = InterventionSettings(prompts=256)     # below: recipe section [interventions]
    result = run_interventions(model, task, settings, layer_maps={"newton": (sweep, {0: 0, ...})})
    result.summary   # what summary.json stores under "interventions"

The layer maps come from the heatmap's best matches (`layer_maps_from_best`); the CLI computes
them with the layer analyses when no report's best_match.csv is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from ..core import budget
from ..core.config import Section, setting, to_dict
from ..core.errors import ConfigError
from ..core.seeds import Stream, stream_generator
from ..core.validate import check_bootstrap, check_device
from ..data.config import TaskConfig
from ..data.tasks import sample_prompts
from ..models.sizes import shape_of
from .ablate import KINDS, ablate, summarise_ablation
from .patch import (
    CLAIMED,
    SITES,
    context_patching,
    iteration_patching,
    paired_prompts,
    patching_heatmap,
    spread_examples,
)
from .runner import runner_for
from .state import PICTURE as STATE_PICTURE
from .state import source_xs, state_map_check, state_of

PARTS = ("ablate", "patch", "iteration")
CONTEXT_PICTURE = "context patched (the query accumulates the prediction)"


AUTO_CAUSAL_SWEEPS = ("newton", "gd_log", "sgd_replay", "adam_replay")


@dataclass
class InterventionSettings(Section):
    """Causal checks (probe/interventions/pipeline.py `run_interventions`): ablations, the
    patching heatmap, and iteration-consistent patching of the SimE layer maps of the sweeps in
    `learners`. Recipe section [interventions]; `icl-probe ablate` / `patch` flags."""

    SECTION = "interventions"

    enabled: bool = setting(True, "run the causal checks in reports (transformers only)")
    prompts: int = setting(64, "ablation prompts (and as many held out for mean-ablation)")
    patch_prompts: int = setting(32, "clean / corrupted prompt pairs for patching")
    kinds: tuple[str, ...] = setting(KINDS, "ablation kinds", KINDS, nonempty=True, noun="ablation kind")
    heads: bool = setting(False, "ablate single heads and MLPs too (--no-heads: layer skips and MLPs only)")
    sites: tuple[str, ...] = setting(("resid",), "patching sites", SITES, nonempty=True, noun="site")
    query: int | None = setting(
        None,
        "examples before the patching heatmap's query (none: n - 1; at least 1: a patch restores the clean "
        "examples' labels, and before the first example there are none)",
        minimum=1,
    )
    max_positions: int = setting(
        32, "patching heatmap: the query token and this many - 1 before it (0: every token)", minimum=0
    )
    max_queries: int = setting(
        8, "layer-map check: pool at most this many numbers of examples, evenly spread (0: all)", minimum=0
    )
    learners: tuple[str, ...] = setting(
        ("auto",),
        "sweeps whose SimE layer maps are checked causally (auto: newton, gd_log and the replay sweeps "
        "sgd_replay, adam_replay, those present)",
    )

    def learner_labels(self, sweeps: list) -> list[str]:
        """The sweep labels whose maps are checked ("auto": AUTO_CAUSAL_SWEEPS swept with an axis)."""
        if self.learners == ("auto",):
            return [s.label for s in sweeps if s.label in AUTO_CAUSAL_SWEEPS and s.axis]
        return list(self.learners)


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


def degenerate_boundaries(best: pd.DataFrame, sweeps, metric: str = "sime") -> list[int]:
    """Boundaries below the last whose layer predicts ~0 (`nulls.flag_degenerate`'s predicts_zero,
    a property of the layer, not of a learner): the causal map check leaves them out of every map
    alike. Without that column (a best_match.csv of `icl-probe heatmap`), the layers whose match
    is degenerate for every swept learner; without either, none."""
    last = int(best.layer.max())
    if "predicts_zero" in best:
        layers = best[best.predicts_zero.astype(bool)].layer
    elif "degenerate" in best:
        labels = [s.label for s in sweeps if s.axis is not None]
        rows = best[best.sweep.isin(labels) & (best.metric == metric)]
        every = rows.groupby("layer").degenerate.apply(lambda v: bool(v.astype(bool).all()))
        layers = every[every].index
    else:
        return []
    return sorted({int(l) for l in layers if int(l) < last})


def _grid_value(k):
    value = float(k)
    return int(value) if value.is_integer() else value


def run_interventions(
    model,
    task: TaskConfig,
    settings: InterventionSettings,
    parts: tuple[str, ...] = PARTS,
    layer_maps: dict | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = False,
    skip: Sequence[int] = (),
) -> InterventionResult:
    """The causal checks in `parts` (ablate, patch, iteration); the iteration check tests
    `layer_maps` (label -> (sweep, {boundary: k}), e.g. from `layer_maps_from_best`), leaving the
    boundaries in `skip` out of every context-patch map (`degenerate_boundaries`)."""

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ConfigError(f"intervention parts must be among {PARTS}, got {sorted(unknown)}")
    device, n_boot = check_device(device), check_bootstrap(n_boot, "bootstrap")
    layer_maps = layer_maps or {}
    runner = runner_for(model, device)
    budget.check(budget.intervention_estimates(shape_of(model), task.n_points, settings, n_boot))
    n = task.n_points
    summary: dict = {"settings": {**to_dict(settings), "bootstrap": n_boot, "seed": seed}}
    ablation = patching = None
    iteration: dict[str, pd.DataFrame] = {}
    if "ablate" in parts:
        xs, ys, _ = paired_prompts(task, settings.prompts, seed)
        held_out = sample_prompts(task, settings.prompts, generator=stream_generator(seed, Stream.HELD_OUT))
        hx, hy = held_out.xs, held_out.ys
        ablation = ablate(runner, xs, ys, (hx, hy), settings.kinds, settings.heads, n_boot, seed, progress=progress)
        summary["ablation"] = summarise_ablation(ablation, min(2 * task.n_dims + 1, n - 1))
    check_maps = "iteration" in parts and bool(layer_maps)
    if "patch" in parts or check_maps:
        xs, ys, yc = paired_prompts(task, settings.patch_prompts, seed)
        if "patch" in parts:
            patching = patching_heatmap(
                runner,
                xs,
                ys,
                yc,
                settings.sites,
                settings.query,
                n_boot,
                seed,
                progress=progress,
                max_positions=settings.max_positions,
            )
            summary["patching"] = summarise_patching(patching)
        if check_maps:
            iteration, summary["iteration"] = _check_layer_maps(
                runner, task, xs, ys, yc, settings, layer_maps, n_boot, seed, skip
            )
    return InterventionResult(ablation, patching, iteration, summary)


def _check_layer_maps(
    runner,
    task: TaskConfig,
    xs,
    ys,
    yc,
    settings: InterventionSettings,
    layer_maps: dict,
    n_boot: int,
    seed: int,
    skip: Sequence[int] = (),
) -> tuple[dict[str, pd.DataFrame], dict]:
    """The causal check of every map. Maps of the learner whose state the model says it keeps in
    the context (the Newton constructions) get the state check (state.py); the others get
    iteration-consistent patching, with the model's context patch run once and shared. Returns
    the per-map tables and their summary entries."""
    examples = spread_examples(xs.shape[1], settings.max_queries)
    state = state_of(runner)
    patched = None
    frames, entries = {}, {}
    for label, (sweep, layer_map) in layer_maps.items():
        if state is not None and sweep.learner == state.learner:
            source = source_xs(task, xs.shape[0], seed)
            frame, check = state_map_check(runner, xs, ys, source, layer_map, examples, n_boot=n_boot, seed=seed)
        else:
            if patched is None:
                patched = context_patching(runner, xs, ys, yc, list(range(runner.n_layers)), examples)
            others = {other: pair for other, pair in layer_maps.items() if other != label}
            frame, check = iteration_patching(
                runner,
                xs,
                ys,
                yc,
                sweep,
                layer_map,
                n_boot=n_boot,
                seed=seed,
                patched=patched,
                others=others,
                skip=skip,
            )
            check["picture"] = CONTEXT_PICTURE
        frames[label] = frame
        entries[label] = {
            **check,
            "boundary": frame.boundary.tolist(),
            "k": frame.k.tolist(),
            "observed": frame.observed.round(4).tolist(),
            "expected": frame.expected.round(4).tolist(),
            "consistency": frame.consistency.round(3).tolist(),
        }
    return frames, entries


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
    dev = entry["deviation"]
    if math.isnan(dev):
        return f"{label}: {entry.get('reason') or 'no layers to test'}"
    what = (
        "predictions resumed from a written state" if entry.get("picture") == STATE_PICTURE else "patched predictions"
    )
    head = f"{label}: {what} deviate from the map's expectation by {dev:.3f} on average"
    if entry.get("skipped"):
        head += f" (boundaries {', '.join(map(str, entry['skipped']))} left out of every map: their layers predict ~0)"
    if not entry.get("testable", True):
        return f"{head}; this check cannot test the map here: {entry['reason']}"
    if entry.get("confirmed") is False:
        head += f", beyond the check's noise floor {entry['noise_floor']:.3f}: not confirmed"
    rows = entry.get("map_alternatives", [])
    beaten = [r["alternative"] for r in rows if r["winner"] == CLAIMED]
    lost = [r["alternative"] for r in rows if r["winner"] not in (None, CLAIMED)]
    neither = [r["alternative"] for r in rows if r["testable"] and not r.get("confirmed", True)]
    tied = [r["alternative"] for r in rows if r["testable"] and r["winner"] is None and r.get("confirmed", True)]
    same = [r["alternative"] for r in rows if not r["testable"]]
    parts = []
    if neither:
        parts.append("no alternative map is confirmed either (" + ", ".join(neither) + ")")
    if beaten:
        parts.append("closer than " + ", ".join(beaten))
    if lost:
        parts.append("farther than " + ", ".join(lost))
    if tied:
        parts.append("not separable from " + ", ".join(tied))
    if same:
        parts.append("expects the same as " + ", ".join(same) + " (cannot test against them)")
    return head + " (paired over prompts): " + "; ".join(parts)
