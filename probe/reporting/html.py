"""index.html: one page (CSS inline, no scripts, nothing fetched from outside the report) that
links each figure from figures/ (stored once, as PNG), with a caption under every figure and the
tables behind it in data/. The report's own sections' prose is in templates/report.html.j2, the
spine stages' in probe/stages/templates/; this module chooses the sections and renders their tables."""

from __future__ import annotations

import html
import json
from functools import partial
from pathlib import Path
from typing import Any

import markupsafe
import numpy as np
import pandas as pd

from ..analysis.labels import Titles, label, sweep_titles
from ..core.settings import query_count
from ..core.stages import by_block_key
from ..learners import LEARNERS
from ..models import family_class
from .answer import first_screen
from .findings import findings
from .page import Page, Section, figure
from .page import table as _table
from .schema import Summary


def learner_methods(recipe) -> list[str]:
    """What each sweep of this recipe ran, in the learner's own words (LearnerSpec.describe)."""
    lines, titles = [], sweep_titles(recipe.sweeps)
    for sweep in recipe.sweeps:
        spec = LEARNERS.get(sweep.learner)
        if spec.describe is not None:
            lines.append(f"{label(sweep.label, titles)}: {spec.describe(sweep.grid)}.")
    return lines


def papers_run(summary: Summary) -> list[str]:
    """The papers whose methods the report's stages ran (each stage's `papers`), in report order, once each."""
    return list(dict.fromkeys(paper for key in summary.stages for paper in by_block_key()[key].papers))


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


def render_html(built, summary: Summary, figs: dict[str, Path], ckpt, recipe, compare, rendered: str = "") -> str:
    """The report page: templates/page.html.j2 with the evidence table (templates/report.html.j2),
    each analysis's sections in report order (probe/core/stages.py, each stage's `page`), the
    comparison, the methods and the grids; `rendered`: the commit re-rendering the page (probe/reporting/rerender.py)."""
    items, caveats = findings(summary, answers=False)  # the answers head the page's answer block
    answers, groups = first_screen(summary)
    titles = summary.titles
    context = {
        "summary": summary,
        "src": {name: f"{path.parent.name}/{path.name}" for name, path in figs.items()},
        "tables": _tables(built.tables, summary, ckpt, recipe),
        "recipe": recipe,
        "label": partial(label, titles=titles),
        "compare_name": compare.name if compare is not None else "",
        "learner_lines": learner_methods(recipe),
        "queries": query_count(recipe.prompts.queries, ckpt.config.task.n_dims),
        "papers": papers_run(summary),
    }
    sections = [Section("Evidence: which algorithm?", macro="evidence")] if summary.evidence else []
    for key, block in summary.stages.items():
        sections += _stage_sections(by_block_key()[key], block, summary, figs, built.tables, context)
    if summary.compare is not None and "comparison" in context["tables"]:
        sections.append(Section(f"Comparison with {html.escape(context['compare_name'])}", macro="comparison"))
    sections += [Section("Methods", macro="methods"), Section("Grids", macro="grids")]
    return Page(
        title=f"icl-probe report: {summary.checkpoint.name} ({recipe.name} recipe)",
        subtitle="",
        findings=items,
        caveats=caveats,
        answers=answers,
        layer_groups=groups,
        sections=sections,
        git=str(summary.git_commit),
        rendered=rendered if rendered != summary.git_commit else "",
        sections_template="report.html.j2",
        context=context,
    ).render()


def _stage_sections(
    declared,
    block: Any,
    summary: Summary,
    figs: dict[str, Path],
    tables: dict[str, pd.DataFrame],
    context: dict[str, Any],
) -> list[Section]:
    """An analysis's sections: those it writes itself (its `page`: the spine's, from its template's
    macros), or one section of its description, the tables its `tables` shows and its figures (text
    escaped)."""
    own = declared.page(block, summary, figs, tables, context)
    if own is not None:
        return [Section(title, [body]) for title, body in own]
    parts = [f"<p>{html.escape(declared.description)}</p>"]
    for caption, frame in declared.tables(block, summary, tables).items():
        parts += [f"<p>{html.escape(caption)}</p>", _table(frame)]
    drawn = {key.split("/", 1)[1]: path for key, path in figs.items() if key.startswith(f"{declared.name}/")}
    captions = dict(declared.captions)
    parts += [figure(path, key, captions.get(key, f"{declared.title}: {key}")) for key, path in drawn.items()]
    return [Section(html.escape(declared.title), parts)]


def _tables(t: dict[str, pd.DataFrame], summary: Summary, ckpt, recipe) -> dict[str, Any]:
    """The HTML tables the page's templates read, by name: the model card (the error curve's
    section), the evidence questions, the comparison and the grids (a stage's own are joined to these
    where it renders its section, probe/stages/sections.py)."""
    out = {"card": _table(_model_card(summary, ckpt))}
    for i, q in enumerate(summary.evidence or []):
        out[f"evidence_{i}"] = _table(_evidence_rows(q, summary.titles))
    out.update(_comparison_tables(t, summary))
    grids = [
        {"label": s.label, "learner": s.learner, "axis": s.axis, "grid": json.dumps(s.grid)} for s in recipe.sweeps
    ]
    out["grids"] = _table(pd.DataFrame(grids), missing={"axis": "- (no setting)"})
    return {name: markupsafe.Markup(text) for name, text in out.items()}


def _interval(v: Any, low: Any, high: Any, fmt: str) -> str:
    if v is None or pd.isna(v):  # nothing measured
        return "-"
    return f"{fmt.format(v)} [{fmt.format(low)}, {fmt.format(high)}]"


def _comparison_tables(t: dict[str, pd.DataFrame], summary: Summary) -> dict[str, str]:
    """`report --compare`'s own tables (probe/reporting/compare.py): each model's answers, its layers
    by relative depth, and the paired error difference where the two share a task."""
    if summary.compare is None or "comparison_layers" not in t:
        return {}
    other = Path(summary.compare["checkpoint"]["path"]).name
    mine = {f"{q.a} vs {q.b}": q.answer_words for q in summary.evidence or []}
    theirs = summary.compare.get("evidence", {})
    answers = pd.DataFrame(
        [
            {"question": k, summary.checkpoint.name: mine.get(k, "-"), other: theirs.get(k, "-")}
            for k in {**mine, **theirs}
        ]
    )
    layers = t["comparison_layers"]
    shown = pd.DataFrame(
        {
            "model": layers["model"],
            "layer": layers["layer"],
            "relative depth": [f"{v:.2f}" for v in layers["relative depth"]],
            "read-out error / d at 2d+1 [90%]": [
                _interval(r.error, r.low, r.high, "{:.4f}")
                for r in layers.rename(
                    columns={"read-out error / d": "error", "ci_low": "low", "ci_high": "high"}
                ).itertuples()
            ],
            "spectral verdict": layers["spectral verdict"].fillna(""),
            "p [90%]": [_interval(p, lo, hi, "{:.2f}") for p, lo, hi in zip(layers.p, layers.p_low, layers.p_high)],
        }
    ).iloc[np.lexsort((layers["model"], layers["relative depth"]))]
    out = {"comparison": _table(answers), "comparison_layers": _table(shown)}
    if "comparison_paired" in t:
        paired = t["comparison_paired"]
        names = {"a": summary.checkpoint.name, "b": other}
        out["comparison_paired"] = _table(
            pd.DataFrame(
                {
                    "examples": paired.n_examples,
                    f"error / d, {summary.checkpoint.name} - {other} [90%]": [
                        _interval(v, lo, hi, "{:+.4f}")
                        for v, lo, hi in zip(paired.difference, paired.ci_low, paired.ci_high)
                    ],
                    "lower": [names.get(v, "not separable") for v in paired.lower.fillna("")],
                }
            )
        )
    if "comparison_paired_layers" in t:
        pl = t["comparison_paired_layers"]
        out["comparison_paired_layers"] = _table(
            pd.DataFrame(
                {
                    f"layer, {summary.checkpoint.name}": pl.layer_a,
                    f"layer, {other}": pl.layer_b,
                    "relative depth": [f"{v:.2f}" for v in pl.relative_depth],
                    f"read-out error / d, {summary.checkpoint.name} - {other} [90%]": [
                        _interval(v, lo, hi, "{:+.4f}") for v, lo, hi in zip(pl.difference, pl.ci_low, pl.ci_high)
                    ],
                    "lower": pl.lower.fillna("not separable"),
                }
            )
        )
    return out


def _evidence_rows(q, titles: Titles) -> pd.DataFrame:
    """One question's instruments: what each favours, its effect, validation, the alternatives its known
    answers were told apart from, and its blind spot."""
    return pd.DataFrame(
        [
            {
                "instrument": r.instrument,
                "favours": "undecided" if r.favours is None else label(r.favours, titles),
                "effect": r.effect,
                "validated on known answers": _validation_words(r),
                "tested against": (r.domain or {}).get("tested_against") or "",
                "cannot tell apart": SHARED
                if q.equivalence and r.cannot_tell_apart == q.equivalence
                else r.cannot_tell_apart,
            }
            for r in q.rows
        ]
    )


SHARED = "the question's equivalence (stated above the table)"


def _validation_words(row) -> str:
    """Where a row's known answers hold, and whether this model is inside (validity domains)."""
    if not row.validated_on:
        return "not validated for this question"
    boxes = "; ".join(box["words"] for box in (row.domain or {}).get("boxes", []))
    where = f" (covers: {boxes})" if boxes else ""
    if row.status == "unvalidated here":
        return f"unvalidated here (outside: {row.outside}); validated on {row.validated_on}{where}"
    return row.validated_on + where


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
