"""The report's opening block: findings and caveats, generated from summary.json alone."""

from __future__ import annotations

from ..analysis.labels import Titles, label, sweep_titles
from ..analysis.matching import trend_words
from ..core.stages import by_block_key
from ..models.constructions import CONSTRUCTIONS
from .schema import Match, Summary, Table1Entry, Verdict


# Names that are neither learners nor sweeps: metrics, probe targets, nulls and the error curve's
# k-NN baseline column. A learner reads as its registered title (probe/learners: LearnerSpec), a
# sweep as the title its recipe gives it (`title` of a [[sweeps]] or [[compare]] entry).
def summary_titles(summary: Summary) -> dict[str, str]:
    """The sweep titles of the recipe a summary records."""
    recipe = summary.recipe or {}
    forgetting = (recipe.get("forgetting") or {}).get("learners", [])
    return sweep_titles([*recipe.get("sweeps", []), *forgetting])


def _icl(summary: Summary, d: int) -> str | None:
    icl, t = summary.icl_error, 2 * d + 1
    if t not in icl.n_examples:
        return None
    i = icl.n_examples.index(t)
    return (
        f"In-context error / d at 2d+1 = {t} examples: {icl.model[i]:.4f} "
        f"(90% band {icl.model_lo[i]:.4f}-{icl.model_hi[i]:.4f}); least squares {icl.least_squares[i]:.4f}."
    )


def _layers(layers: list) -> str:
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def _sime(summary: Summary, name: str) -> Match | None:
    return summary.best_match.get(name, {}).get("sime")


def _unit(summary: Summary, sweep: str) -> str:
    """What a sweep's k counts: its grid axis as the recipe names it (iterations, steps)."""
    for s in summary.recipe.get("sweeps", []):
        if s.get("label") == sweep and s.get("axis"):
            return s["axis"]
    return "iterations" if "newton" in sweep else "steps"


def _verdicts(summary: Summary) -> list[str]:
    out = []
    for name, tr in summary.trend.items():
        if name == "gd" or not tr.verdict:
            continue
        block, tail = _sime(summary, name), ""
        if block is not None and block.k:
            tail = (
                f"; final layer {block.k[-1]} [{block.k_low[-1]}, {block.k_high[-1]}]"
                f"{' (at grid end)' if block.at_grid_end[-1] else ''}"
            )
        out.append(
            f"Layers vs {label(name, summary_titles(summary))} (SimE, a convergence rate): "
            f"{trend_words(tr, _unit(summary, name))}{tail}."
        )
    return out


def _ranked(summary: Summary) -> list[tuple[str, Table1Entry]]:
    """Table 1's families, closest to the final layer first."""
    rows = [(fam, e) for fam, e in summary.table1.sime.items() if fam != "null"]
    return sorted(rows, key=lambda r: -r[1].similarity)


def _table1(summary: Summary) -> str | None:
    rows = _ranked(summary)
    if not rows:
        return None
    (fam, top), rest = rows[0], rows[1:]
    titles = summary_titles(summary)
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


def verdict_text(v: Verdict, titles: Titles | None = None) -> str:
    """A paired verdict in words: the difference, its interval, the resolution and the verdict."""
    metric = {"sime": "SimE", "simw": "SimW"}.get(v.metric, v.metric)
    head = f"paired {metric} difference {label(v.a, titles)} - {label(v.b, titles)} {v.difference:+.4f} [{v.ci_low:+.4f}, {v.ci_high:+.4f}]"
    head += f", resolution {v.resolution:.4f}: "
    if v.winner is None:
        return head + v.verdict + (f"; what separates them: {v.evidence}" if v.evidence else "")
    return head + f"{label(v.winner, titles)} closer"


def _span(summary: Summary, d: int) -> str | None:
    span = summary.span
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


def _construction(summary: Summary) -> str | None:
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
    block = _sime(summary, c.matching_sweep)
    pairs = [(l, k) for l, k in zip(block.layer, block.k) if l >= c.first] if block else []
    by = f" of {label(c.matching_sweep, summary_titles(summary))}" if c.matching_sweep != c.learner else ""
    if pairs:
        wrong = [l for l, k in pairs if k != c.layer_map(l)]
        text += (
            f"; the SimE best matches{by} recover this map at every predicting layer"
            if not wrong
            else f"; the SimE best matches{by} differ from it at {_layers(wrong)}"
        )
    return text + "."


def caveats(summary: Summary) -> list[str]:
    out = []
    nulls = summary.nulls
    zero_layers = [l for l, z in zip(nulls.layer, nulls.predicts_zero) if z] if nulls else []
    if zero_layers:
        out.append(
            f"{_layers(zero_layers).capitalize()} predict{'s' if len(zero_layers) == 1 else ''} ~0 (||f|| < 0.1 ||y||): their matches are not "
            "distinguishable from predicting 0, whatever learner step they name."
        )
    swept = [s.get("label") for s in summary.recipe.get("sweeps", [])]
    titles = summary_titles(summary)
    for name in summary.best_match:
        block = _sime(summary, name)
        if block is None or (name in ("gd", "newton") and name not in swept):
            continue  # an alias of a swept label, said once under that label
        bad = [l for l, dg in zip(block.layer, block.degenerate or []) if dg and l not in zero_layers]
        if bad:
            out.append(
                f"{label(name, titles)}: SimE matches at {_layers(bad)} are not distinguishable from "
                "predicting 0 (the zero predictor scores within their interval)."
            )
        ends = [l for l, e in zip(block.layer, block.at_grid_end) if e]
        if ends:
            out.append(
                f"{label(name, titles)}: best matches at {_layers(ends)} lie at the grid's end; the "
                "true match may lie beyond it."
            )
    top = _ranked(summary)
    if top and top[0][1].degenerate:
        out.append(
            "The final layer's closest learner is not distinguishable from predicting 0: Table 1 says nothing "
            "about which algorithm the model runs."
        )
    for key, block in summary.stages.items():
        more = by_block_key()[key].caveats
        out += more(block, titles) if more is not None else []
    return out


def _spectral(summary: Summary) -> str | None:
    """Each layer's spectral verdict, grouped (probe/analysis/spectral.py), with the exponent where
    the verdict names one class."""
    block = summary.spectral
    if block is None:
        return None
    groups: dict[str, list[str]] = {}
    for layer, verdict, p, lo, hi in zip(block.layer, block.verdict, block.p, block.p_low, block.p_high):
        exponent = f" (p {p:.2f} [{lo:.2f}, {hi:.2f}])" if verdict in CLASS_WORDS and p is not None else ""
        groups.setdefault(CLASS_WORDS.get(verdict, verdict), []).append(f"{layer}{exponent}")
    parts = [f"{words}: {_layers(layers)}" for words, layers in groups.items()]
    return "Spectral filter per layer (exponent p: 1 GD class, 2 Newton class): " + "; ".join(parts) + "."


CLASS_WORDS = {
    "gd": "GD class",
    "precond_gd": "S-preconditioned class (the seeds' Newton)",
    "ridge": "ridge",
    "least_squares": "least squares",
}


def _registered(summary: Summary) -> list[str | None]:
    """The findings lines of the registered analyses that ran (probe/core/stages.py)."""
    lines: list[str | None] = []
    titles = summary_titles(summary)
    for key, block in summary.stages.items():
        hook = by_block_key()[key].findings
        line = hook(block, titles) if hook is not None else None
        lines += line if isinstance(line, list) else [line]
    return lines


def findings(summary: Summary) -> tuple[list[str], list[str]]:
    """(findings, caveats): short sentences for the top of the report."""
    d = summary.checkpoint.task["n_dims"]
    items = [
        *(f"{label(q.a)} or {label(q.b)}? {q.answer_words}." for q in summary.evidence or []),
        _construction(summary),
        _icl(summary, d),
        *_verdicts(summary),
        _table1(summary),
        _spectral(summary),
        _span(summary, d),
        *_registered(summary),
    ]
    return [i for i in items if i], caveats(summary)
