"""The report's first screen: each evidence question with its answer, the instruments that decided
it and the conditions their known answers cover; then what the layers look like (each group of
adjacent layers with the same spectral verdict, with the local exponent p and its 90% interval).
Generated from summary.json alone (its `evidence` and `spectral` blocks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.labels import Titles, label
from ..analysis.spectral_verdicts import verdict_classes, verdict_kinds
from .schema import EvidenceQuestion, EvidenceRow, Summary

# a spectral verdict as a reader of the first screen needs it (the class names of probe/analysis/spectral.py)
VERDICT_WORDS = {
    "gd": "first-order class (GD)",
    "precond_gd": "Iterative Newton class (M_0 = alpha S)",
    "ridge": "ridge class",
    "pcr": "principal-component regression class",
    "least_squares": "least squares",
    "no response": "no response (predicts ~0, or does not follow least squares)",
    "converged": "converged (r ~ 1 at every eigenvalue: any class that converges fits)",
}


@dataclass
class Answer:
    """One question's line: the answer, the instruments that decided it, where their known answers hold."""

    question: str
    answer: str
    decided_by: str
    holds_in: str


@dataclass
class LayerGroup:
    """Adjacent layers with the same spectral verdict."""

    layers: str
    looks_like: str
    exponent: str


def _validated(row: EvidenceRow) -> bool:
    return bool(row.validated_on) and row.status == "answered"


def _holds_in(rows: list[EvidenceRow]) -> str:
    """The conditions each deciding row's known answers cover (its validity domain's boxes)."""
    parts = []
    for row in rows:
        boxes = "; ".join(box["words"] for box in (row.domain or {}).get("boxes", []))
        parts.append(f"{row.instrument}: {boxes}" if boxes else f"{row.instrument}: {row.validated_on}")
    return " | ".join(parts)


def answer(q: EvidenceQuestion, titles: Titles | None = None) -> Answer:
    """A question's first-screen line; an undecided one says which instruments could have decided."""
    question = f"{label(q.a, titles)} or {label(q.b, titles)}?"
    if q.answer is not None:
        deciding = [r for r in q.rows if _validated(r) and r.favours == q.answer]
        named = q.answer_words.split(" (validated evidence")[0]
        return Answer(question, named, ", ".join(r.instrument for r in deciding), _holds_in(deciding))
    validated = [r.instrument for r in q.rows if _validated(r)]
    outside = [f"{r.instrument} (outside: {r.outside})" for r in q.rows if r.status == "unvalidated here"]
    decided_by = "no validated instrument decides"
    if validated:
        decided_by += f" (validated and undecided: {', '.join(validated)})"
    if outside:
        decided_by += f"; outside their known answers here: {', '.join(outside)}"
    return Answer(question, q.answer_words, decided_by, "-")


def _interval(p: Any, low: Any, high: Any) -> str:
    if p is None:
        return ""
    return f"{p:.2f} [{low:.2f}, {high:.2f}]" if low is not None and high is not None else f"{p:.2f}"


def layer_groups(spectral: Any) -> list[LayerGroup]:
    """Adjacent layers with one verdict, in layer order; the exponent where the verdict names a class."""
    if spectral is None:
        return []
    if spectral.status == "not measured":
        return [LayerGroup("all", f"not measured here: {spectral.reason}", "")]
    groups: list[tuple[list[int], str, list[str]]] = []
    kinds = verdict_kinds(spectral)
    for i, (layer, kind, p, low, high) in enumerate(
        zip(spectral.layer, kinds, spectral.p, spectral.p_low, spectral.p_high)
    ):
        exponent = _interval(p, low, high) if kind not in ("no response", "converged") else ""
        words = _verdict_words(spectral, i, kind)
        if groups and groups[-1][1] == words:
            groups[-1][0].append(layer)
            groups[-1][2].append(f"{layer}: {exponent}" if exponent else "")
        else:
            groups.append(([layer], words, [f"{layer}: {exponent}" if exponent else ""]))
    out = []
    for layers, words, exponents in groups:
        span = str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"
        shown = [e for e in exponents if e]
        if len(layers) == 1 and shown:
            shown = [shown[0].split(": ", 1)[1]]
        out.append(LayerGroup(span, words, "; ".join(shown)))
    return out


def _verdict_words(spectral: Any, i: int, kind: str) -> str:
    """Layer i's verdict as a reader needs it, from its kind and the classes it names (a summary before
    schema 9: the classes read from the verdict's words)."""
    verdict = spectral.verdict[i]
    if getattr(spectral, "best_class", None):
        best, other = spectral.best_class[i], spectral.other_class[i]
    else:
        best, other = (verdict_classes(verdict) + [""])[:2] if kind in ("class", "not separable") else ("", "")
    if kind == "class":
        return VERDICT_WORDS.get(best, best)
    if kind == "not separable":
        return f"{VERDICT_WORDS.get(best, best)}, not separated from the {VERDICT_WORDS.get(other, other)}"
    return VERDICT_WORDS.get(verdict, verdict)


def first_screen(summary: Summary) -> tuple[list[Answer], list[LayerGroup]]:
    """The answers (one per evidence question) and the layer groups of the page's answer block."""
    answers = [answer(q, summary.titles) for q in summary.evidence or []]
    return answers, layer_groups(summary.spectral)
