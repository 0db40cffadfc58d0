"""The report's opening block: findings and caveats, generated from summary.json alone (each
registered analysis's `findings` and `caveats`, probe/core/stages.py, in report order)."""

from __future__ import annotations

from ..analysis.labels import Titles, label
from ..core.stages import by_block_key
from ..core.stages import registered as by_name
from .schema import Summary, Verdict


def verdict_text(v: Verdict, titles: Titles | None = None) -> str:
    """A paired verdict in words: the difference, its interval, the resolution and the verdict."""
    metric = {"sime": "SimE", "simw": "SimW"}.get(v.metric, v.metric)
    head = f"paired {metric} difference {label(v.a, titles)} - {label(v.b, titles)} {v.difference:+.4f} [{v.ci_low:+.4f}, {v.ci_high:+.4f}]"
    head += f", resolution {v.resolution:.4f}: "
    if v.winner is None:
        return head + v.verdict + (f"; what separates them: {v.evidence}" if v.evidence else "")
    return head + f"{label(v.winner, titles)} closer"


def _each(summary: Summary, hook: str) -> list[str]:
    """The lines the analyses that ran give through `hook` (findings or caveats), in report order."""
    lines: list[str | None] = []
    for key, block in summary.stages.items():
        line = getattr(by_block_key()[key], hook)(block, summary)
        lines += line if isinstance(line, list) else [line]
    return [line for line in lines if line]


def caveats(summary: Summary) -> list[str]:
    """What the reader should not conclude: the analyses' caveats, then each stage the recipe switched
    on that could not run on this checkpoint."""
    skipped = [
        f"{by_name()[n.stage].title if n.stage in by_name() else n.stage} not measured here: {n.reason} "
        f"(set {n.knob} = false to leave it out)"
        for n in summary.not_measured or []
    ]
    return _each(summary, "caveats") + skipped


def findings(summary: Summary, answers: bool = True) -> tuple[list[str], list[str]]:
    """(findings, caveats): short sentences for the top of the report, the evidence table's answers
    first (`answers` False: left to the page's answer block, probe/reporting/answer.py)."""
    lines = [f"{label(q.a)} or {label(q.b)}? {q.answer_words}." for q in summary.evidence or []] if answers else []
    return lines + _each(summary, "findings"), caveats(summary)
