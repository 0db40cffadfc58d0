"""The report's [interventions] stage (probe/core/stages.py): the causal checks of
probe/interventions/pipeline.py on a transformer - ablations, the patching heatmap and the check
of each learner's layer-to-iteration map - with its settings, summary.json block, figures, page
section, findings lines, paired verdicts and evidence-table rows."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.labels import label, sweep_titles
from ..analysis.matching import family_of
from ..analysis.pipeline import LayerSettings
from ..analysis.verdicts import verdict_words
from ..core import budget
from ..core.errors import ConfigError
from ..core.registry import unknown_name_message
from ..core.stages import OMIT, AnalysisStage, Command, StageTables, register_stage
from ..interventions import figures as plots
from ..interventions.patch import CLAIMED, SITES
from ..interventions.pipeline import (
    PARTS,
    InterventionSettings,
    degenerate_boundaries,
    iteration_verdict,
    layer_maps_from_best,
    run_interventions,
)
from ..interventions.runner import runner_refusal
from ..interventions.state import PICTURE as STATE_PICTURE
from ..models.sizes import shape_of


@dataclass
class Interventions:
    """The causal checks (probe/interventions/pipeline.py) with one verdict per layer map."""

    settings: dict[str, Any]
    ablation: dict[str, Any] | None = field(default=None, metadata=OMIT)
    patching: dict[str, Any] | None = field(default=None, metadata=OMIT)
    iteration: dict[str, dict[str, Any]] | None = field(default=None, metadata=OMIT)
    verdicts: list[str] = field(default_factory=list)


def _position(order: list[str], name: str) -> int:
    return order.index(name) if name in order else len(order)


CAUSAL_METRICS = {False: "context patch deviation", True: "state write deviation"}  # a causal map verdict's metric


MAP_CHECK = (
    "Is the layer-to-iteration map causal? At boundary l every token before the query is patched from a source run "
    "(X, y'); under the map 'boundary l holds the learner after k(l) steps, the blocks above add the remaining "
    "steps' the patched prediction moves by a fraction 1 - sum a_k(l) a_k(L) / sum a_k(L)^2 of the full change, "
    "with a_k the learner's change of prediction from y to y' (probe/interventions/patch.py). Consistency = "
    "observed / expected. The map is compared, paired over prompts, with named alternatives (shifted by -2, -1, +1, "
    "+2 boundaries, a constant map, the other learners' maps): the difference of their mean |observed - expected| "
    "with its 90% bootstrap interval, beside the most the two maps' expectations differ by (resolution). Where the "
    "patched context moves the prediction by the same fraction at every boundary (the learner's state lives in the "
    "context, as in the Newton constructions), no map predicts anything else and the check says it cannot test the "
    "map. One verdict per map:"
)
DESCRIPTION = (
    "Interventions (probe/interventions): TransformerLens hooks, or for GPT-2 models the same edit applied by "
    "resuming the forward pass from the edited layer (equal to the hooks to 1e-5). Correlation says a layer "
    "resembles a learner's iterate; these runs change what a layer writes and measure the prediction."
)
PATCHING = (
    "Activation patching ({site}): clean prompts (X, y) and corrupted prompts (X, y') with a fresh function; the "
    "clean activation at one layer and token replaces the corrupted one, and the cell is the fraction of the clean "
    "prediction restored at the final query (1: fully restored; a ratio of sums over prompts)."
)


# ----------------------------------------------------------------------------- commands


def _heads_by_default(p) -> None:
    p.set_defaults(**{"interventions.heads": True})  # `icl-probe ablate` ablates every head unless --no-heads


def _show_ablation(t, block: Interventions) -> list[str]:
    entry = block.ablation or {}
    skip = entry["skip"]
    lines = [
        f"error / d at {entry['n_examples']} examples: unablated {entry['baseline_error']:.4f}",
        "layer skipped: " + " ".join(f"L{l} {e:.3f}" for l, e in zip(skip["layer"], skip["error"])),
    ]
    for row in entry["most_harmful"]:
        where = f"L{row['layer']}.H{row['head']}" if row["component"] == "head" else f"L{row['layer']}.MLP"
        lines.append(f"  {where} {row['kind']}: +{row['increase']:.3f}")
    return lines


def _patch_arguments(p) -> None:
    p.add_argument(
        "--learners",
        nargs="*",
        dest="interventions.learners",
        help="sweeps whose layer maps are checked causally; none: skip the check "
        "(recipe: interventions.learners; default auto = newton, gd_log and the replay sweeps present)",
    )
    p.add_argument("--map-from", default=None, help="best_match.csv with the layer maps (default: computed with SimE)")


def _patch_recipe(recipe, args, ckpt):
    """The recipe with the sweeps whose maps are checked (their SimE matches alone: SimW off), the
    query refused where no example lies before it."""
    settings, n = recipe.interventions, ckpt.config.task.n_points
    if settings.query is not None and not 1 <= settings.query < n:
        raise ConfigError(f"--query must lie in 1..{n - 1} (examples before the query), got {settings.query}")
    known = {s.label: s for s in recipe.sweeps}
    labels = settings.learner_labels(recipe.sweeps)
    for name in labels:
        if name not in known:
            raise ConfigError(unknown_name_message("learner sweep", name, list(known)) + f" (in recipe {args.recipe})")
    if not labels:
        return recipe
    return replace(recipe, sweeps=[known[name] for name in labels], similarity=replace(recipe.similarity, simw=False))


def _map_file(args) -> dict[str, pd.DataFrame] | None:
    """--map-from: the best matches read from a best_match.csv (of `icl-probe heatmap` or a report's
    data/) in place of the layers stage."""
    if args.map_from is None:
        return None
    path = Path(args.map_from)
    if not path.is_file():
        raise ConfigError(
            f"--map-from {path}: no such file; give the best_match.csv of `icl-probe heatmap` or a report"
        )
    try:
        best = pd.read_csv(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise ConfigError(f"--map-from {path}: not a CSV table ({err})") from None
    if not {"sweep", "metric", "layer", "k"} <= set(best.columns):
        raise ConfigError(f"--map-from {path}: needs columns sweep, metric, layer, k (a best_match.csv)")
    return {"best_match": best}


def _show_patching(t, block: Interventions) -> list[str]:
    patching, sites = t["patching"], block.settings["sites"]
    view = patching[patching.site == "resid"] if "resid" in sites else patching
    table = view.pivot_table(index="layer", columns="token", values="restored", sort=False)
    lines = [
        "fraction restored at the query (rows: layer; last columns):",
        table.iloc[:, -6:].to_string(float_format=lambda v: f"{v:.2f}"),
    ]
    return lines + list(block.verdicts)


ABLATE = Command(
    "ablate",
    help="Zero-, mean- and skip-ablations of heads, MLPs and layers: error vs examples",
    doc="""Ablations through TransformerLens-named hooks: every attention head and MLP block zero- and mean-ablated
(mean over held-out prompts), and every layer's residual update skipped; the in-context error / d
against the number of examples for each, with bootstrap bands.

Writes ablation.csv (component, layer, head, kind, n_examples, error, error_lo, error_hi,
increase), ablation.png (components x examples, error increase) and interventions_summary.json.

examples:
  icl-probe ablate checkpoints/gpt2-default --out reports/ablate
  icl-probe ablate checkpoints/planted/gd --out /tmp/a --kinds skip""",
    flags=(("interventions", ["prompts", "kinds", "heads"]), ("prompts", ["seed"]), ("similarity", ["bootstrap"])),
    arguments=_heads_by_default,
    options=(("parts", ("ablate",)),),
    needs=(),
    show=_show_ablation,
)
PATCH = Command(
    "patch",
    help="Activation patching heatmap and the causal check of the layer-to-iteration map",
    doc="""Activation patching through TransformerLens-named hooks, and the causal check of the layer-to-iteration map.

Clean prompts (X, y) and corrupted prompts (X, y') share the x's but not the function. For every
layer boundary (and block attention / MLP output, with --sites) and token position, the clean
activation is patched into the corrupted run; the fraction of the clean prediction restored at
the final query is reported with bootstrap intervals (patching.csv, patching_<site>.png).

Iteration-consistent patching (probe/interventions/patch.py documents the equation): for each
learner map "boundary l holds learner A after k(l) steps" (from --map-from, a best_match.csv
of `icl-probe heatmap` or a report's data/, or else computed here with SimE and the settings of
--recipe, as the report computes it), every token
before each query is patched at boundary l from the source run; observed against expected
fractions per boundary, and the claimed map against shuffled maps (iteration_<learner>.csv).

examples:
  icl-probe patch checkpoints/gpt2-default --out reports/patch
  icl-probe patch checkpoints/gpt2-default --out /tmp/p --map-from reports/gpt2-default-quick/data/best_match.csv""",
    flags=(
        (
            "interventions",
            {"patch_prompts": "prompts", "sites": "sites", "query": "query", "max_positions": "max-positions"},
        ),
        ("prompts", ["seed"]),
        ("similarity", ["bootstrap"]),
    ),
    arguments=_patch_arguments,
    adjust=_patch_recipe,
    options=(("parts", ("patch", "iteration")), ("require_maps", True)),
    given=_map_file,
    inputs=("map_from",),
    show=_show_patching,
)


class InterventionsStage(AnalysisStage):
    """Causal checks: the report's `interventions` stage (module docstring)."""

    name = "interventions"
    settings = InterventionSettings
    block = Interventions
    title = "Causal checks"
    description = DESCRIPTION
    reads = ("readout", "similarity", "sweeps")
    needs = ("layers",)
    captions = (
        (
            "ablation",
            "Increase of the error / d over the unablated model when each head (output z zeroed, or replaced "
            "by its mean over held-out prompts), MLP block or whole layer update is removed, against the number "
            "of examples.",
        ),
        *((f"patching_{site}", PATCHING.format(site=site)) for site in SITES),
        (
            "iteration_consistency",
            "Observed fraction of the source's change after patching each boundary (with its 90% bootstrap "
            "interval), beside the fraction each learner's layer map predicts.",
        ),
    )
    commands = (ABLATE, PATCH)

    def run(self, c) -> StageTables:
        """The causal checks (those of a command's `parts` option: all in a report), each learner's map
        read from the layers stage's best matches."""
        recipe, settings = c.recipe, c.recipe.interventions
        labels = settings.learner_labels(recipe.sweeps)
        sweeps = [s for s in LayerSettings.from_recipe(recipe, c.device).sweeps if s.label in labels]
        best, parts = c.before("best_match"), c.options.get("parts", PARTS)
        maps = layer_maps_from_best(best, sweeps) if "iteration" in parts and sweeps else {}
        missing = [s.label for s in sweeps if s.label not in maps] if c.options.get("require_maps") else []
        if missing:  # `icl-probe patch`: every map asked for is checked, or the command says why not
            raise ConfigError(f"no SimE best matches for {missing} (the layer maps the causal check tests)")
        res = run_interventions(
            c.ckpt.model,
            c.ckpt.config.task,
            settings,
            parts=parts,
            layer_maps=maps,
            skip=degenerate_boundaries(best, sweeps) if maps else [],
            n_boot=recipe.similarity.bootstrap,
            seed=recipe.prompts.seed,
            device=c.device,
            progress=c.progress,
        )
        tables = {"ablation": res.ablation, "patching": res.patching}
        tables.update({f"iteration_{name}": frame for name, frame in res.iteration.items()})
        return StageTables({k: v for k, v in tables.items() if v is not None}, {"interventions": res.summary})

    def summarise(self, tables: dict[str, pd.DataFrame], recipe) -> Interventions:
        block = Interventions(**getattr(tables, "data", {})["interventions"])
        titles = sweep_titles(recipe.sweeps)
        block.verdicts = [
            iteration_verdict(label(name, titles), entry) for name, entry in (block.iteration or {}).items()
        ]
        return block

    def figures(self, t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        recipe, out = context.recipe, {}
        if "ablation" in t:  # each part's figures where that part ran (a command runs one)
            out["ablation"] = plots.ablation(t["ablation"], fig_dir / "ablation")[0]
        for site in t["patching"].site.unique() if "patching" in t else ():
            out[f"patching_{site}"] = plots.patching(t["patching"], site, fig_dir / f"patching_{site}")[0]
        order = [s.label for s in recipe.sweeps]  # panels in the recipe's sweep order, however the tables were read
        names = sorted(
            (k for k in t if k.startswith("iteration_")), key=lambda k: _position(order, k.removeprefix("iteration_"))
        )
        iteration = {k.removeprefix("iteration_"): t[k] for k in names}
        if iteration:
            out["iteration_consistency"] = plots.iteration_consistency(
                iteration, fig_dir / "iteration_consistency", sweep_titles(recipe.sweeps)
            )[0]
        return out

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        shape, points = shape_of(ckpt.config.model), ckpt.config.task.n_points
        return budget.intervention_estimates(shape, points, recipe.interventions, recipe.similarity.bootstrap)

    def findings(self, block, summary):
        return [f"Causal check: {v}." for v in block.verdicts]

    def tables(self, block: Interventions, summary, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """The skip ablation; the verdict and the observed and expected fractions of each layer map
        (named by its sweep's recipe title), and its comparison with the named alternatives."""
        out: dict[str, pd.DataFrame] = {}
        ablation = block.ablation
        if ablation:
            skip, n = ablation["skip"], ablation["n_examples"]
            # block l (TransformerLens's numbering) writes layer l + 1 (the report's: layer 0 is the embedding output)
            out[
                f"Ablations. Unablated error / d at t = {n}: {ablation['baseline_error']:.4f}. Removing one layer's whole "
                "residual update (skip: layer l + 1 := layer l):"
            ] = pd.DataFrame(
                {
                    "layer whose update is removed": [layer + 1 for layer in skip["layer"]],
                    "block (TransformerLens)": skip["layer"],
                    f"error / d at t = {n}": skip["error"],
                }
            )
        titles = summary.titles
        if block.iteration:
            maps = [label(name, titles) for name in block.iteration]
            out[MAP_CHECK] = pd.DataFrame({"layer map": maps, "verdict": block.verdicts})
        columns = ("boundary", "k", "observed", "expected", "consistency")
        for name, entry in (block.iteration or {}).items():
            fractions = pd.DataFrame({c: entry[c] for c in columns})
            fractions.attrs["missing"] = {
                "consistency": "- (expected below the noise floor)",
                "expected": "- (undefined: the map's last count does not move the prediction)",
            }
            out[f"{label(name, titles)}: observed and expected fractions by boundary"] = fractions
            rows = entry.get("map_alternatives") or []
            if rows:
                out[f"{label(name, titles)}: the map against its named alternatives"] = pd.DataFrame(
                    [
                        {
                            "alternative map": r["alternative"],
                            "deviation difference (alternative - claim)": f"{r['difference']:+.4f} "
                            f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]",
                            "resolution": f"{r['resolution']:.4f}",
                            "verdict": r["verdict"],
                        }
                        for r in rows
                    ]
                )
        return out

    def evidence(self, block: Interventions, summary, a: str, b: str) -> list[dict[str, Any]]:
        """The map check against another learner's map, where the two learners are the question's."""
        out = []
        for v in self.verdicts(block):
            other = v["sweep_b"]  # set where the alternative is another learner's map (not a shifted one)
            if other is None or {family_of(v["a"]), family_of(other)} != {a, b}:
                continue
            winner = None if v["winner"] is None else family_of(v["winner"] if v["winner"] == v["a"] else other)
            sign = 1 if family_of(v["a"]) == a else -1  # the check's difference is (other's - claimed's): a - b
            lo, hi = sorted((sign * v["ci_low"], sign * v["ci_high"]))
            picture = "state written" if v["metric"] == CAUSAL_METRICS[True] else "context patched"
            out.append(
                {
                    "instrument": f"causal map check ({picture}, claimed {v['a']})",
                    "favours": winner,
                    "effect": f"{v['verdict']}: the {v['b']} deviates {v['difference']:+.4f} [{v['ci_low']:+.4f}, "
                    f"{v['ci_high']:+.4f}] more than {v['a']}'s, resolution {v['resolution']:.4f}"
                    + (f" ({v['evidence']})" if v["evidence"] else ""),
                    "difference": sign * v["difference"],
                    "ci_low": lo,
                    "ci_high": hi,
                    "resolution": v["resolution"],
                    "validated_on": "",
                    "cannot_tell_apart": "validated only against shifted maps of the claimed learner; boundaries whose "
                    "layer predicts ~0 are left out of both maps",
                }
            )
        return out

    def verdicts(self, block: Interventions, tables=None) -> list[dict[str, Any]]:
        """The causal map check's comparisons (probe/interventions/patch.py compare_maps) as paired
        verdicts: a = the claimed map's learner, b = the alternative; the metric is the mean over
        boundaries of |observed - expected| of the intervention the check ran (the context patch, or the
        written state of probe/interventions/state.py), and the difference is b's minus a's."""
        out = []
        for name, entry in (block.iteration or {}).items():
            for row in entry.get("map_alternatives") or []:
                winner = name if row["winner"] == CLAIMED else row["winner"]
                verdict = {
                    "claim": "causal map",
                    "a": name,
                    "b": row["alternative"],
                    "metric": CAUSAL_METRICS[entry.get("picture") == STATE_PICTURE],
                    "difference": row["difference"],
                    "ci_low": row["ci_low"],
                    "ci_high": row["ci_high"],
                    "resolution": row["resolution"],
                    "verdict": verdict_words(winner, row["testable"], row.get("confirmed", True)),
                    "winner": winner,
                    "sweep_a": name,
                    "sweep_b": row.get("learner"),
                    "confirmed": row.get("confirmed"),
                    "evidence": entry.get("reason"),
                }
                out.append(verdict)
        return out

    def check(self, recipe) -> None:
        """interventions.learners names sweeps with an iteration axis."""
        with_axis = [s.label for s in recipe.sweeps if s.axis]
        for name in recipe.interventions.learner_labels(recipe.sweeps):
            if name not in with_axis:
                raise ConfigError(
                    "interventions.learners: " + unknown_name_message("sweep with an iteration axis", name, with_axis)
                )

    def refuses(self, ckpt):
        return runner_refusal(ckpt.model)


INTERVENTIONS = register_stage(InterventionsStage())
