"""The spectral instrument's verdict per predictor (probe/analysis/spectral.py `summarise`): from
its rows in both bin variables, one reading: a filter class, "not separable", "ambiguous",
"mixed", "not a spectral filter", "no response" or "converged"."""

from __future__ import annotations

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


def verdict_classes(verdict: str) -> list[str]:
    """The classes a verdict names: ["gd"], ["gd", "ridge"] for "gd not separable from ridge", or the
    verdict itself where it names none ("no response", "ambiguous: ...")."""
    return verdict.split(NOT_SEPARABLE)


def _reading(rows: list, own, r_low: float, r_high: float, max_non_filter: float) -> tuple[str, str]:
    """(verdict, the one class it names or "") of one predictor from its rows in the bin variables
    given (`summarise`'s rules, in its order); `own` the row whose runner-up a "not separable" names."""
    classes = {row.best_class for row in rows}
    if all(_no_response(row, r_low, r_high) for row in rows):
        return "no response", ""
    if all(row.min_r > r_high for row in rows):
        return "converged", ""  # r ~ 1 in every bin: every class that converges fits
    if all(_not_a_filter(row, max_non_filter) for row in rows):
        return "not a spectral filter", ""
    mixed = [row for row in rows if getattr(row, "mixed", False)]
    if mixed and len({row.blend for row in mixed}) == 1:
        m = mixed[0]
        first, second = str(m.blend).split("+")
        return f"mixed: {first} {m.blend_w:.2f} [{m.blend_w_low:.2f}, {m.blend_w_high:.2f}] + {second}", ""
    if len(classes) > 1:
        return "ambiguous: " + " / ".join(f"{row.variable} {row.best_class}" for row in rows), ""
    klass = classes.pop()
    if not all(row.separated for row in rows):
        return f"{klass}{NOT_SEPARABLE}{own.runner_up}", klass
    return klass, klass


def variable_verdict(row, r_low: float, r_high: float, max_non_filter: float = 0.1) -> str:
    """One bin variable's own reading (a row of the spectral layers table), by `summarise`'s rules
    with that variable alone: its best class only where that class responds, has not converged and
    is separated from the runner-up by their paired interval; otherwise "no response", "converged",
    "not a spectral filter", "mixed: ..." or "A not separable from B" (never a bare class name on a
    near tie)."""
    return _reading([row], row, r_low, r_high, max_non_filter)[0]


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
    in the best family's own variable."""
    out = []
    for name, rows in layers.groupby("predictor", sort=False):
        by_var = {row.variable: row for row in rows.itertuples()}
        own = next((row for row in by_var.values() if row.own_variable_of_best), next(iter(by_var.values())))
        verdict, klass = _reading(list(by_var.values()), own, r_low, r_high, max_non_filter)
        out.append(
            {
                "predictor": name,
                "verdict": verdict,
                "best_class": klass,
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
