"""Affordability: refuse work the machine cannot afford before any of it starts or any output is written.

Every size knob of a command (prompts, bootstrap resamples, learner iterations, probe widths,
queries, layers) is turned into two estimates from the resolved settings and the model's config:
the largest allocation it implies (bytes) and the arithmetic it implies (floating-point
operations, "flop"). An estimate over its limit is refused with one line naming the knob, the
estimate and the limit:

- memory: MEMORY_FRACTION of the available memory (probe/core/validate.py `check_memory`), or the
  report's --max-memory;
- work: `max_work()` flop, DEFAULT_MAX_WORK unless raised with `icl-probe --max-work 1e17 ...`
  or, in Python, `with probe.core.budget.work_limit(1e17): ...`.

The estimates are upper bounds of the right order (constant factors of a few), not timings: they
separate a recipe that runs in hours from one that asks for 10^9 of something.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .settings import induced_count, query_count
from .validate import ITERATION_KEYS, check_memory

log = logging.getLogger(__name__)

# The estimates run at 6e10-4e11 "flop" per second on this project's 2-core machine: the quick report
# of the default model is 1.5e12 (25 s), of Garg's standard model 7.5e13 (207 s), the full recipe on
# that model 1.1e15. The default limit is hours of work.
DEFAULT_MAX_WORK = 3e15
FLOP_RATE = (6e10, 4e11)  # the estimates' flop per second here, slowest and fastest measured
ANNOUNCE_WORK = 3.6e12  # admitted work above this (a minute or more at the slowest rate) is announced with its time
PYTHON_STEP_FLOP = 1e7  # one interpreted step (a layer of a batch, a learner iteration) counted as arithmetic
# the matching's interpreted steps (`match_estimates`), measured on the default checkpoint (2026-11-29,
# quiet: 44 ms a sweep and similarity over 9 layers, 47 ms a trend fit, 17 ms a layer's span test):
# per layer x sweep x similarity, per trend fit, per layer's span test
MATCH_STEPS = (10, 100, 35)
BATCH = 256  # prompts per forward batch in the estimates
CLOSED_FORM_STEPS = ("gd",)  # learners whose step counts are evaluated in closed form (no loop)
_limit = [DEFAULT_MAX_WORK]


def max_work() -> float:
    """The work limit in flop now in force."""
    return _limit[0]


def set_max_work(flop: float) -> None:
    """Raise (or lower) the work limit for the rest of the process (the CLI's --max-work)."""
    if not (isinstance(flop, (int, float)) and math.isfinite(flop) and flop > 0):
        raise ConfigError(f"--max-work must be a positive number of floating-point operations, got {flop!r}")
    _limit[0] = float(flop)


@contextmanager
def work_limit(flop: float) -> Iterator[None]:
    """Run a block of Python API calls under another work limit."""
    old = max_work()
    set_max_work(flop)
    try:
        yield
    finally:
        _limit[0] = old


@dataclass(frozen=True)
class Estimate:
    """What one knob asks for: its name (the recipe key or flag a user changes), its value, and the
    memory (bytes) and work (flop) it implies."""

    knob: str
    value: Any
    nbytes: float = 0.0
    flop: float = 0.0


def check(estimates: list[Estimate], where: str = "") -> None:
    """Refuse the first knob whose memory is over the limit, then a total work over the limit,
    naming the knob that contributes most (and `where`, e.g. the checkpoint, after its value)."""
    on = f" on {where}" if where else ""
    for e in estimates:
        check_memory(e.nbytes, f"{e.knob} = {_short(e.value)}{on}", f"lower {e.knob}")
    total = sum(e.flop for e in estimates)
    if max_work() >= total > ANNOUNCE_WORK and estimates:
        announce(estimates, total, on)
    if total > max_work():
        top = max(estimates, key=lambda e: e.flop)
        share = f" ({top.flop:.1e} of them for {top.knob})" if top.flop < 0.9 * total else ""
        raise ConfigError(
            f"{top.knob} = {_short(top.value)}{on} makes this need about {total:.1e} floating-point operations{share}, "
            f"more than the limit of {max_work():.1e}; lower {top.knob}, or "
            f"raise the limit with icl-probe --max-work {_round_up(total)} "
            f"(Python: with probe.core.budget.work_limit({_round_up(total)}): ...)"
        )


def announce(estimates: list[Estimate], total: float, on: str = "") -> None:
    """One warning (the CLI prints it on stderr) before admitted work that takes minutes or more: its size, the time it
    should take on this project's 2-core machine (FLOP_RATE), and the knob that contributes most."""
    top = max(estimates, key=lambda e: e.flop)
    fast, slow = total / FLOP_RATE[1], total / FLOP_RATE[0]
    log.warning(
        "estimate: about %.1e floating-point operations%s, %s to %s on a 2-core CPU; %s = %s contributes %.0f%% "
        "(lower it to go faster)",
        total,
        on,
        _duration(fast),
        _duration(slow),
        top.knob,
        _short(top.value),
        100 * top.flop / total,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _round_up(flop: float) -> str:
    return f"1e{math.ceil(math.log10(flop))}"


# ------------------------------------------------------------------ estimators


@dataclass(frozen=True)
class Shape:
    """What the estimates need of a model: depth, residual width, input dimension, and for planted
    constructions (one run per prefix) their heads and MLP width."""

    layers: int
    width: int
    d: int
    planted: bool = False
    heads: int = 1
    d_mlp: int = 0


def forward_cost(shape: Shape, prompts: int, points: int) -> tuple[float, float]:
    """(flop, bytes) of one forward over `prompts` prompts of `points` points: the blocks' matrix
    products and attention plus an interpreted step per layer; bytes: every boundary's residual
    stream (what a capture keeps)."""
    w = shape.width
    if shape.planted:  # one run per prefix: points runs of about points + d tokens each
        run = points + shape.d + 1
        tokens = points * run
        per_layer = tokens * (shape.heads * (6 * w * w + 4 * run * w) + 4 * shape.d_mlp * w)
    else:
        tokens = 2 * points
        per_layer = tokens * (24 * w * w + 4 * tokens * w)
    flop = shape.layers * (float(prompts) * per_layer + math.ceil(prompts / BATCH) * PYTHON_STEP_FLOP)
    nbytes = 4.0 * prompts * (shape.layers + 2) * 2 * points * w
    return flop, nbytes


def prompt_estimate(
    knob: str, count: int, shape: Shape, points: int, forwards: float = 1.0, value: Any = None
) -> Estimate:
    """`count` prompts run through the model `forwards` times, their streams kept once; `value`: the
    knob's own value where the count is a product of it with others (default: count)."""
    flop, nbytes = forward_cost(shape, int(count), points)
    return Estimate(knob, count if value is None else value, nbytes, flop * forwards)


def bootstrap_estimate(knob: str, n_boot: int, prompts: int, cells: int = 1) -> Estimate:
    """Bootstrap resamples of `prompts` prompts for `cells` statistics: the index draws (int64) and
    one pass over the prompts per resample and cell."""
    prompts = max(int(prompts), 1)
    return Estimate(knob, n_boot, 8.0 * n_boot * prompts, float(n_boot) * prompts * max(cells, 1))


def grid_points(sweep) -> int:
    return math.prod(len(v) if isinstance(v, (list, tuple)) else 1 for v in sweep.grid.values())


def learner_estimates(sweeps, prompts: int, points: int, d: int, where: str = "sweeps") -> list[Estimate]:
    """Each sweep's sequential steps (the largest value of an iteration key of its grid: a d x d
    product per prompt and prefix each) and its grid's weights and predictions (float64)."""
    out = []
    for sweep in sweeps:
        combos = grid_points(sweep)
        for key in () if getattr(sweep, "learner", None) in CLOSED_FORM_STEPS else ITERATION_KEYS:
            values = sweep.grid.get(key)
            values = list(values) if isinstance(values, (list, tuple)) else ([] if values is None else [values])
            numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if numbers:
                runs = combos / max(len(values), 1)  # the other keys' combinations each run the steps once
                flop = runs * max(numbers) * (2.0 * prompts * points * d * d + PYTHON_STEP_FLOP)
                out.append(Estimate(f"{where}.{sweep.label}.{key}", max(numbers), 0.0, flop))
        nbytes = 8.0 * combos * prompts * points * (d + 1)
        out.append(Estimate(f"{where}.{sweep.label}", f"{combos} grid points", nbytes, 0.0))
    return out


def readout_estimates(shape: Shape, points: int, prompts) -> list[Estimate]:
    """The per-layer read-outs: the training, validation and test prompts' captures."""
    return [
        prompt_estimate(
            "prompts.train + prompts.val",
            prompts.train + prompts.val,
            shape,
            points,
            value=f"{prompts.train} + {prompts.val}",
        ),
        prompt_estimate("prompts.test", prompts.test, shape, points),
    ]


def query_estimates(shape: Shape, points: int, prompts) -> list[Estimate]:
    """SimW's induced weights: the fresh queries' forwards on the first prompts.induced test prompts,
    and their predictions at every layer (float64). A planted construction runs a sequence per
    query; a trained model runs each prompt once and then one query token per (prefix, query) through
    its key/value cache, attending over about `points` tokens on average (half a sequence's tokens)."""
    queries = query_count(prompts.queries, shape.d)
    induced = induced_count(prompts.induced, prompts.test)
    flop, _ = forward_cost(shape, induced * queries, points)
    if not shape.planted:
        w, tokens = shape.width, float(induced) * queries * points
        flop = forward_cost(shape, induced, points)[0] + shape.layers * (
            tokens * (24 * w * w + 4 * points * w) + math.ceil(induced * queries / BATCH) * PYTHON_STEP_FLOP
        )
    nbytes = 16.0 * induced * points * queries * (shape.layers + 1)
    return [Estimate("prompts.queries", queries, nbytes, flop)]


def match_estimates(shape: Shape, points: int, prompts, similarity, sweeps) -> list[Estimate]:
    """The layer analyses' matching (probe/analysis/pipeline.py `match_layers`): every learner of the
    sweeps on the test prompts; per sweep and similarity (SimE, and SimW where on) the per-prompt
    similarity of every layer x grid cell (SimW: a d-vector product per prefix) and two bootstrap
    products of the resamples' prompt counts with it (the heatmap's intervals and the best match's,
    probe/analysis/stats.py `resampled_means`); the interpreted steps (MATCH_STEPS: the tidy rows and
    best match per layer, sweep and similarity, a trend fit per swept axis and similarity, the span
    test per layer); the random-weights null's forward on the test prompts."""
    metrics = 2 if similarity.simw else 1
    layers, axes = shape.layers + 1, sum(1 for s in sweeps if getattr(s, "axis", None))
    cells = layers * sum(grid_points(s) for s in sweeps)
    test = max(int(prompts.test), 1)
    per_cell = test * points * (1 + (shape.d if similarity.simw else 0)) + 2 * 2.0 * similarity.bootstrap * test
    per_layer, per_trend, per_span = MATCH_STEPS
    steps = (layers * (metrics * len(sweeps) * per_layer + per_span) + metrics * axes * per_trend) * PYTHON_STEP_FLOP
    return [
        Estimate("similarity.bootstrap", similarity.bootstrap, 8.0 * similarity.bootstrap * test,
                 2.0 * cells * per_cell + steps),
        prompt_estimate("prompts.test", test, shape, points),
        *learner_estimates(sweeps, prompts.test, points, shape.d),
    ]  # fmt: skip


def probe_estimates(shape: Shape, points: int, probes, n_test: int) -> list[Estimate]:
    """The probe study: its prompts' streams, and per probe (layer x prefix x target x kind x
    control) max_iter passes over prompts x tokens x width, and the MLP probes' hidden layer."""
    prefixes = len(probes.prefixes or ()) or 4
    n_probes = (shape.layers + 1) * prefixes * len(probes.targets) * (3 if probes.controls else 1)
    tokens = 2 * points
    out = [prompt_estimate("probes.prompts", probes.prompts + n_test, shape, points, 2 if probes.controls else 1)]
    per_pass = 2.0 * probes.prompts * tokens * shape.width
    out.append(Estimate("probes.max_iter", probes.max_iter, 0.0, n_probes * probes.max_iter * per_pass))
    if "mlp" in probes.kinds:
        out.append(mlp_probe_estimate("probes.hidden", probes.hidden, n_probes, probes.prompts, shape.width))
    return out


def spectral_estimate(bins: int, prompts: int, predictors: int, n_boot: int) -> Estimate:
    """The spectral instrument (probe/analysis/spectral.py): five float64 sums per (prompt, bin) for
    every predictor (the layers and the reference members), and their bootstrap resamples (a
    (resamples x prompts) by (prompts x bins) product per sum and predictor), per bin variable; and
    an interpreted step per predictor and variable (its curve, exponent and class fits: most of the
    stage's time where the sums are small)."""
    variables = 2
    nbytes = 8.0 * 5 * predictors * bins * (prompts + n_boot)
    flop = variables * predictors * (5 * 2.0 * n_boot * prompts * bins + PYTHON_STEP_FLOP)
    return Estimate("spectral.bins", bins, nbytes, flop)


def finetune_estimate(steps: int, shape: Shape, prompts: int, points: int) -> Estimate:
    """The 'adam' read-out: `steps` full-batch Adam steps of a (width + 1) read-out per layer over the
    training prompts' states."""
    flop = (shape.layers + 1) * float(steps) * (6.0 * prompts * points * (shape.width + 1) + PYTHON_STEP_FLOP)
    return Estimate("readout.finetune_steps", steps, 0.0, flop)


def mlp_probe_estimate(knob: str, hidden: int, n_probes: int, prompts: int, width: int) -> Estimate:
    """MLP probes: a random layer of `hidden` units on each probe's pooled features (float64, held
    for all prompts) and a ridge head on them (hidden^2 per prompt)."""
    nbytes = 8.0 * n_probes * prompts * hidden
    flop = n_probes * 2.0 * prompts * hidden * (width + hidden)
    return Estimate(knob, hidden, nbytes, flop)


def intervention_estimates(shape: Shape, points: int, settings, n_boot: int, checked_maps: int = 2) -> list[Estimate]:
    """The causal checks' forwards as they run, in bare forwards over their prompts. Ablations: the
    unablated run, the held-out means, and each component's ablation (a layer skip, an MLP per kind,
    every head per kind where `heads`), resumed from its layer (on average (L + 1) / 2L of a
    forward). The patching heatmap: the clean and corrupted runs, then for each boundary and
    position the blocks above the boundary resumed on the tokens from that position to the query.
    The map check: two runs and, per boundary and query, the query token resumed, for each of
    `checked_maps` layer maps (the recipe's learners; two for "auto" on most checkpoints). A
    planted construction has no resumed path (probe/interventions/runner.py): a whole forward
    per ablation and per patched boundary and position."""
    layers, n = shape.layers, 2 * points
    positions = min(settings.max_positions or 2 * points, 2 * points - 1)  # tokens up to the query
    queries = min(settings.max_queries or points, points)
    per_layer = ("skip" in settings.kinds) + sum(k != "skip" for k in settings.kinds) * (
        (shape.heads if settings.heads else 0) + 1
    )
    ablation: float
    patch: float
    if shape.planted:
        ablation = 2 + per_layer * layers
        patch = (layers + 1) * (positions + queries)
    else:
        resumed = (layers + 1) / 2  # blocks above a boundary, summed over boundaries, in forwards
        ablation = 2 + per_layer * resumed
        windows = positions * (positions + 1) / 2 / n  # tokens resumed over every position, in sequences
        patch = 2 + resumed * windows + checked_maps * (2 + resumed * queries / n)
    return [
        prompt_estimate("interventions.prompts", settings.prompts, shape, points, ablation),
        prompt_estimate("interventions.patch_prompts", settings.patch_prompts, shape, points, patch),
        bootstrap_estimate(
            "bootstrap", n_boot, max(settings.prompts, settings.patch_prompts), (layers + 1) * positions
        ),
    ]
