"""The spectral filter of each layer (probe/analysis/spectral.py measures it): on each prompt's S = X^T X, a layer's induced weights against the least-squares
weights along every eigen-direction, the local exponent p (GD's class tends to 1, Fu et al.'s Newton
to 2) and the best-fitting filter class per layer. Recipe section [spectral] (SpectralSettings,
beside the analysis); summary.json key `spectral`; its page section, findings line and evidence row.

It needs the induced stage (induced.py) and reads the induced weights it fits (its data induced_*),
so its cache key holds that stage's: changing [spectral] re-runs this stage only, from the cached
weights, and the learner sweeps are not needed. `icl-probe spectral` (its `Command`, probe/cli/stage.py) runs the
measurement alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.labels import layer_list
from ..analysis.pipeline import InducedWeights, LayerSettings, measure_spectrum
from ..analysis.spectral import SpectralAnalysis, SpectralSettings, spectral_cost, spectral_tables
from ..analysis.spectral_references import CLASSES
from ..analysis.spectral_verdicts import NO_CLASS, verdict_kinds
from ..core import budget
from ..core.errors import ConfigError
from ..core.settings import induced_count
from ..core.stages import AnalysisStage, Command, StageTables, register_stage
from ..core.validity import Domain, Validity
from ..models.sizes import shape_of
from ..reporting import figures as plots
from ..reporting.columns import column, columns, plain
from ..reporting.page import table as html_table
from .readout import INDUCED_FLAGS, READOUT_FLAGS
from .sections import template_page


@dataclass
class SpectralFit:
    """One bin variable's measurement per layer (probe/analysis/spectral.py): the local exponent p
    with its 90% interval, the best-fitting filter class and member (k on its axis, gain), its
    relative fit error, the runner-up class and the paired interval of (runner-up - best) error."""

    p: list[float]
    p_low: list[float]
    p_high: list[float]
    bins_used: list[int]
    min_r: list[float]
    max_r: list[float]
    non_filter: list[float]
    best_class: list[str]
    best_family: list[str]
    best_axis: list[str]
    best_k: list
    gain: list[float]
    error: list[float]
    runner_up: list[str]
    difference: list[float]
    diff_low: list[float]
    diff_high: list[float]
    separated: list[bool]
    # added in summary schema 6 (empty in older summaries)
    explained: list[float] = field(default_factory=list)
    u_low: list[float] = field(default_factory=list)
    u_high: list[float] = field(default_factory=list)
    resamples_unfit: list[float] = field(default_factory=list)
    separated_from: list[str] = field(default_factory=list)
    # added in summary schema 7: the share before the query-noise correction (non_filter is after it)
    non_filter_uncorrected: list[float] = field(default_factory=list)
    best_non_filter: list[float] = field(default_factory=list)  # the best member's own share
    # the best two-class blend (probe/analysis/spectral_blend.py): its classes "a+b", w on a with its
    # 90% interval, error, the share of the best single class's error it removes (5% quantile), mixed
    blend: list[str] = field(default_factory=list)
    blend_w: list[float] = field(default_factory=list)
    blend_w_low: list[float] = field(default_factory=list)
    blend_w_high: list[float] = field(default_factory=list)
    blend_error: list[float] = field(default_factory=list)
    blend_gain_low: list[float] = field(default_factory=list)
    mixed: list[bool] = field(default_factory=list)
    # added in summary schema 9: the variable's own reading (its class only where separated; empty in older summaries)
    verdict: list[str] = field(default_factory=list)


@dataclass
class Spectral:
    """Each layer's spectral filter on its induced weights: one verdict per layer over both bin
    variables ("gd", "precond_gd", "ridge", "least_squares", "... not separable from ...",
    "ambiguous: ...", "converged", "no response"), the exponent in the best family's own variable,
    each variable's fits, and the references' own exponents (the estimator's bias)."""

    layer: list[int]
    verdict: list[str]
    p: list[float]
    p_low: list[float]
    p_high: list[float]
    variable: list[str]
    by_variable: dict[str, SpectralFit]
    references: dict[str, dict[str, Any]]
    counts: dict[str, int]
    classes: dict[str, str]
    status: str = "answered"  # core/validity.py STATUSES: "not measured" where the data could not support it
    reason: str = ""
    knob: str = ""
    identities: str = (
        "Newton from alpha I is GD with 2^k steps of size alpha; Fu et al.'s Newton (M_0 = alpha S) is "
        "S-preconditioned GD with 2^k steps: behaviour identifies the filter class and its rate, not which "
        "equivalent procedure computes it"
    )
    # added in summary schema 9: each verdict as data (probe/analysis/spectral_verdicts.py KINDS), the class it
    # names ("" where none) and the class a "not separable" one is not separated from (empty in older summaries)
    kind: list[str] = field(default_factory=list)
    best_class: list[str] = field(default_factory=list)
    other_class: list[str] = field(default_factory=list)


def spectral_block(tables: dict[str, pd.DataFrame], counts: dict[str, int]) -> Spectral:
    """The spectral instrument's verdict per layer, each bin variable's fits and the references'
    exponents in their own variable (probe/analysis/spectral.py)."""
    summary, layers, refs = (tables[f"spectral_{name}"] for name in ("summary", "layers", "references"))
    # each family's row in its own variable; the fixed-penalty ridge's (lambda itself, not binned) in lambda / t
    own = refs[refs.own_variable | (~refs.family.isin(refs.family[refs.own_variable]) & (refs.variable == "lam_t"))]
    return Spectral(
        layer=[int(v) for v in summary.predictor],
        verdict=list(summary.verdict),
        p=column(summary, "p"),
        p_low=column(summary, "p_low"),
        p_high=column(summary, "p_high"),
        variable=list(summary.variable),
        by_variable={var: columns(rows, SpectralFit) for var, rows in layers.groupby("variable", sort=False)},
        references={
            r.family: {
                "variable": r.variable,
                "p_median": plain(r.p_median),
                "step": str(getattr(r, "step", "")),
                "members_dropped": int(getattr(r, "members_dropped", 0)),
            }
            for r in own.itertuples()
        },
        counts={k: int(v) for k, v in counts.items()},
        classes=dict(CLASSES),
        kind=list(summary.kind),
        best_class=[str(v) if isinstance(v, str) else "" for v in summary.best_class],
        other_class=[str(v) if isinstance(v, str) else "" for v in summary.other_class],
    )


# what each class contains, as a reader needs it (an exponent near 1 excludes M_0 = alpha S, not every Newton start)
CLASS_WORDS = {
    "gd": "first-order filter class (GD, Newton-Schulz from alpha I, CG on isotropic prompts)",
    "precond_gd": "Iterative Newton from M_0 = alpha S class (S-preconditioned GD; CG at kappa = 100 can read it)",
    "ridge": "ridge class (penalty fixed or proportional to t)",
    "pcr": "principal-component regression class (S's top m eigen-directions)",
    "least_squares": "least squares",
}
VARIABLE_WORDS = {"lam_t": "lambda/t", "lam_max": "lambda/lambda_max"}


def _window(sp: Spectral, i: int) -> str:
    """The eigenvalue window layer i's exponent was fitted over, in its variable."""
    fit = sp.by_variable.get(sp.variable[i])
    if fit is None or not fit.u_low or fit.u_low[i] is None or fit.u_high[i] is None:
        return ""
    return f" over {VARIABLE_WORDS.get(sp.variable[i], sp.variable[i])} {fit.u_low[i]:.2g}-{fit.u_high[i]:.2g}"


# the known-answer models on which the spectral filter names each candidate, and the tests that hold it
SPECTRAL_VALIDATED = {
    ("newton", "gd"): (
        "planted GD (GD class at every layer), planted Newton and Newton-ReLU (Newton class at every layer that "
        "holds an iterate), oracles running GD with 2^l steps and Newton from alpha I (GD class) and Fu et al.'s "
        "Newton (Newton class): tests/test_spectral.py, tests/test_evidence.py"
    ),
}
SPECTRAL_SIDE = {"gd": "gd", "precond_gd": "newton", "ridge": "ridge", "least_squares": "least_squares"}
# the conditions those known answers cover: exact reference weights (oracles) at d = 4 and 8 and
# kappa 1 and 100; planted GD and Newton through their own and the ridge read-out at d = 4 and 8 on 64
# prompts (isotropic) and at d = 4 and 8 on 512 (kappa = 100: on 64 the ridge read-out leaves every
# layer undecided or ambiguous, measured)
SPECTRAL_DOMAIN = Validity(
    (
        Domain(
            d=(4, 8),
            kappa=(1, 1),
            prompts=(64, math.inf),
            readout=("model", "ridge"),
            tests="tests/test_evidence.py, tests/test_spectral_validity.py",
        ),
        Domain(
            d=(4, 8),
            kappa=(1, 100),
            prompts=(512, math.inf),
            readout=("model", "ridge"),
            tests="tests/test_spectral_validity.py",
        ),
    ),
    tested_against="GD (fixed and per-prompt steps), Newton from alpha I, Fu et al.'s Newton and S-preconditioned GD "
    "(fixed and per-prompt alpha), ridge (penalty fixed or proportional to t), least squares, blends of two "
    'classes ("mixed"), Adam ("not a spectral filter"), conjugate gradient (first-order class on isotropic '
    "prompts from 2 iterations; at kappa = 100 two iterations read the S-preconditioned class or nothing: not "
    "told apart from Newton there), principal-component regression (its own class, by fit error)",
)


def _spectral_rows(sp: Spectral | None, a: str, b: str, equivalence: str) -> list[dict[str, Any]]:
    if sp is None or (a, b) not in (("newton", "gd"), ("ridge", "least_squares")):
        return []
    if sp.status == "not measured":
        effect = f"not measured here: {sp.reason}"
        return [{"instrument": "spectral filter", "favours": None, "effect": effect, "status": sp.status}]
    decided: dict[str, list[int]] = {}
    neither: dict[str, list[int]] = {}  # class -> layers apart from both sides' classes
    also: dict[int, str] = {}
    fits, kinds = list(sp.by_variable.values()), verdict_kinds(sp)
    for i, (layer, verdict, kind) in enumerate(zip(sp.layer, sp.verdict, kinds)):
        side = None if kind in NO_CLASS else _layer_side(fits, i, a, b)
        if side is not None:
            decided.setdefault(side, []).append(layer)
            if kind != "class" or verdict not in SPECTRAL_SIDE:  # apart from the other side, not from every class
                also[layer] = verdict
        elif kind not in NO_CLASS and (klass := _layer_neither(fits, i, a, b)) is not None:
            neither.setdefault(klass, []).append(layer)
    named = {s: l for s, l in decided.items() if s in (a, b)}
    favours = next(iter(named)) if len(named) == 1 else None
    responding = [k for k in kinds if k not in ("no response", "converged")]
    unfiltered = [layer for layer, k in zip(sp.layer, kinds) if k == "not a spectral filter"]
    most_unfiltered = bool(unfiltered) and 2 * len(unfiltered) >= len(responding)
    if most_unfiltered:  # the model does not run a filter of S: the filter classes do not describe it
        favours, named, neither = None, {}, {}
    closest = ""
    if not named and neither:  # no layer reads either side's class, some read a third one apart from both
        favours, closest = "neither", ", ".join(CLASS_WORDS.get(k, k) for k in neither)
    words = "; ".join(
        [f"{side} class at layers {', '.join(map(str, ls))}" for side, ls in decided.items()]
        + [f"{k} class, apart from both, at layers {', '.join(map(str, ls))}" for k, ls in neither.items()]
    )
    if also:
        words += " (" + "; ".join(f"layer {layer}: {v}" for layer, v in also.items()) + ")"
    mixed = [f"layer {layer}: {v}" for layer, v, k in zip(sp.layer, sp.verdict, kinds) if k == "mixed"]
    if mixed:
        words += ("; " if words else "") + "; ".join(mixed)
    if unfiltered:
        words += ("; " if words else "") + f"not a filter of S at layers {', '.join(map(str, unfiltered))}"
        words += " (most of the responding layers: the row decides nothing)" if most_unfiltered else ""
    if len(named) > 1:
        words += " (layers disagree)"
    ps = [
        f"{layer}: {p:.2f} [{lo:.2f}, {hi:.2f}]"
        for layer, p, lo, hi in zip(sp.layer, sp.p, sp.p_low, sp.p_high)
        if p is not None
    ]
    effect = (words or "no layer decided between the classes") + (
        "; exponent p per layer " + ", ".join(ps) if ps else ""
    )
    return [
        {
            "instrument": "spectral filter",
            "favours": favours,
            "effect": effect,
            "closest": closest,
            "validated_on": SPECTRAL_VALIDATED.get((a, b), ""),
            "cannot_tell_apart": equivalence,
            "domain": SPECTRAL_DOMAIN,
        }
    ]


def _layer_side(fits, i: int, a: str, b: str) -> str | None:
    """The side of "a or b?" one layer decides: its best class in every bin variable is one side's
    and, in every variable, separated by its paired interval from the other side's class (not
    necessarily from every class: GD with few steps and ridge may stay apart from Newton and not from
    each other). Asked only of a layer whose verdict names a class (its kind not in NO_CLASS)."""
    sides = {SPECTRAL_SIDE.get(fit.best_class[i]) for fit in fits}
    if len(sides) != 1:
        return None
    side = sides.pop()
    if side not in (a, b):
        return None
    other = next(c for c, s in SPECTRAL_SIDE.items() if s == (b if side == a else a))
    apart = lambda fit: other in (fit.separated_from[i] or "").split() if fit.separated_from else fit.separated[i]
    return side if all(apart(fit) for fit in fits) else None  # a summary before schema 6: the runner-up rule


def _layer_neither(fits, i: int, a: str, b: str) -> str | None:
    """The class of a layer that reads neither side of "a or b?": its best class in every bin variable
    the same third class (ridge or least squares for Newton vs GD), separated by its paired interval
    from both sides' classes in every variable; None otherwise. Asked only of a layer whose verdict's
    kind is not in NO_CLASS."""
    if not all(fit.separated_from for fit in fits):
        return None
    classes = {fit.best_class[i] for fit in fits}
    if len(classes) != 1:
        return None
    klass = classes.pop()
    if SPECTRAL_SIDE.get(klass) in (a, b):
        return None
    sides = [c for c, s in SPECTRAL_SIDE.items() if s in (a, b)]
    return klass if all(c in (fit.separated_from[i] or "").split() for fit in fits for c in sides) else None


def _with_induced_weights(recipe, args, ckpt):
    """The recipe with SimW on: the command always induces the weights it measures."""
    return replace(recipe, similarity=replace(recipe.similarity, simw=True))


def _show(t, block: Spectral) -> list[str]:
    """Each layer's verdict, exponent and best family; a measurement the data cannot support is
    refused, naming its knob."""
    if "spectral_status" in t:
        row = t["spectral_status"].iloc[0]
        raise ConfigError(str(row.reason))
    view = t["spectral_summary"][["predictor", "verdict", "p", "p_low", "p_high", "variable", "best_family", "best_k"]]
    return [view.rename(columns={"predictor": "layer"}).to_string(index=False, float_format=lambda v: f"{v:.3g}")]


SPECTRAL = Command(
    "spectral",
    help="Each layer's spectral filter: response per eigenvalue, exponent, GD or Newton class",
    doc="""Which spectral filter each layer applies (probe/analysis/spectral.py): each layer's induced
weights against the least-squares weights along every eigen-direction of the prompt's own S, the
local exponent p (1: the GD class, 2: Fu et al.'s Newton class) and the best-fitting filter class with
a paired interval over prompts. The report's spectral section, on its own (no learner sweeps).

examples:
  icl-probe spectral checkpoints/gpt2-default --out reports/spectral
  icl-probe spectral checkpoints/planted/newton --out /tmp/spectral --bins 16 --induced-prompts 128""",
    flags=(*READOUT_FLAGS, *INDUCED_FLAGS, ("spectral", ["bins", "min_count", "r_low", "r_high"])),
    adjust=_with_induced_weights,
    show=_show,
)


class SpectralStage(AnalysisStage):
    """Spectral filter of each layer: the report's `spectral` stage (module docstring)."""

    name = "spectral"
    papers = ("Fu et al. 2024, eq. 8: Iterative Newton, whose spectral filter the instrument tells from GD's",)
    settings = SpectralSettings
    block = Spectral
    title = "Spectral filter of each layer"
    description = (
        "Each layer's spectral filter on its induced weights: response per eigenvalue, local exponent, "
        "GD or Newton class."
    )
    reads = ("similarity",)
    needs = ("induced",)
    commands = (SPECTRAL,)

    def run(self, c) -> StageTables:
        """The filter of each layer on the induced stage's weights (none where SimW is off)."""
        induced = InducedWeights.from_arrays(lambda name: c.before(name, "data"))
        if induced is None:
            return StageTables()
        spectral = measure_spectrum(induced, LayerSettings.from_recipe(c.recipe, c.device, c.memory))
        counts = {"spectral_counts": spectral.counts} if isinstance(spectral, SpectralAnalysis) else {}
        return StageTables(spectral_tables(spectral), counts)

    def summarise(self, t, recipe) -> Spectral | None:
        """Its block, or None where the layer analyses did not measure it (SimW off); a "not measured"
        block where the data at hand could not support it."""
        if "spectral_status" in t:
            row = t["spectral_status"].iloc[0]
            return Spectral(
                [], [], [], [], [], [], {}, {}, {}, dict(CLASSES), str(row.status), str(row.reason), str(row.knob)
            )
        return spectral_block(t, t.data.get("spectral_counts", {})) if "spectral_summary" in t else None

    def figures(self, t: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        if "spectral_curves" not in t:
            return {}
        out = {}
        for variable in t["spectral_curves"].variable.unique():
            key = f"spectral_{variable}"
            out[key] = plots.spectral_curves(t["spectral_curves"], variable, fig_dir / key)[0]
        out["spectral_exponents"] = plots.spectral_exponents(t["spectral_layers"], fig_dir / "spectral_exponents")[0]
        return out

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        if not recipe.similarity.simw:
            return []
        shape, p = shape_of(ckpt.config.model), recipe.prompts
        return [
            spectral_cost(
                recipe.spectral,
                induced_count(p.induced, p.test),
                shape.layers + 1,
                shape.d,
                recipe.similarity.bootstrap,
                ckpt.config.task.n_points,
            )
        ]

    def findings(self, sp: Spectral, summary: Any) -> str | None:
        """Each layer's spectral verdict, grouped, with the exponent (and the eigenvalue window it was
        fitted over) where the verdict names one class."""
        if sp.status == "not measured":
            return f"Spectral filter per layer: not measured here ({sp.reason})."
        groups: dict[str, list[str]] = {}
        for i, (layer, verdict, p, lo, hi) in enumerate(zip(sp.layer, sp.verdict, sp.p, sp.p_low, sp.p_high)):
            named = verdict in CLASS_WORDS and p is not None
            exponent = f" (p {p:.2f} [{lo:.2f}, {hi:.2f}]{_window(sp, i)})" if named else ""
            groups.setdefault(CLASS_WORDS.get(verdict, verdict), []).append(f"{layer}{exponent}")
        parts = [f"{words}: {layer_list(layers)}" for words, layers in groups.items()]
        return (
            "Spectral filter per layer (exponent p at small eigenvalues: 1 for the first-order and ridge classes, 2 for "
            "Iterative Newton from M_0 = alpha S): " + "; ".join(parts) + "."
        )

    def caveats(self, sp: Spectral, summary: Any) -> list[str]:
        return [f"Spectral filter not measured here: {sp.reason}"] if sp.status == "not measured" else []

    def tables(self, sp: Spectral, summary: Any, tables: dict[str, pd.DataFrame]) -> dict[str, str]:
        """Per layer: the verdict, p in the best family's own variable, and each variable's best member."""
        if sp.status == "not measured":
            return {
                "spectral": html_table(pd.DataFrame([{"status": sp.status, "reason": sp.reason, "knob": sp.knob}])),
                "spectral_refs": "-",
            }
        fmt = lambda v: (
            "-" if v is None or math.isnan(v) else f"{v:.2f}"
        )  # None (read back) or NaN (built): none measured
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
            # a layer that does not respond has no filter to fall short of
            fit = sp.by_variable[sp.variable[i]]
            share = f"{fit.non_filter[i]:.3f}"
            if fit.non_filter_uncorrected:  # corrected for the induced weights' query noise
                share += f" ({fit.non_filter_uncorrected[i]:.3f} uncorrected)"
            row["not a filter"] = "- (no response)" if sp.verdict[i] == "no response" else share
            rows.append(row)
        refs = ", ".join(f"{name} {fmt(r['p_median'])} ({r['variable']})" for name, r in sp.references.items())
        return {"spectral": html_table(pd.DataFrame(rows)), "spectral_refs": refs}

    def evidence(self, sp: Spectral | None, summary: Any, a: str, b: str) -> list[dict[str, Any]]:
        from ..reporting.evidence import EQUIVALENCES

        return _spectral_rows(sp, a, b, EQUIVALENCES.get((a, b), ""))

    def study_rows(self, t) -> list[dict[str, Any]]:
        """A study's rows (study.csv): the exponent per layer in the best family's own bin variable
        (metric spectral_p, learner = the verdict) and in each variable (spectral_p_<variable>, learner =
        that variable's own verdict: its best class only where separated from the runner-up, `variable_verdict`),
        with 90% intervals."""
        if "spectral_summary" not in t:
            return []
        rows = [
            {"metric": "spectral_p", "value": r.p, "learner": r.verdict, "layer": int(r.predictor), "ci_low": r.p_low,
             "ci_high": r.p_high}
            for r in t["spectral_summary"].itertuples()
        ]  # fmt: skip
        rows += [
            {"metric": f"spectral_p_{r.variable}", "value": r.p, "learner": r.verdict, "layer": int(r.predictor),
             "ci_low": r.p_low, "ci_high": r.p_high}
            for r in t["spectral_layers"].itertuples()
        ]  # fmt: skip
        return rows

    def page(self, sp, summary, figs, tables, context):
        """The filter's prose, table and figures (templates/spectral.html.j2), where its figures were drawn."""
        page = (("Spectral filter of each layer", "spectral", "spectral_exponents"),)
        return template_page(self, "spectral.html.j2", page, sp, summary, figs, tables, context)


register_stage(SpectralStage())
