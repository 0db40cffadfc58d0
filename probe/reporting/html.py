"""index.html: one page (CSS inline, no scripts, nothing fetched from outside the report) that
links each figure from figures/ (stored once, as PNG), with a caption under every figure and the
tables behind it in data/. The sections' prose and captions are in templates/report.html.j2; this
module chooses the sections and renders their tables."""

from __future__ import annotations

import html
import json
from functools import partial
from pathlib import Path
from typing import Any

import markupsafe
import pandas as pd

from ..core.settings import query_count
from ..core.stages import by_block_key
from ..learners import LEARNERS
from ..models import family_class
from .findings import Titles, findings, label, summary_titles, sweep_titles
from .page import Page, Section, figure
from .page import table as _table
from .schema import Summary


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


def learner_methods(recipe) -> list[str]:
    """What each sweep of this recipe ran, in the learner's own words (LearnerSpec.describe)."""
    lines, titles = [], sweep_titles(recipe.sweeps)
    for sweep in recipe.sweeps:
        spec = LEARNERS.get(sweep.learner)
        if spec.describe is not None:
            lines.append(f"{label(sweep.label, titles)}: {spec.describe(sweep.grid)}.")
    return lines


def _training_rows(ckpt) -> list[tuple[str, Any]]:
    """The training recipe, when the checkpoint records it (icl-probe runs do; Garg's config less)."""
    if ckpt.format != "icl-probe":
        return [("training recipe", f"not recorded in the {ckpt.format} format")]
    tr, cur = ckpt.config.train, ckpt.config.curriculum
    rows = [
        (
            "optimizer",
            f"AdamW lr {tr.lr:g}, {tr.warmup_steps} warm-up steps, {tr.schedule} decay, batch {tr.batch_size}, "
            f"clip {tr.grad_clip:g}, seed {tr.seed}",
        )
    ]
    if cur.dims or cur.points:
        stage = lambda s: "fixed" if s is None else f"{s.start} -> {s.end} (+{s.inc} every {s.interval} steps)"
        rows.append(("curriculum", f"dims {stage(cur.dims)}; points {stage(cur.points)}"))
    if "train_seconds" in ckpt.meta:
        rows.append(("training wall time", f"{ckpt.meta['train_seconds']:.0f} s"))
    return rows


# (title, macro of templates/report.html.j2, shown when): the report's sections in reading order
SECTIONS = [
    ("Evidence: which algorithm?", "evidence", "evidence"),
    ("Model card", "model_card", None),
    ("Per-layer readout retraining", "readout", None),
    ("Layers vs reference learners", "matching", None),
    ("Table 1: final layer against each learner", "table1", None),
    ("Span of the examples", "span", "span"),
    ("Spectral filter of each layer", "spectral", "spectral_exponents"),
    ("Methods", "methods", None),
    ("Grids", "grids", None),
]


def render_html(built, summary: Summary, figs: dict[str, Path], ckpt, recipe, compare) -> str:
    """The report page: templates/page.html.j2 with the sections of templates/report.html.j2."""
    shown = set(figs)
    shown |= {"evidence"} if summary.evidence else set()
    items, caveats = findings(summary)
    context = {
        "summary": summary,
        "src": {name: f"{path.parent.name}/{path.name}" for name, path in figs.items()},
        "tables": _tables(built.tables, summary, ckpt, recipe, compare),
        "recipe": recipe,
        "label": partial(label, titles=summary_titles(summary)),
        "compare_name": compare.name if compare is not None else "",
        "learner_lines": learner_methods(recipe),
        "queries": query_count(recipe.prompts.queries, ckpt.config.task.n_dims),
    }
    return Page(
        title=f"icl-probe report: {summary.checkpoint.name} ({recipe.name} recipe)",
        subtitle="",
        findings=items,
        caveats=caveats,
        sections=_with_registered(
            [Section(title, macro=macro) for title, macro, when in SECTIONS if when is None or when in shown],
            summary,
            figs,
            built.tables,
        ),
        git=str(summary.git_commit),
        sections_template="report.html.j2",
        context=context,
    ).render()


def _with_registered(
    sections: list[Section], summary: Summary, figs: dict[str, Path], tables: dict[str, pd.DataFrame]
) -> list[Section]:
    """The sections of the registered analyses that ran (probe/core/stages.py), before Methods: the
    description, the tables their `tables` shows and their figures (their text escaped)."""
    added = []
    for name, block in summary.stages.items():
        declared = by_block_key()[name]
        parts = [f"<p>{html.escape(declared.description)}</p>"]
        for caption, frame in (declared.tables(block, tables) if declared.tables else {}).items():
            parts += [f"<p>{html.escape(caption)}</p>", _table(frame)]
        drawn = {key.split("/", 1)[1]: path for key, path in figs.items() if key.startswith(f"{declared.name}/")}
        captions = dict(declared.captions)
        parts += [figure(path, key, captions.get(key, f"{declared.title}: {key}")) for key, path in drawn.items()]
        added.append(Section(html.escape(declared.title), parts))
    at = next((i for i, section in enumerate(sections) if section.macro == "methods"), len(sections))
    return sections[:at] + added + sections[at:]


def _tables(t: dict[str, pd.DataFrame], summary: Summary, ckpt, recipe, compare) -> dict[str, Any]:
    """The report's tables as HTML, by the names templates/report.html.j2 reads (iteration: one
    table per layer map)."""
    out = {"card": _table(_model_card(summary, ckpt))}
    readout = summary.readout
    ro = pd.DataFrame({"layer": readout.layer, "error / d (mean over t >= 1)": readout.error})
    if readout.error_at_2d1:
        ro["error / d at t = 2d+1"] = readout.error_at_2d1
    out["readout"] = _table(ro)
    best = t["best_match"]
    titles = summary_titles(summary)
    out["best"] = _table(_readable(best[best.sweep.isin([s.label for s in recipe.sweeps if s.axis])], titles), "{:.3f}")
    t1 = _readable(t["table1"], titles).rename(columns={"similarity": "SimE (final layer)"})
    if compare is not None and "compare_table1" in t:
        other = _readable(t["compare_table1"][["family", "similarity"]], titles)
        t1 = t1.merge(other.rename(columns={"similarity": f"SimE ({compare.name})"}), on="family", how="left")
    out["table1"] = _table(t1, "{:.3f}")
    if summary.verdicts:
        rows = pd.DataFrame(
            [
                {
                    "metric": {"sime": "SimE", "simw": "SimW"}.get(v.metric, v.metric),
                    "a": label(v.a, titles),
                    "b": label(v.b, titles),
                    "difference a - b": f"{v.difference:+.4f} [{v.ci_low:+.4f}, {v.ci_high:+.4f}]",
                    "resolution": f"{v.resolution:.4f}",
                    "verdict": v.verdict if v.winner is None else label(v.winner, titles) + " closer",
                    "what separates them": v.evidence or "",
                }
                for v in summary.verdicts
                if v.claim != "causal map"  # those are listed with the map check
            ]
        )
        out["verdicts"] = _table(rows)
    if summary.spectral is not None:
        out.update(_spectral_tables(summary))
    for i, q in enumerate(summary.evidence or []):
        out[f"evidence_{i}"] = _table(_evidence_rows(q, titles))
    grids = [
        {"label": s.label, "learner": s.learner, "axis": s.axis, "grid": json.dumps(s.grid)} for s in recipe.sweeps
    ]
    out["grids"] = _table(pd.DataFrame(grids))
    html = {name: markupsafe.Markup(text) for name, text in out.items()}
    return html


def _evidence_rows(q, titles: Titles) -> pd.DataFrame:
    """One question's instruments: what each favours, its effect, validation and blind spot."""
    return pd.DataFrame(
        [
            {
                "instrument": r.instrument,
                "favours": "undecided" if r.favours is None else label(r.favours, titles),
                "effect": r.effect,
                "validated on known answers": r.validated_on or "not validated for this question",
                "cannot tell apart": r.cannot_tell_apart,
            }
            for r in q.rows
        ]
    )


def _spectral_tables(summary: Summary) -> dict[str, str]:
    """Per layer: the verdict, p in the best family's own variable, and each variable's best member."""
    sp = summary.spectral
    assert sp is not None
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    rows = []
    for i, layer in enumerate(sp.layer):
        row = {
            "layer": layer,
            "verdict": sp.verdict[i],
            "p [90%]": f"{fmt(sp.p[i])} [{fmt(sp.p_low[i])}, {fmt(sp.p_high[i])}] ({sp.variable[i]})",
        }
        for var, fit in sp.by_variable.items():
            k = fit.best_k[i]
            member = fit.best_family[i] + ("" if k is None else f" {fit.best_axis[i]}={k:g}")
            row[f"best fit, {var}"] = f"{member}, error {fit.error[i]:.4f}"
            row[f"runner-up - best, {var}"] = (
                f"{fit.runner_up[i]} {fit.difference[i]:+.4f} [{fit.diff_low[i]:+.4f}, {fit.diff_high[i]:+.4f}]"
            )
        row["not a filter"] = f"{sp.by_variable[sp.variable[i]].non_filter[i]:.3f}"
        rows.append(row)
    refs = ", ".join(f"{name} {fmt(r['p_median'])} ({r['variable']})" for name, r in sp.references.items())
    return {"spectral": _table(pd.DataFrame(rows)), "spectral_refs": refs}


def _model_card(summary: Summary, ckpt) -> pd.DataFrame:
    c = summary.checkpoint
    m = c.model
    return pd.DataFrame(
        [
            ("format", c.format),
            ("family", m["family"]),
            ("layers", m["n_layer"]),
            ("width", m["n_embd"]),
            ("heads", m["n_head"] if family_class(m["family"]).attention_heads else "-"),
            ("d", m["n_dims"]),
            ("points", m["n_positions"]),
            ("parameters", f"{c.parameters:,}"),
            ("task", f"{c.task['name']} ({c.task['covariance']})"),
            ("trained steps", "unknown" if c.train_step is None else c.train_step),
            ("sha256", c.sha256[:16] + "..."),
        ]
        + _training_rows(ckpt),
        columns=["field", "value"],
    )
