"""Evidence tables: per question (two hypotheses the recipe compares), one row per
instrument with what it favours, its effect and paired interval, its resolution, the known-answer
models on which it was validated (tests that hold it), and what it cannot tell apart; then one
consolidated answer. Generated from summary.json alone, so a report, a study and the Python API
read the same thing.

Rows come from each instrument's own decision (`winner` fields, the spectral verdicts' classes),
never from parsing its words.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

import pandas as pd

from ..analysis.matching import family_of
from ..core.stages import by_block_key
from .schema import EvidenceQuestion as Question
from .schema import EvidenceRow, Summary
from .validity import Precondition, conditions, learns_in_context

# (a, b): the hypotheses a question weighs, by learner family; asked where the recipe sweeps both
QUESTIONS = (("newton", "gd"), ("gd", "ogd"), ("ridge", "least_squares"))

# what each instrument cannot tell apart, per question (the named equivalences)
EQUIVALENCES = {
    ("newton", "gd"): (
        "Newton from alpha I is GD with 2^k steps, and Fu et al.'s Newton (M_0 = alpha S) is S-preconditioned GD "
        "with 2^k steps: at best the filter class and its rate are identified, not the procedure"
    ),
}


def evidence(summary: Summary) -> list[Question]:
    """Every question the report's sweeps allow, with its rows and consolidated answer."""
    return questions(summary)


def questions(summary: Summary | Any) -> list[Question]:
    """The questions of `evidence`: one per pair of QUESTIONS the recipe sweeps both of, its rows
    given by the registered analyses (probe/core/stages.py `evidence`) that ran."""
    sweeps = summary.recipe.get("sweeps", [])
    swept = {family_of(s.get("label", "")) for s in sweeps} | {s.get("learner", "") for s in sweeps}
    pre = learns_in_context(summary)
    return [_consolidate(a, b, _rows(summary, a, b), pre) for a, b in QUESTIONS if a in swept and b in swept]


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


def _rows(summary: Summary | Any, a: str, b: str) -> list[EvidenceRow]:
    """Each analysis's rows on "a or b?", in report order, from the analyses that ran (`summary`: a
    Summary, or any object with its attributes and `stages`). A row
    whose known answers (`validity.Domain`) do not cover the model's conditions is marked
    "unvalidated here" with the conditions outside."""
    rows, model = [], conditions(summary)
    for key, stage in by_block_key().items():
        block = summary.stages.get(key)
        if block is not None:
            for row in stage.evidence(block, summary, a, b):
                domain = row.pop("domain", None)
                out = domain.outside(model) if domain is not None and row.get("validated_on") else []
                extra: dict[str, Any] = {"domain": domain.to_json()} if domain is not None else {}
                if out:
                    extra.update(status="unvalidated here", outside=", ".join(out))
                rows.append(EvidenceRow(**row, **extra))
    return rows


def _validated(row: EvidenceRow) -> bool:
    return bool(row.validated_on) and row.status != "unvalidated here"


def _consolidate(a: str, b: str, rows: list[EvidenceRow], pre: Precondition | None = None) -> Question:
    """The consolidated answer: the side every validated row that decides (inside its domain) agrees
    on, "neither" where they agree the model is far from both; none where the model does not learn
    in context (`validity.learns_in_context`)."""
    equivalence = EQUIVALENCES.get((a, b), "")
    if pre is not None and pre.status != "answered":
        return Question(a, b, rows, None, pre.reason, equivalence, [], pre.status, pre.reason, pre.knob)
    validated = [r for r in rows if _validated(r) and r.favours in (a, b, "neither")]
    sides = {r.favours for r in validated}
    answer = sides.pop() if len(sides) == 1 else None
    decided = [r for r in rows if r.favours in (a, b, "neither")]
    if answer is not None:
        strongest = ", ".join(r.instrument for r in validated)
        closest = "; ".join(dict.fromkeys(r.closest for r in validated if r.closest))
        words = f"{answer} (validated evidence: {strongest})"
        if answer == "neither":  # far from both sides' classes
            words = f"neither {a} nor {b}: closest {closest} (validated evidence: {strongest})"
    elif len({r.favours for r in validated}) > 1:
        words = "undecided: validated instruments disagree"
    elif decided:
        words = "undecided by validated evidence; unvalidated instruments suggest " + ", ".join(
            f"{r.favours} ({r.instrument}" + (f", unvalidated here: outside {r.outside})" if r.outside else ")")
            for r in decided
        )
    else:
        words = "undecided: no instrument separates them"
    reference = answer or (decided[0].favours if decided else None)
    contradictions = [
        f"{r.instrument} favours {r.favours}" for r in decided if reference is not None and r.favours != reference
    ]
    status, reason = ("answered", "") if answer is not None else ("no answer", words)
    knob = "" if answer is not None else "an instrument validated where this model lies (its row's domain)"
    return Question(a, b, rows, answer, words, equivalence, contradictions, status, reason, knob)
