"""Evidence tables (issue 59): per question (two hypotheses the recipe compares), one row per
instrument with what it favours, its effect and paired interval, its resolution, the known-answer
models on which it was validated (tests that hold it), and what it cannot tell apart; then one
consolidated answer. Generated from summary.json alone, so a report, a study and the Python API
read the same thing.

Rows come from each instrument's own decision (`winner` fields, the spectral verdicts' classes),
never from parsing its words.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from ..analysis.matching import family_of
from ..core.stages import by_block_key
from .schema import EvidenceQuestion as Question
from .schema import (
    EvidenceRow,
    Spectral,
    Summary,
    Trend,
    Verdict,
)

# (a, b): the hypotheses a question weighs, by learner family; asked where the recipe sweeps both
QUESTIONS = (("newton", "gd"), ("gd", "ogd"), ("ridge", "least_squares"))

# what each instrument cannot tell apart, per question (the named equivalences)
EQUIVALENCES = {
    ("newton", "gd"): (
        "Newton from alpha I is GD with 2^k steps, and the seeds' Newton (M_0 = alpha S) is S-preconditioned GD "
        "with 2^k steps: at best the filter class and its rate are identified, not the procedure"
    ),
}
RATE_ONLY = (
    "measures a convergence rate: GD whose step count doubles per layer gives the same linear Newton trend, "
    "so it cannot tell the two apart"
)

# known-answer models on which an instrument names each candidate of a question, and the tests
# that hold it; an instrument absent here is not validated for that question
VALIDATED = {
    ("spectral filter", ("newton", "gd")): (
        "planted GD (GD class at every layer), planted Newton and Newton-ReLU (Newton class at every layer that "
        "holds an iterate), oracles running GD with 2^l steps and Newton from alpha I (GD class) and the seeds' "
        "Newton (Newton class): tests/test_spectral.py, tests/test_evidence.py"
    ),
}

SPECTRAL_SIDE = {"gd": "gd", "precond_gd": "newton", "ridge": "ridge", "least_squares": "least_squares"}


def evidence(summary: Summary) -> list[Question]:
    """Every question the report's sweeps allow, with its rows and consolidated answer."""
    return questions(
        Blocks(
            summary.recipe.get("sweeps", []),
            summary.verdicts,
            summary.trend,
            summary.spectral,
            summary.stages,
        )
    )


@dataclass
class Blocks:
    """The summary.json blocks the evidence reads (a Summary's, or built from an analysis directly)."""

    sweeps: list[dict[str, Any]]
    verdicts: list[Verdict] | None
    trend: dict[str, Trend]
    spectral: Spectral | None = None
    stages: dict[str, Any] = field(default_factory=dict)  # registered analyses' blocks


def questions(summary: Blocks) -> list[Question]:
    """The questions of `evidence`, from the blocks alone."""
    swept = {family_of(s.get("label", "")) for s in summary.sweeps}
    swept |= {s.get("learner", "") for s in summary.sweeps}
    out = []
    for a, b in QUESTIONS:
        if a not in swept or b not in swept:
            continue
        rows = [
            *_table1_rows(summary, a, b),
            *_trend_rows(summary, a, b),
            *_spectral_rows(summary, a, b),
            *_registered_rows(summary, a, b),
        ]
        out.append(_consolidate(a, b, rows))
    return out


def evidence_frame(questions: Iterable[Question]) -> pd.DataFrame:
    """One row per (question, instrument), plus a row per question's consolidated answer."""
    records = []
    for q in questions:
        for row in q.rows:
            records.append({"question": f"{q.a} vs {q.b}", **asdict(row)})
        records.append(
            {
                "question": f"{q.a} vs {q.b}",
                "instrument": "consolidated answer",
                "favours": q.answer,
                "effect": q.answer_words,
                "cannot_tell_apart": q.equivalence,
            }
        )
    return pd.DataFrame(records)


def _side(name: str) -> str:
    return family_of(name)


def _table1_rows(summary: Blocks, a: str, b: str) -> list[EvidenceRow]:
    out = []
    for metric, words in (("sime", "Table 1 SimE"), ("simw", "Table 1 SimW")):
        found = [
            v
            for v in summary.verdicts or []
            if v.claim == "final layer (Table 1)" and v.metric == metric and {_side(v.a), _side(v.b)} == {a, b}
        ]
        if not found:
            continue
        v = found[0]
        sign = 1 if _side(v.a) == a else -1  # differences as a - b
        lo, hi = sorted((sign * v.ci_low, sign * v.ci_high))
        out.append(
            EvidenceRow(
                words,
                None if v.winner is None else _side(v.winner),
                f"final layer's similarity {a} - {b} {sign * v.difference:+.4f} [{lo:+.4f}, {hi:+.4f}], "
                f"resolution {v.resolution:.4f}",
                sign * v.difference,
                lo,
                hi,
                v.resolution,
                cannot_tell_apart=EQUIVALENCES.get((a, b), ""),
            )
        )
    return out


def _trend_rows(summary: Blocks, a: str, b: str) -> list[EvidenceRow]:
    if (a, b) != ("newton", "gd"):
        return []
    fits = [tr.verdict for name, tr in summary.trend.items() if name != "gd" and _side(name) in (a, b) and tr.verdict]
    if not fits:
        return []
    return [EvidenceRow("best-match trend (a rate)", None, "; ".join(fits), cannot_tell_apart=RATE_ONLY)]


def _spectral_rows(summary: Blocks, a: str, b: str) -> list[EvidenceRow]:
    block = summary.spectral
    if block is None or (a, b) not in (("newton", "gd"), ("ridge", "least_squares")):
        return []
    decided: dict[str, list[int]] = {}
    for i, layer in enumerate(block.layer):
        fits = [fit for fit in block.by_variable.values()]
        classes = {fit.best_class[i] for fit in fits}
        if len(classes) == 1 and all(fit.separated[i] for fit in fits) and not _flat(fits, i):
            side = SPECTRAL_SIDE[classes.pop()]
            decided.setdefault(side, []).append(layer)
    named = {s: l for s, l in decided.items() if s in (a, b)}
    favours = next(iter(named)) if len(named) == 1 else None
    words = "; ".join(f"{side} class at layers {', '.join(map(str, ls))}" for side, ls in decided.items())
    if len(named) > 1:
        words += " (layers disagree)"
    ps = [
        f"{layer}: {p:.2f} [{lo:.2f}, {hi:.2f}]"
        for layer, p, lo, hi in zip(block.layer, block.p, block.p_low, block.p_high)
        if p is not None
    ]
    effect = (words or "no layer decided between the classes") + (
        "; exponent p per layer " + ", ".join(ps) if ps else ""
    )
    return [
        EvidenceRow(
            "spectral filter",
            favours,
            effect,
            validated_on=VALIDATED.get(("spectral filter", (a, b)), ""),
            cannot_tell_apart=EQUIVALENCES.get((a, b), ""),
        )
    ]


def _flat(fits, i: int) -> bool:
    """A layer that does not respond, or has converged, decides nothing."""
    return all(fit.max_r[i] is None or fit.max_r[i] <= 0.05 or (fit.min_r[i] or 0) > 0.95 for fit in fits)


def _registered_rows(summary: Blocks, a: str, b: str) -> list[EvidenceRow]:
    """The rows of the registered analyses that declare one (probe/core/stages.py `evidence`)."""
    rows = []
    for key, block in summary.stages.items():
        hook = by_block_key()[key].evidence
        rows += [EvidenceRow(**row) for row in (hook(block, a, b) if hook is not None else [])]
    return rows


def _consolidate(a: str, b: str, rows: list[EvidenceRow]) -> Question:
    validated = [r for r in rows if r.validated_on and r.favours in (a, b)]
    sides = {r.favours for r in validated}
    answer = sides.pop() if len(sides) == 1 else None
    decided = [r for r in rows if r.favours in (a, b)]
    if answer is not None:
        strongest = ", ".join(r.instrument for r in validated)
        words = f"{answer} (validated evidence: {strongest})"
    elif len({r.favours for r in validated}) > 1:
        words = "undecided: validated instruments disagree"
    elif decided:
        words = "undecided by validated evidence; unvalidated instruments suggest " + ", ".join(
            f"{r.favours} ({r.instrument})" for r in decided
        )
    else:
        words = "undecided: no instrument separates them"
    reference = answer or (decided[0].favours if decided else None)
    contradictions = [
        f"{r.instrument} favours {r.favours}" for r in decided if reference is not None and r.favours != reference
    ]
    return Question(a, b, rows, answer, words, EQUIVALENCES.get((a, b), ""), contradictions)
