"""The spectral instrument's verdict per predictor (probe/analysis/spectral.py `summarise`): from
its rows in both bin variables, one reading: a filter class, "not separable", "ambiguous",
"mixed", "not a spectral filter", "no response" or "converged"."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


def _no_response(row, r_low: float, r_high: float) -> bool:
    """A predictor that does not respond in this variable: r never above r_low, its weights no
    closer to w_OLS than zero (`explained` <= 0), or the best class fits with gain ~0 and relative
    error ~1."""
    return not (row.max_r > r_low) or not (row.explained > 0) or (row.gain < r_low and row.error > r_high)


def _not_a_filter(row, max_non_filter: float) -> bool:
    """Weights that are not a filter of S's spectrum: their non-filter share exceeds the best-fitting
    reference member's own (its filter's variation within a bin) by more than `max_non_filter`
    (Adam's first iterates: 0.13-0.25 above; exact filters: 0)."""
    return bool(row.non_filter - getattr(row, "best_non_filter", 0.0) > max_non_filter)


NOT_SEPARABLE = " not separable from "  # a verdict "A not separable from B" (`summarise`)
# what a verdict is, as data (the summary table's `kind`): a class, a class not separated from another,
# two variables naming different classes, a blend of two, or no class at all for one of three reasons
KINDS = ("class", "not separable", "ambiguous", "mixed", "not a spectral filter", "no response", "converged")
NO_CLASS = ("mixed", "not a spectral filter", "no response", "converged")  # kinds with no class to side with


@dataclass(frozen=True)
class Reading:
    """A verdict: its words, its kind (KINDS), the class it names ("" where none, also for
    "ambiguous") and the class that one is not separated from ("" unless kind is "not separable")."""

    words: str
    kind: str
    klass: str = ""
    other: str = ""


def kind_of_words(verdict: str) -> str:
    """The kind (KINDS) of a verdict from its words: what a summary before schema 9 carries instead of
    `kind`, and what study.csv's spectral rows name (their `learner`)."""
    if verdict in ("no response", "converged", "not a spectral filter"):
        return verdict
    for kind in ("mixed", "ambiguous"):
        if verdict.startswith(kind):
            return kind
    return "not separable" if NOT_SEPARABLE in verdict else "class"


def verdict_kinds(block) -> list[str]:
    """Each layer's verdict kind (KINDS) of a spectral block of summary.json: its own `kind`, or in a
    summary before schema 9, read from its verdicts' words."""
    kind = getattr(block, "kind", None)
    return list(kind) if kind is not None and len(kind) else [kind_of_words(v) for v in block.verdict]


def verdict_classes(verdict: str) -> list[str]:
    """The classes a verdict names: ["gd"], ["gd", "ridge"] for "gd not separable from ridge", or the
    verdict itself where it names none ("no response", "ambiguous: ...")."""
    return verdict.split(NOT_SEPARABLE)


def _reading(rows: list, own, r_low: float, r_high: float, max_non_filter: float) -> Reading:
    """The verdict of one predictor from its rows in the bin variables given (`summarise`'s rules,
    in its order); `own` the row whose runner-up a "not separable" names."""
    classes = {row.best_class for row in rows}
    if all(_no_response(row, r_low, r_high) for row in rows):
        return Reading("no response", "no response")
    if all(row.min_r > r_high for row in rows):
        return Reading("converged", "converged")  # r ~ 1 in every bin: every class that converges fits
    if all(_not_a_filter(row, max_non_filter) for row in rows):
        return Reading("not a spectral filter", "not a spectral filter")
    mixed = [row for row in rows if getattr(row, "mixed", False)]
    if mixed and len({row.blend for row in mixed}) == 1:
        m = mixed[0]
        first, second = str(m.blend).split("+")
        return Reading(
            f"mixed: {first} {m.blend_w:.2f} [{m.blend_w_low:.2f}, {m.blend_w_high:.2f}] + {second}", "mixed"
        )
    if len(classes) > 1:
        return Reading("ambiguous: " + " / ".join(f"{row.variable} {row.best_class}" for row in rows), "ambiguous")
    klass = classes.pop()
    if not all(row.separated for row in rows):
        return Reading(f"{klass}{NOT_SEPARABLE}{own.runner_up}", "not separable", klass, str(own.runner_up))
    return Reading(klass, "class", klass)


def variable_verdict(row, r_low: float, r_high: float, max_non_filter: float = 0.1) -> str:
    """One bin variable's own reading (a row of the spectral layers table), by `summarise`'s rules
    with that variable alone: its best class only where that class responds, has not converged and
    is separated from the runner-up by their paired interval; otherwise "no response", "converged",
    "not a spectral filter", "mixed: ..." or "A not separable from B" (never a bare class name on a
    near tie)."""
    return _reading([row], row, r_low, r_high, max_non_filter).words


def summarise(layers: pd.DataFrame, r_low: float, r_high: float, max_non_filter: float = 0.1) -> pd.DataFrame:
    """One verdict per predictor over both bin variables: the filter class both variables'
    fits name (separated from the runner-up by their paired intervals), "not a spectral filter"
    where in every variable the weights leave more of their energy off the filter than the best
    reference member does by over `max_non_filter` (`_not_a_filter`), "mixed: A w [interval] + B"
    where in a bin variable a two-class blend beats every single class and w's interval excludes 0
    and 1 (the same blend where both variables find one; probe/analysis/spectral_blend.py), "ambiguous" where the two
    variables name different classes, "not separable" where the best class's paired interval
    reaches 0, "no response" where r stays below r_low everywhere or the weights do not follow w_OLS
    (`_no_response`), "converged" where it stays above
    r_high in every bin (every class that converges fits; the layers that can decide are earlier). The exponent quoted is the one
    in the best family's own variable. Columns: verdict (the words), kind (KINDS), best_class (the class it
    names, "" where none), other_class (the class a "not separable" verdict names second), p, p_low, p_high,
    variable, best_family, best_k, non_filter."""
    out = []
    for name, rows in layers.groupby("predictor", sort=False):
        by_var = {row.variable: row for row in rows.itertuples()}
        own = next((row for row in by_var.values() if row.own_variable_of_best), next(iter(by_var.values())))
        reading = _reading(list(by_var.values()), own, r_low, r_high, max_non_filter)
        out.append(
            {
                "predictor": name,
                "verdict": reading.words,
                "kind": reading.kind,
                "best_class": reading.klass,
                "other_class": reading.other,
                "p": own.p,
                "p_low": own.p_low,
                "p_high": own.p_high,
                "variable": own.variable,
                "best_family": own.best_family,
                "best_k": own.best_k,
                "non_filter": own.non_filter,
            }
        )
    return pd.DataFrame(out)
