"""The report's [ood] stage (probe/core/stages.py): which learner, matched in distribution, the
model tracks under each of Garg et al.'s shifts (Garg et al. 2022, §5; the analysis:
probe/analysis/shift_tracking.py) - its settings, summary.json block, figure, page section, findings
line and evidence-table row."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from ..analysis.shift_tracking import CANDIDATES, MATCH_PROMPTS, track_shifts
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.plotting import pyplot, save_png
from ..core.settings import SweepSettings
from ..core.stages import AnalysisStage, register_stage
from ..core.validity import Domain, Validity
from ..data.shifts import SHIFTS, parse_shift
from ..models import family_class
from ..models.sizes import shape_of

OOD_SHIFTS = ("scale_x=2", "scale_x=3", "scale_y=3", "half_subspace", "skewed", "random_quadrants", "noisy")


@dataclass
class OodSettings(Section):
    """Out-of-distribution comparison (this module): recipe section [ood]. Runs on
    isotropic linear-regression checkpoints (the shifts' task)."""

    SECTION = "ood"
    enabled: bool = setting(True, "compare the model with its matched learners under distribution shifts in reports")
    shifts: tuple[str, ...] = setting(
        OOD_SHIFTS, "shifts, NAME or NAME=VALUE (icl-probe evaluate --shift)", nonempty=True
    )
    prompts: int = setting(512, "shifted prompts per shift (and unshifted prompts that match the learners)")

    def __post_init__(self) -> None:
        super().__post_init__()
        for shift in self.shifts:
            try:
                parse_shift(shift)
            except ConfigError as err:
                raise ConfigError(f"ood.shifts: {err}") from None


def shifts_refusal(ckpt) -> str:
    """Garg et al.'s shifts are defined on isotropic linear regression (probe/data/shifts.py): why
    they do not apply to this checkpoint's task, "" where they do."""
    task = ckpt.config.task
    if task.name == "linear_regression" and task.covariance == "isotropic":
        return ""
    return (
        f"Garg et al.'s shifts are defined on isotropic linear regression; this checkpoint's task is {task.name} "
        f"with {task.covariance} inputs"
    )


@dataclass
class OodShift:
    """One shift of the out-of-distribution comparison: the family
    the model tracks (its matched member), the runner-up, their paired difference in `criterion`
    (mismatch in diverging, or distance / d) with its 90% interval, and the model's own error / d and
    share of prompts on which it diverged."""

    shift: str
    tracks: str
    matched: str
    distance: float | None
    relative_distance: float | None
    runner_up: str
    criterion: str
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    separable: bool
    model_error: float | None
    model_diverged: float
    tie: str = ""  # why no family is tracked though one is nearest (both at the zero predictor, ...)


@dataclass
class OodSide:
    """Two hypotheses (a, b) under one shift: the closest family of each, the paired difference
    oriented so that > 0 favours a, the squared gap between the two families, and the side favoured
    (None: not separable, or not `resolved`: the model no nearer either than they are to each other)."""

    shift: str
    a: str
    b: str
    family_a: str
    family_b: str
    favours: str | None
    criterion: str
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    gap: float | None
    distance: float | None
    resolved: bool


@dataclass
class Ood:
    """Which matched learner the model tracks under each shift of the recipe's [ood] section."""

    shifts: list[OodShift]
    sides: list[OodSide]
    definition: str = (
        "each learner family's member closest to the model in distribution, asked the shifted prompts beside "
        "the model; ranked by the share of prompts on which it and the model disagree about diverging, then "
        "by mean squared distance / d to the model's predictions"
    )


def ood_block(table: pd.DataFrame, sides: pd.DataFrame) -> Ood:
    """The tracked family per shift (rows with `tracks`) and the side comparisons."""
    shifts = [
        OodShift(
            shift=r.shift,
            tracks=r.family,
            matched=r.matched,
            distance=r.distance,
            relative_distance=r.relative_distance,
            runner_up=r.runner_up,
            criterion=r.criterion,
            difference=r.difference,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            separable=bool(r.separable),
            model_error=r.model_error,
            model_diverged=r.model_diverged,
            tie=str(getattr(r, "tie", "") or ""),
        )
        for r in table[table.tracks.astype(bool)].itertuples()
    ]
    names = [f.name for f in fields(OodSide)]
    rows = sides.astype(object).where(sides.notna(), None)
    return Ood(shifts, [OodSide(**{k: row[k] for k in names}) for row in rows.to_dict("records")])


def ood_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """Error / d against the number of examples under each shift (one panel each): the model (black)
    beside each learner family's member matched in distribution;
    means over the prompts on which the predictor did not diverge."""
    plt = pyplot()
    shifts = list(dict.fromkeys(table["shift"]))
    cols = min(4, len(shifts))
    rows = -(-len(shifts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.8 * rows), squeeze=False, sharex=True)
    for ax, shift in zip(axes.flat, shifts):
        part = table[table["shift"] == shift]
        for i, (who, r) in enumerate(part.groupby("predictor", sort=False)):
            style = {"color": "black", "lw": 2.0, "zorder": 3} if who == "model" else {"color": f"C{i}", "lw": 1.0}
            ax.plot(r.t, r.error.clip(lower=1e-6), label=who, **style)
        ax.set(title=shift, yscale="log")
    for ax in axes.flat[len(shifts) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("examples t")
    for ax in axes[:, 0]:
        ax.set_ylabel("error / d")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=7, bbox_to_anchor=(0.5, -0.02))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_png(fig, stem)


VALIDATED_ON = (
    "planted GD (GD with its fixed step: diverges where the model does under scale_x = 2 and 3, nearest under "
    "every other shift) and planted Newton (Newton with its fixed alpha: diverges where the model does under "
    "scale_x = 2 and 3): tests/test_shift_tracking.py"
)
# the conditions its known answers cover: planted GD and Newton at d = 4, isotropic (no read-out: the model's output)
OOD_DOMAIN = Validity(
    (Domain(d=(4, 4), kappa=(1, 1), readout=(), tests="tests/test_shift_tracking.py, tests/test_evidence.py"),),
    tested_against="GD and Newton, each with fixed and adaptive steps",
)
OOD_BLIND = (
    "a family is represented by its member matched in distribution; members that agree there and differ off "
    "distribution (GD's eta x steps, Newton's alpha x 2^k) are told apart only where they diverge differently"
)
DESCRIPTION = (
    "Off the training distribution (Garg et al.'s prompt families, probe/data/shifts.py): each learner family's "
    "member closest to the model on unshifted prompts (its fixed step, alpha rule or penalty) is asked the same "
    "shifted prompts as the model ([ood] prompts per shift), ranked by the share of prompts on which it and the "
    "model disagree about diverging, then by mean squared distance / d to the model's predictions: a learner "
    "that diverges where the model does not (or the reverse) is further than any finite distance. A prediction "
    "diverges beyond 10^3 times the labels' root mean square. Intervals: 90% over resampled prompts, paired "
    "between families."
)


class OodStage(AnalysisStage):
    """Off the training distribution: the report's `ood` stage (module docstring)."""

    name = "ood"
    papers = ("Garg et al. 2022: the prompt shifts",)
    settings = OodSettings
    block = Ood
    title = "Off the training distribution"
    description = DESCRIPTION
    reads = ("similarity",)
    captions = (
        (
            "ood_curves",
            "Error / d against the number of examples under each shift: the model (black) and each matched "
            "family, means over the prompts on which the predictor did not diverge.",
        ),
    )

    def run(self, c) -> dict[str, pd.DataFrame]:
        """Which matched learner the model tracks under each [ood] shift."""
        settings, seed = c.recipe.ood, c.recipe.prompts.seed
        study = track_shifts(
            c.ckpt.model,
            c.ckpt.config.task,
            settings.shifts,
            settings.prompts,
            seed,
            c.device,
            c.recipe.similarity.bootstrap,
            c.progress,
        )
        return {"ood": study.table, "ood_curves": study.curves, "ood_sides": study.sides}

    def summarise(self, tables, recipe):
        return ood_block(tables["ood"], tables["ood_sides"])

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"ood_curves": ood_figure(tables["ood_curves"], fig_dir / "ood_curves")[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        """The shifted prompts (a forward per t where a shift replaces the queries), the families'
        match in distribution and the paired bootstrap."""
        ood, n = recipe.ood, ckpt.config.task.n_points
        shape = shape_of(ckpt.config.model)
        families = [SweepSettings(f, learner, grid=dict(grid)) for f, (learner, grid) in CANDIDATES.items()]
        # a shift that replaces the queries costs one query token per prefix after a cached forward (about
        # half a forward), or without a key/value cache one sequence per prefix (about n / 2 forwards)
        replacing = sum(SHIFTS[parse_shift(s)[0]].replaces_query for s in ood.shifts)
        per_prefix = 0.5 if family_class(ckpt.config.model.family).key_value_cache else n / 2
        forwards = (len(ood.shifts) + replacing * per_prefix) / max(1, len(ood.shifts))
        return [
            budget.prompt_estimate("ood.prompts", ood.prompts * len(ood.shifts), shape, n, forwards, ood.prompts),
            *budget.learner_estimates(families, MATCH_PROMPTS, n, shape.d, "ood.match"),
            budget.bootstrap_estimate("similarity.bootstrap", recipe.similarity.bootstrap, ood.prompts, len(families)),
        ]

    def findings(self, block: Ood, summary) -> str | None:
        """Which matched learner the model tracks under each shift, grouped by family."""
        groups: dict[str, list[str]] = {}
        for s in block.shifts:
            if s.tie:  # nearest by a margin that names nothing
                groups.setdefault("no family", []).append(f"{s.shift} ({s.tie})")
                continue
            groups.setdefault(s.tracks, []).append(s.shift + ("" if s.separable else " (runner-up not apart)"))
        parts = "; ".join(f"{family} under {', '.join(shifts)}" for family, shifts in groups.items())
        diverged = [f"{s.shift} ({s.model_diverged:.0%})" for s in block.shifts if s.model_diverged > 0]
        tail = f" The model diverges under {', '.join(diverged)}." if diverged else ""
        return f"Off the training distribution the model tracks {parts}.{tail}"

    def tables(self, ood: Ood, summary, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Per shift the family tracked and its runner-up; per shift and question the sides."""
        num = lambda v: "-" if v is None else f"{v:.3g}"
        interval = lambda d, lo, hi: f"{num(d)} [{num(lo)}, {num(hi)}]"
        shifts = pd.DataFrame(
            [
                {
                    "shift": s.shift,
                    "tracks (matched member)": f"none: {s.tracks} ({s.matched}) {s.tie}"
                    if s.tie
                    else f"{s.tracks} ({s.matched})",
                    "distance / d (relative)": f"{num(s.distance)} ({num(s.relative_distance)})",
                    "runner-up": s.runner_up,
                    "runner-up's excess": f"{interval(s.difference, s.ci_low, s.ci_high)} in {s.criterion}",
                    "separable": "yes" if s.separable else "no",
                    "model error / d": num(s.model_error),
                    "model diverged": f"{s.model_diverged:.0%}",
                }
                for s in ood.shifts
            ]
        )
        sides = pd.DataFrame(
            [
                {
                    "shift": s.shift,
                    "a vs b": f"{s.a} ({s.family_a}) vs {s.b} ({s.family_b})",
                    "difference (> 0: a nearer)": f"{interval(s.difference, s.ci_low, s.ci_high)} in {s.criterion}",
                    "gap between them": num(s.gap),
                    "model's distance": num(s.distance),
                    "favours": s.favours or ("-" if s.resolved else "- (unresolved)"),
                }
                for s in ood.sides
            ]
        )
        return {
            "Per shift, the family the model tracks (its member matched in distribution) and the runner-up, with the "
            "paired difference in the criterion that ranked them (90% over resampled prompts)": shifts,
            "Hypotheses side by side (the evidence table's row): the closest family of each side, the paired difference "
            "(> 0: the first side nearer) and the squared gap between the two families; a side is favoured only where the "
            "interval excludes 0 and the model is nearer it than the two are to each other": sides,
        }

    def evidence(self, block: Ood, summary, a: str, b: str) -> list[dict]:
        """The evidence table's row: per shift, the side the model stays nearer off its training
        distribution (`side_comparisons`); favours a side that some shift resolves and none opposes."""
        sides = [s for s in block.sides if {s.a, s.b} == {a, b}]
        if not sides:
            return []
        # only the divergence criterion is validated on known answers (planted GD and Newton); a side
        # favoured by distance alone is shown, never counted
        favoured = {s.favours for s in sides if s.favours is not None and s.criterion == "mismatch"}
        favours = favoured.pop() if len(favoured) == 1 else None

        def words(s) -> str:
            sign = 1 if s.a == a else -1  # differences as a - b closeness (> 0 favours a)
            lo, hi = sorted((sign * (s.ci_low or 0), sign * (s.ci_high or 0)))
            unit = "mismatch share" if s.criterion == "mismatch" else "distance"
            verdict = s.favours or ("unresolved" if not s.resolved else "not separable")
            if s.favours and s.criterion != "mismatch":
                verdict += " by distance (a criterion no known answer validates: not counted)"
            gap = "" if s.criterion == "mismatch" else f", gap {s.gap:.3g}, model at {s.distance:.3g}"
            return f"{s.shift}: {verdict} ({unit} {sign * (s.difference or 0):+.3g} [{lo:+.3g}, {hi:+.3g}]{gap})"

        effect = "; ".join(words(s) for s in sides)
        if len(favoured) > 1 or (favours is None and any(s.favours and s.criterion == "mismatch" for s in sides)):
            effect = "shifts disagree: " + effect
        return [
            {
                "instrument": "off-distribution tracking",
                "favours": favours,
                "effect": effect,
                "validated_on": VALIDATED_ON if {a, b} == {"newton", "gd"} else "",
                "domain": OOD_DOMAIN,
                "cannot_tell_apart": OOD_BLIND,
            }
        ]

    def refuses(self, ckpt):
        return shifts_refusal(ckpt)


OOD = register_stage(OodStage())
