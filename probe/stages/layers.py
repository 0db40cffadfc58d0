"""The layer analyses, the report's spine (Fu et al. 2024, §4): each layer's similarity (SimE, SimW) to
every swept learner over its grid with the best match and its trend, Table 1 (the final layer against
each learner) with its nulls and paired verdicts, and the span test, on the read-outs of the readout
stage (readout.py) and the induced weights of the induced stage (induced.py). It reads the built-in
sections [readout], [similarity] and [[sweeps]] and runs in every report; its blocks (best_match,
trend, table1, nulls, span) are top-level keys of summary.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.labels import Titles, label, layer_list, sweep_titles
from ..analysis.matching import family_of, trend_words
from ..analysis.pipeline import InducedWeights, LayerSettings, match_layers
from ..core import budget
from ..core.errors import ConfigError
from ..core.registry import unknown_name_message
from ..core.stages import Command, FieldsAsKeys, StageTables, register_stage
from ..io.outputs import safe_name
from ..models.constructions import CONSTRUCTIONS
from ..models.sizes import shape_of
from ..reporting import figures as plots
from ..reporting.compare import layer_rows, paired_layers
from ..reporting.layer_blocks import (
    LayerAnalyses,
    Match,
    Table1Entry,
    Trend,
    layer_analyses,
    table1_block,
    verdict_rows,
)
from ..reporting.page import table as html_table
from .readout import INDUCED_FLAGS, READOUT_FLAGS, held_out_prompts
from .sections import template_page

SECTIONS = ("readout", "similarity", "sweeps")  # the recipe sections it reads besides [prompts]
PAGE = (  # its page sections: (title, macro of templates/layers.html.j2, the figure that shows it or "")
    ("Layers vs reference learners", "matching", ""),
    ("Table 1: final layer against each learner", "table1", ""),
    ("Span of the examples", "span", "span"),
)


# ----------------------------------------------------------------------------- running


# ----------------------------------------------------------------------------- findings and caveats


def _sime(block: LayerAnalyses, name: str) -> Match | None:
    return block.best_match.get(name, {}).get("sime")


def _unit(summary: Any, sweep: str) -> str:
    """What a sweep's k counts: its grid axis as the recipe names it (iterations, steps)."""
    for s in summary.recipe.get("sweeps", []):
        if s.get("label") == sweep and s.get("axis"):
            return s["axis"]
    return "iterations" if "newton" in sweep else "steps"


def _trend_lines(block: LayerAnalyses, summary: Any) -> list[str]:
    out = []
    for name, tr in block.trend.items():
        if name == "gd" or not tr.verdict:
            continue
        match, tail = _sime(block, name), ""
        if match is not None and match.k:
            tail = (
                f"; final layer {match.k[-1]} [{match.k_low[-1]}, {match.k_high[-1]}]"
                f"{' (at grid end)' if match.at_grid_end[-1] else ''}"
            )
        out.append(
            f"Layers vs {label(name, summary.titles)} (SimE, a convergence rate): "
            f"{trend_words(tr, _unit(summary, name))}{tail}."
        )
    return out


def _ranked(block: LayerAnalyses) -> list[tuple[str, Table1Entry]]:
    """Table 1's families, closest to the final layer first."""
    rows = [(fam, e) for fam, e in block.table1.sime.items() if fam != "null"]
    return sorted(rows, key=lambda r: -r[1].similarity)


def _table1_line(block: LayerAnalyses, summary: Any) -> str | None:
    from ..reporting.findings import verdict_text

    rows = _ranked(block)
    if not rows:
        return None
    (fam, top), rest = rows[0], rows[1:]
    titles = summary.titles
    fam2, second = rest[0] if rest else (None, None)
    paired = next((v for v in summary.verdicts or [] if v.metric == "sime" and {v.a, v.b} == {fam, fam2}), None)
    # "closest" only where the paired verdict names the top family (or there is no runner-up)
    head = (
        "Final layer closest to"
        if second is None or (paired and paired.winner == fam)
        else "Final layer's highest SimE:"
    )
    text = f"{head} {label(fam, titles)} (SimE {top.similarity:.3f} [{top.ci_low:.3f}, {top.ci_high:.3f}])"
    if second is not None:
        text += f", runner-up {label(str(fam2), titles)} {second.similarity:.3f} [{second.ci_low:.3f}, {second.ci_high:.3f}]"
        if paired is not None:
            text += "; " + verdict_text(paired, titles)
    return text + "."


def _span_line(block: LayerAnalyses, d: int) -> str | None:
    span = block.span
    if span is None or not span.layer:
        return None
    last = max(span.layer)
    pairs = [
        (r, null)
        for l, t, r, null in zip(span.layer, span.n_examples, span.residual, span.random_null)
        if l == last and 1 <= t < d
    ]
    if not pairs:
        return None
    return (
        "Span of the examples (final layer): relative residual "
        + ", ".join(f"{r:.2f}" for r, _ in pairs)
        + f" at t = 1..{d - 1}, against "
        + ", ".join(f"{n:.2f}" for _, n in pairs)
        + " for a random vector."
    )


def _construction_line(block: LayerAnalyses, summary: Any) -> str | None:
    """For a planted model: its documented layer schedule, and whether the SimE matches recover it."""
    model = summary.checkpoint.model
    if str(model.get("planted") or "") not in CONSTRUCTIONS:  # "" for every family but planted
        return None
    c = CONSTRUCTIONS.get(model["planted"])
    if c.first is None:
        return None
    text = (
        f"Planted construction: {c.title}, {c.per_step} layer{'s' if c.per_step > 1 else ''} per {c.unit}, "
        f"first prediction at layer {c.first}"
    )
    if c.sibling:
        other = CONSTRUCTIONS.get(c.sibling)
        text += f" (the {'ReLU' if other.relu_attention else 'linear'}-attention construction needs {other.per_step})"
    match = _sime(block, c.matching_sweep)
    pairs = [(l, k) for l, k in zip(match.layer, match.k) if l >= c.first] if match else []
    by = f" of {label(c.matching_sweep, summary.titles)}" if c.matching_sweep != c.learner else ""
    if pairs:
        wrong = [l for l, k in pairs if k != c.layer_map(l)]
        text += (
            f"; the SimE best matches{by} recover this map at every predicting layer"
            if not wrong
            else f"; the SimE best matches{by} differ from it at {layer_list(wrong)}"
        )
    return text + "."


# ----------------------------------------------------------------------------- the page


def _readable(frame: pd.DataFrame, titles: Titles) -> pd.DataFrame:
    """Human labels for a best-match-like table: learner and metric names, flags as words."""
    out = frame.copy()
    for col in ("sweep", "learner", "family", "metric"):
        if col in out:
            out[col] = out[col].map(lambda name: label(name, titles))
    for col, text in (("degenerate", "not distinguishable from 0"), ("at_grid_end", "at grid end")):
        if col in out:
            out[col] = out[col].map(lambda v, t=text: t if bool(v) else "")
    out = out.drop(columns=[c for c in ("predicts_zero",) if c in out])
    return out.rename(
        columns={
            "zero_similarity": "SimE vs zero predictor",
            "random_similarity": "SimE vs random model",
            "degenerate": "null check",
            "at_grid_end": "grid",
        }
    )


def _verdict_row(v: Any, titles: Titles) -> dict[str, str]:
    return {
        "metric": {"sime": "SimE", "simw": "SimW"}.get(v.metric, v.metric),
        "a": label(v.a, titles),
        "b": label(v.b, titles),
        "difference a - b": f"{v.difference:+.4f} [{v.ci_low:+.4f}, {v.ci_high:+.4f}]",
        "resolution": f"{v.resolution:.4f}",
        "verdict": v.verdict if v.winner is None else label(v.winner, titles) + " closer",
        "what separates them": v.evidence or "",
    }


# ----------------------------------------------------------------------------- evidence

RATE_ONLY = (
    "measures a convergence rate: GD whose step count doubles per layer gives the same linear Newton trend, "
    "so it cannot tell the two apart"
)


def _table1_rows(verdicts: list | None, a: str, b: str, equivalence: str) -> list[dict[str, Any]]:
    out = []
    for metric, words in (("sime", "Table 1 SimE"), ("simw", "Table 1 SimW")):
        found = [
            v
            for v in verdicts or []
            if v.claim == "final layer (Table 1)" and v.metric == metric and {family_of(v.a), family_of(v.b)} == {a, b}
        ]
        if not found:
            continue
        v = found[0]
        sign = 1 if family_of(v.a) == a else -1  # differences as a - b
        lo, hi = sorted((sign * v.ci_low, sign * v.ci_high))
        out.append(
            {
                "instrument": words,
                "favours": None if v.winner is None else family_of(v.winner),
                "effect": f"final layer's similarity {a} - {b} {sign * v.difference:+.4f} [{lo:+.4f}, {hi:+.4f}], "
                f"resolution {v.resolution:.4f}",
                "difference": sign * v.difference,
                "ci_low": lo,
                "ci_high": hi,
                "resolution": v.resolution,
                "cannot_tell_apart": equivalence,
            }
        )
    return out


def _trend_rows(trend: dict[str, Trend], a: str, b: str) -> list[dict[str, Any]]:
    if (a, b) != ("newton", "gd"):
        return []
    fits = [tr.verdict for name, tr in trend.items() if name != "gd" and family_of(name) in (a, b) and tr.verdict]
    if not fits:
        return []
    return [
        {
            "instrument": "best-match trend (a rate)",
            "favours": None,
            "effect": "; ".join(fits),
            "cannot_tell_apart": RATE_ONLY,
        }
    ]


# ----------------------------------------------------------------------------- commands


def _learner_arguments(p) -> None:
    p.add_argument(
        "--learners",
        nargs="+",
        default=None,
        help="sweep labels of the recipe to run (default: all of the recipe's sweeps)",
    )


def _chosen_sweeps(recipe, args, ckpt):
    """The recipe with only the sweeps --learners names (all without it)."""
    if args.learners is None:
        return recipe
    known = {s.label: s for s in recipe.sweeps}
    for name in args.learners:
        if name not in known:
            raise ConfigError(unknown_name_message("learner sweep", name, list(known)) + f" (in recipe {args.recipe})")
    return replace(recipe, sweeps=[known[name] for name in args.learners])


def _show_heatmap(t, block: LayerAnalyses) -> list[str]:
    decimals = lambda v: f"{v:.3f}"
    lines = [t["best_match"].to_string(index=False, float_format=decimals)]
    lines += [f"{trend['verdict']} [{trend['metric']}]" for trend in t.data.get("trends", [])]
    lines += ["final layer (Table 1, SimE):", t["table1"].to_string(index=False, float_format=decimals)]
    if not t["verdicts"].empty:
        cols = ["metric", "a", "b", "difference", "ci_low", "ci_high", "resolution", "verdict"]
        lines += ["paired verdicts (final layer; probe/analysis/verdicts.py):"]
        lines += [t["verdicts"][cols].to_string(index=False, float_format=lambda v: f"{v:+.4f}")]
    return lines


def _show_span(t, block: LayerAnalyses) -> list[str]:
    d = t.ckpt.config.task.n_dims
    span = t["span"]
    if span.empty:
        return ["no induced weights: the span test needs similarity.simw = true"]
    view = span[(span.kind == "layer") & (span.n_examples < d)]
    table = view.pivot_table(index="index", columns="n_examples", values="residual").rename_axis("layer")
    null = {t: round(((d - t) / d) ** 0.5, 3) for t in range(1, d)}
    return [table.to_string(float_format=lambda v: f"{v:.3f}"), f"random-vector null: {null}"]


LAYER_FLAGS = READOUT_FLAGS + INDUCED_FLAGS
HEATMAP = Command(
    "heatmap",
    help="Layer-vs-learner SimE/SimW heatmaps, best matches, trend verdicts",
    doc="""Layer-vs-algorithm heatmaps (Fu et al. 2024, Def. 4, Fig. 3): SimE and SimW between every layer
(with a retrained read-out) and every reference learner over its grid, best matches with
bootstrap intervals, trend verdicts, the final layer's "Table 1" similarities and the paired
verdicts between its learners, each with its resolution (probe/analysis/verdicts.py); the span test too.

examples:
  icl-probe heatmap checkpoints/gpt2-default --out reports/heatmap
  icl-probe heatmap checkpoints/gpt2-default --out /tmp/h --learners newton gd_log --no-simw""",
    flags=(*LAYER_FLAGS, ("similarity", ["simw", "include_first"])),
    arguments=_learner_arguments,
    adjust=_chosen_sweeps,
    show=_show_heatmap,
)
SPAN = Command(
    "span",
    help="Span-of-examples test of each layer's induced weights",
    doc="""Span-of-examples test (Fu et al. 2024, App. B.4, eq. 41-42): how far each layer's induced weight
vector lies outside span{x_1..x_t}, beside a random vector's sqrt((d-t)/d) and the learners (the layers
stage: its heatmaps and matches are written too).

examples:
  icl-probe span checkpoints/gpt2-default --out reports/span""",
    flags=LAYER_FLAGS,
    show=_show_span,
)


class LayersStage(FieldsAsKeys):
    """Layers vs reference learners: the report's `layers` stage (module docstring)."""

    name = "layers"
    papers = (
        "Fu et al. 2024, eq. 9-12: SimE and SimW",
        "Fu et al. 2024, Def. 4 and Table 1: layer-to-iteration matching",
    )
    block = LayerAnalyses
    title = "Layers vs reference learners"
    description = (
        "Each layer's similarity to every swept learner (best match, trend, Table 1, paired verdicts) and the span "
        "test."
    )
    reads = SECTIONS
    needs = ("readout", "induced")
    commands = (HEATMAP, SPAN)
    files = ("trends",)

    def run(self, c) -> StageTables:
        """Every layer against every sweep, on the readout stage's predictions and the induced stage's
        weights (`match_layers`)."""
        settings = LayerSettings.from_recipe(c.recipe, c.device, c.memory)
        ev = held_out_prompts(c, settings)
        induced = InducedWeights.from_arrays(lambda name: c.before(name, "data"))
        predictions = c.before("layer_predictions", "data")
        res = match_layers(c.ckpt.model, settings, ev, predictions, induced, progress=c.progress)
        tables = {
            "heatmap_cells": res.cells,
            "best_match": res.best,
            "table1": res.table1,
            "span": res.span,
            "nulls": res.nulls,
            "verdicts": res.verdicts,
        }
        return StageTables(tables, {"trends": res.trends, "timings": res.timings})

    def summarise(self, tables, recipe):
        return layer_analyses(tables, recipe)

    def figures(self, t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        recipe, out = context.recipe, {}
        titles = sweep_titles(recipe.sweeps)
        for sweep in recipe.sweeps:
            key = f"heatmap_{sweep.label}"
            out[key] = plots.heatmap_pair(
                t["heatmap_cells"], t["best_match"], sweep.label, sweep.axis, fig_dir / safe_name(key), titles=titles
            )[0]
            if sweep.axis:
                key = f"trend_{sweep.label}"
                out[key] = plots.best_match_trend(
                    t["best_match"], sweep.label, "sime", fig_dir / safe_name(key), titles
                )[0]
        if not t["span"].empty:
            out["span"] = plots.span(t["span"], fig_dir / "span")[0]
        return out

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        """The sweeps' learners and the bootstrap intervals of every layer x grid cell (the read-outs and
        the induced weights: their own stages)."""
        shape, p = shape_of(ckpt.config.model), recipe.prompts
        return budget.match_estimates(shape, ckpt.config.task.n_points, p, recipe.similarity, recipe.sweeps)

    def findings(self, block: LayerAnalyses, summary: Any) -> list[str | None]:
        d = summary.checkpoint.task["n_dims"]
        return [
            _construction_line(block, summary),
            *_trend_lines(block, summary),
            _table1_line(block, summary),
            _span_line(block, d),
        ]

    def caveats(self, block: LayerAnalyses, summary: Any) -> list[str]:
        out = []
        nulls = block.nulls
        zero_layers = [l for l, z in zip(nulls.layer, nulls.predicts_zero) if z] if nulls else []
        if zero_layers:
            out.append(
                f"{layer_list(zero_layers).capitalize()} predict{'s' if len(zero_layers) == 1 else ''} ~0 (||f|| < 0.1 ||y||): their matches are not "
                "distinguishable from predicting 0, whatever learner step they name."
            )
        swept = [s.get("label") for s in summary.recipe.get("sweeps", [])]
        for name in block.best_match:
            match = _sime(block, name)
            if match is None or (name in ("gd", "newton") and name not in swept):
                continue  # an alias of a swept label, said once under that label
            bad = [l for l, dg in zip(match.layer, match.degenerate or []) if dg and l not in zero_layers]
            if bad:
                out.append(
                    f"{label(name, summary.titles)}: SimE matches at {layer_list(bad)} are not distinguishable from "
                    "predicting 0 (the zero predictor scores within their interval)."
                )
            ends = [l for l, e in zip(match.layer, match.at_grid_end) if e]
            if ends:
                out.append(
                    f"{label(name, summary.titles)}: best matches at {layer_list(ends)} lie at the grid's end; the "
                    "true match may lie beyond it."
                )
        top = _ranked(block)
        if top and top[0][1].degenerate:
            out.append(
                "The final layer's closest learner is not distinguishable from predicting 0: Table 1 says nothing "
                "about which algorithm the model runs."
            )
        return out

    def tables(self, block: LayerAnalyses, summary: Any, t: dict[str, pd.DataFrame]) -> dict[str, str]:
        """The HTML tables its sections' macros read (templates/layers.html.j2): best, table1, verdicts."""
        titles, out = summary.titles, {}
        best, axes = t["best_match"], [s["label"] for s in summary.recipe.get("sweeps", []) if s.get("axis")]
        no_random = {"SimE vs random model": "- (no random-weights baseline)"}
        out["best"] = html_table(_readable(best[best.sweep.isin(axes)], titles), "{:.3f}", no_random)
        t1 = _readable(t["table1"], titles).rename(columns={"similarity": "SimE (final layer)"})
        if summary.compare is not None and "compare_table1" in t:
            other = _readable(t["compare_table1"][["family", "similarity"]], titles)
            name = Path(summary.compare["checkpoint"]["path"]).name
            t1 = t1.merge(other.rename(columns={"similarity": f"SimE ({name})"}), on="family", how="left")
        out["table1"] = html_table(t1, "{:.3f}", no_random)
        rows = [
            _verdict_row(v, titles) for v in summary.verdicts or [] if v.claim != "causal map"
        ]  # those: the map check
        if rows:
            out["verdicts"] = html_table(pd.DataFrame(rows))
        return out

    def evidence(self, block: Any, summary: Any, a: str, b: str) -> list[dict[str, Any]]:
        """Table 1's paired verdicts and the best-match trend on "a or b?" (read from the summary's
        verdicts and trend: a report's, or a study's evidence.Blocks)."""
        from ..reporting.evidence import EQUIVALENCES

        equivalence = EQUIVALENCES.get((a, b), "")
        return [
            *_table1_rows(summary.verdicts, a, b, equivalence),
            *_trend_rows(summary.trend, a, b),
        ]

    def verdicts(self, block, tables):
        return verdict_rows(tables.get("verdicts"), block.trend)

    def compare(self, mine, theirs, context):
        """Each model's layers by relative depth (read-out error / d at its own 2d+1 examples, and the
        spectral reading where that stage ran), each pair of layers' paired read-out error where the
        task is shared; summary.json: the compared model's Table 1 (SimE)."""
        names, dims = (mine.ckpt.name, theirs.ckpt.name), (mine.ckpt.config.task.n_dims, theirs.ckpt.config.task.n_dims)
        rows = layer_rows(names[0], mine, dims[0]) + layer_rows(names[1], theirs, dims[1])
        tables = {"comparison_layers": pd.DataFrame(rows)}
        if context.same_task:
            tables["comparison_paired_layers"] = paired_layers(mine, theirs, context.recipe, context.device)
        return tables, {"table1": {"sime": table1_block(theirs["table1"], degenerate=False)}}

    def page(self, block, summary, figs, tables, context):
        """Matches, Table 1 and the span test (templates/layers.html.j2)."""
        return template_page(self, "layers.html.j2", PAGE, block, summary, figs, tables, context)


register_stage(LayersStage())
