"""A study page's opening block: one headline sentence, findings with intervals, and caveats,
read from the study table (study.csv) alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..analysis.labels import Titles, label
from ..analysis.spectral_verdicts import kind_of_words, verdict_classes

METRIC = {"spd": "SPD", "ilw": "ILW", "sime": "SimE", "error_at_2d1": "error / d", "r2_at_2d1": "R²"}
AXIS = {
    "n_layer": "layers",
    "n_embd": "width",
    "train_step": "training step",
    "train_seed": "training seed",
    "prompt_seed": "prompt draw",
    "relu_depth": "target-network depth",
    "attn_activation": "attention",
    "noise_std": "label noise",
}
BETTER = {"spd": "min", "ilw": "min", "sime": "max"}


def axis_name(x: str) -> str:
    return AXIS.get(x, x.replace("_", " "))


def x_order(table: pd.DataFrame, x: str) -> list[str]:
    """Models sorted by their x value (then name)."""
    order = table[["model", x]].drop_duplicates().sort_values([x, "model"])
    return list(order.model)


def _interval(v: float, lo: float, hi: float) -> str:
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return f"{v:.4g}"
    return f"{v:.4g} [{lo:.4g}, {hi:.4g}]"


def closest_learners(table: pd.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """Per model and metric (SPD, ILW, SimE): the closest compared learner and the runner-up, each
    with its 90% interval over prompts, and whether the two intervals are apart."""
    rows = table[(table.analysis == "spd_ilw") & table.metric.isin(list(BETTER))]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for model, g in rows.groupby("model"):
        entry = {}
        for metric, better in BETTER.items():
            part = g[g.metric == metric].sort_values("value", ascending=better == "min")
            if part.empty:
                continue
            first = part.iloc[0]
            item = {
                "closest": first.learner,
                "value": float(first.value),
                "ci": [float(first.ci_low), float(first.ci_high)],
                "runner_up": None,
            }
            if len(part) > 1:
                second = part.iloc[1]
                apart = first.ci_high < second.ci_low if better == "min" else first.ci_low > second.ci_high
                item.update(
                    runner_up=second.learner,
                    runner_up_value=float(second.value),
                    runner_up_ci=[float(second.ci_low), float(second.ci_high)],
                    separated=bool(apart),
                )
            entry[metric] = item
        out[str(model)] = entry
    return out


def _best_setting(table: pd.DataFrame, model: str, learner: str) -> str:
    """ "steps 8" for a learner picked at its best setting, "" otherwise."""
    rows = table[(table.model == model) & (table.learner == learner) & table.metric.str.startswith("best_", na=False)]
    return ", ".join(f"{r.metric.removeprefix('best_')} {r.value:g}" for r in rows.itertuples())


def _runs(models: list[str], values: dict[str, str], xs: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """Consecutive models (in x order) with the same value, as (value, [x, ...]) runs."""
    runs: list[tuple[str, list[Any]]] = []
    for m in models:
        if m not in values:
            continue
        if runs and runs[-1][0] == values[m]:
            runs[-1][1].append(xs[m])
        else:
            runs.append((values[m], [xs[m]]))
    return runs


def categorical(values) -> bool:
    """Whether x values are categories (model families, formats): named one by one, never as a range."""
    return not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values)


def _span(points: list[Any]) -> str:
    """ "2-5" for a run of numeric x values, "gpt2, lstm" for categories."""
    if len(points) == 1:
        return str(points[0])
    return ", ".join(map(str, points)) if categorical(points) else f"{points[0]}-{points[-1]}"


def phase_sentence(table: pd.DataFrame, x: str, closest: dict, metric: str, titles: Titles | None = None) -> str | None:
    """'By SPD the closest learner goes GD (1 step) at layers 1 -> ridge at 2-4 -> least squares at 6-8.'"""
    models = x_order(table, x)
    xs = dict(zip(table.model, table[x]))
    values = {m: e[metric]["closest"] for m, e in closest.items() if metric in e}
    runs = _runs(models, values, xs)
    if not runs:
        return None
    by_x = {xs[m]: m for m in models}

    def settings(name: str, points: list[Any]) -> str:
        """The picked grid value per model of the run: "(steps 8, 32)", or "(2: lam 0.1)" when partial."""
        found = [(p, _best_setting(table, by_x[p], name)) for p in points]
        found = [(p, f) for p, f in found if f]
        if not found:
            return ""
        keys = {f.split(" ")[0] for _, f in found}
        if len(found) == len(points) and len(keys) == 1 and all(", " not in f for _, f in found):
            return f" ({keys.pop()} {', '.join(f.split(' ', 1)[1] for _, f in found)})"
        return f" ({'; '.join(f'{p}: {f}' for p, f in found)})"

    steps = " → ".join(f"{label(name, titles)} at {_span(points)}{settings(name, points)}" for name, points in runs)
    return f"Closest learner by {METRIC[metric]}, against {axis_name(x)}: {steps}."


def icl_sentence(table: pd.DataFrame, x: str) -> str | None:
    """The in-distribution ICL metric at 2d+1 examples along x, with intervals."""
    rows = table[(table.analysis == "evaluate") & table.metric.isin(["error_at_2d1", "r2_at_2d1"])]
    rows = rows[rows["shift"] == ""]
    if rows.empty:
        return None
    metric = rows.metric.iloc[0]
    per_model = rows.n_examples.nunique() > 1  # models of several d (x = "n_dims", curriculum stages)
    parts = []
    ends = []
    for m in x_order(rows, x):
        r = rows[rows.model == m].iloc[0]
        at = f" (at {int(r.n_examples)})" if per_model else ""
        parts.append(f"{r[x]}{at}: {_interval(r.value, r.ci_low, r.ci_high)}")
        ends.append(r)
    examples = "2d+1 examples, each model's own d" if per_model else f"2d+1 = {int(rows.n_examples.iloc[0])} examples"
    text = f"{METRIC[metric]} at {examples} by {axis_name(x)} (90% band): " + "; ".join(parts) + "."
    if len(ends) > 1:
        a, b = ends[0], ends[-1]
        apart = a.ci_high < b.ci_low or b.ci_high < a.ci_low
        text += f" From {a[x]} to {b[x]} the bands are {'apart' if apart else 'overlapping'}."
    return text


def best_k_sentence(table: pd.DataFrame, x: str, titles: Titles | None = None) -> list[str]:
    """Per compared iterative learner: the last layer's best-matching iteration along x."""
    rows = table[(table.analysis == "heatmap") & (table.metric == "sime_best_k")]
    out = []
    for learner, g in rows.groupby("learner"):
        if not g[["value", "ci_low", "ci_high"]].to_numpy().any():
            continue  # a one-point grid (least squares): nothing to locate
        parts = []
        ends = table[(table.metric == "sime_at_grid_end") & (table.learner == learner) & (table.value > 0)]
        for m in x_order(g, x):
            h = g[g.model == m]
            last = h[h.layer == h.layer.max()].iloc[0]
            at_end = ((ends.model == m) & (ends.layer == last.layer)).any()
            parts.append(
                f"{last[x]}: {last.value:g} [{last.ci_low:g}, {last.ci_high:g}]"
                + (" (at the grid's end)" if at_end else "")
            )
        out.append(
            f"Best-matching {label(learner, titles)} setting (its grid's axis) of the last layer by SimE, by {axis_name(x)} "
            "(90% interval): " + "; ".join(parts) + "."
        )
    return out


# "the headline holds on a seed", defined before any seed was read: the same consolidated Newton-or-GD
# answer as the first seed, and at least HOLD_LAYERS responding layers whose spectral verdict is the
# first-order class (GD or ridge, also where the two are not separated from each other) with the
# exponent's 90% interval below HOLD_P
FIRST_ORDER, HOLD_LAYERS, HOLD_P = ("gd", "ridge"), 3, 1.5
NEWTON_CLASS = "precond_gd"  # Fu et al.'s Newton from M_0 = alpha S (probe/analysis/spectral_references.py CLASSES)


def first_order_reading(verdict: str) -> bool:
    """A spectral verdict (probe/analysis/spectral.py `summarise`; study.csv keeps its words) naming the
    first-order class: GD or ridge, alone or not separated from the other."""
    if kind_of_words(verdict) not in ("class", "not separable"):
        return False
    return all(c in FIRST_ORDER for c in verdict_classes(verdict))


def replication(table: pd.DataFrame, x: str) -> list[dict[str, Any]]:
    """Per model in x order: its consolidated Newton-or-GD answer, its first-order layers (HOLD_P),
    and whether the headline holds on it (the definition above FIRST_ORDER)."""
    answers = table[(table.analysis == "evidence") & (table.learner == "consolidated answer")]
    answers = answers[answers.metric == "newton_vs_gd"]
    spectral = table[(table.analysis == "spectral") & (table.metric == "spectral_p")]
    if answers.empty or spectral.empty:
        return []
    side = {1.0: "newton", -1.0: "gd", 0.0: "undecided"}
    models = x_order(spectral, x)
    first = answers[answers.model == models[0]].value
    reference = side.get(float(first.iloc[0])) if len(first) else None
    out = []
    for m in models:
        rows = spectral[spectral.model == m]
        high = pd.to_numeric(rows.ci_high, errors="coerce")
        layers = [
            int(r.layer) for r, h in zip(rows.itertuples(), high) if first_order_reading(r.learner) and h < HOLD_P
        ]
        newton = [int(r.layer) for r in rows.itertuples() if verdict_classes(r.learner) == [NEWTON_CLASS]]
        mine = answers[answers.model == m].value
        answer = side.get(float(mine.iloc[0])) if len(mine) else None
        out.append(
            {"model": m, "x": rows[x].iloc[0], "answer": answer, "layers": layers, "newton_layers": newton,
             "holds": answer == reference and len(layers) >= HOLD_LAYERS}
        )  # fmt: skip
    return out


def replication_sentence(table: pd.DataFrame, x: str) -> str | None:
    """Whether the headline holds on every seed, some or none (`replication`), with each seed's count."""
    rows = replication(table, x)
    if len(rows) < 2:
        return None
    held = sum(r["holds"] for r in rows)
    extent = "every" if held == len(rows) else "no" if held == 0 else "some"
    each = "; ".join(
        f"{axis_name(x)} {r['x']}: {'holds' if r['holds'] else 'does not hold'} (answer {r['answer']}, "
        f"{len(r['layers'])} first-order layers{': ' + ', '.join(map(str, r['layers'])) if r['layers'] else ''})"
        for r in rows
    )
    newton = [f"{axis_name(x)} {r['x']}: {', '.join(map(str, r['newton_layers']))}" for r in rows if r["newton_layers"]]
    where = (
        f"Layers in the Newton (S-preconditioned) class: {'; '.join(newton)}."
        if newton
        else f"No layer of any {axis_name(x)} reads the Newton (S-preconditioned) class."
    )
    return (
        f"The headline holds on {extent} {axis_name(x)} ({held} of {len(rows)}; holds: the first model's "
        f"consolidated Newton-or-GD answer and at least {HOLD_LAYERS} responding layers in the first-order class, "
        f"GD or ridge, with the exponent's 90% interval below {HOLD_P}): {each}. {where}"
    )


def exponent_spread_sentence(table: pd.DataFrame, x: str) -> str | None:
    """Each layer's spectral exponent across the models: min-max beside the models' own intervals."""
    rows = table[(table.analysis == "spectral") & (table.metric == "spectral_p")].copy()
    rows["p"] = pd.to_numeric(rows.value, errors="coerce")
    rows = rows[rows.p.notna()]
    if rows.model.nunique() < 2:
        return None
    parts = []
    for layer, g in rows.groupby("layer"):
        widths = pd.to_numeric(g.ci_high, errors="coerce") - pd.to_numeric(g.ci_low, errors="coerce")
        parts.append(f"{layer}: {g.p.min():.2f}-{g.p.max():.2f} (own 90% intervals {widths.median():.2f} wide, median)")
    return (
        f"Spectral exponent p per layer across {axis_name(x)} (min-max over the {rows.model.nunique()} "
        f"{'draws' if x == 'prompt_seed' else 'models'}): " + "; ".join(parts) + "."
    )


def degenerate_models(table: pd.DataFrame) -> list[str]:
    """Models whose in-context predictions at 2d+1 examples are not distinguishable from predicting 0:
    the error band reaches the zero predictor's error (least squares with no examples predicts 0), or
    the R² band reaches 0."""
    out = []
    ev = table[table.analysis == "evaluate"]
    for r in ev[ev.metric.isin(["error_at_2d1", "r2_at_2d1"])].itertuples():
        if r.metric == "r2_at_2d1":
            if np.isfinite(r.ci_low) and r.ci_low <= 0:
                out.append(f"{r.model} ({r.shift or 'in distribution'}): R² band reaches 0")
            continue
        zero = ev[
            (ev.model == r.model) & (ev["shift"] == r.shift) & (ev.learner == "least_squares") & (ev.n_examples == 0)
        ]
        if len(zero) and np.isfinite(r.ci_high) and r.ci_high >= zero.value.iloc[0]:
            out.append(f"{r.model} ({r.shift or 'in distribution'}): error band reaches the zero predictor's")
    return out


def study_findings(
    table: pd.DataFrame, x: str, closest: dict, titles: Titles | None = None
) -> tuple[str, list[str], list[str]]:
    """(headline, findings, caveats) of a study page; `titles` names the recipe's sweeps."""
    sentences = [s for s in (phase_sentence(table, x, closest, m, titles) for m in BETTER) if s]
    icl = [s for s in [icl_sentence(table, x)] if s]
    best_k = best_k_sentence(table, x, titles)
    ordered = sentences + (best_k + icl if x == "train_step" else icl + best_k)
    if x in ("train_seed", "prompt_seed"):  # replication across seeds: whether the headline holds, then the spread
        ordered = [s for s in (replication_sentence(table, x), exponent_spread_sentence(table, x)) if s] + ordered
    headline = ordered[0] if ordered else "The study table holds no comparable metric."
    items = ordered[1:]
    caveats = []
    overlaps = []
    for model, entry in closest.items():
        close = [METRIC[m] for m, e in entry.items() if e.get("runner_up") and not e["separated"]]
        if close:
            overlaps.append(f"{model} ({', '.join(close)})")
    if overlaps:
        caveats.append(
            "The closest learner's 90% interval overlaps the runner-up's, so their order is not resolved, for: "
            + "; ".join(overlaps)
            + "."
        )
    degenerate = degenerate_models(table)
    if degenerate:
        caveats.append(
            "Not distinguishable from predicting 0 at 2d+1 examples (a match there says little about an "
            "algorithm): " + "; ".join(degenerate) + "."
        )
    return headline, items, caveats


def closest_table(table: pd.DataFrame, x: str, closest: dict, titles: Titles | None = None) -> pd.DataFrame:
    """One row per model and metric: closest learner (best setting), runner-up, intervals."""
    xs = dict(zip(table.model, table[x]))
    rows = []
    for model in x_order(table, x):
        for metric, e in closest.get(model, {}).items():
            setting = _best_setting(table, model, e["closest"])
            rows.append(
                {
                    axis_name(x): xs[model],
                    "model": model,
                    "metric": METRIC[metric],
                    "closest": label(e["closest"], titles) + (f" ({setting})" if setting else ""),
                    "value [90%]": _interval(e["value"], *e["ci"]),
                    "runner-up": label(e["runner_up"], titles) if e.get("runner_up") else "",
                    "runner-up value [90%]": _interval(e["runner_up_value"], *e["runner_up_ci"])
                    if e.get("runner_up")
                    else "",
                    "apart": "yes" if e.get("separated") else "no",
                }
            )
    return pd.DataFrame(rows)
