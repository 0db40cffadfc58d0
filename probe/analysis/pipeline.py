"""The layer analyses end to end: prompts -> states -> read-outs -> heatmaps, trend, span.

    >>> settings = LayerSettings(prompts=PromptSettings(test=512))
    >>> settings.prompts.test, settings.n_induced
    (512, 64)

then `result = analyse_layers(model, task, settings)`; `result.best` has one row per (learner,
metric, layer): the best-matching k with intervals.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core import budget
from ..core.errors import ConfigError, NotMeasurable
from ..core.memory import MemoryBudget
from ..core.progress import tqdm
from ..core.seeds import Stream
from ..core.settings import (
    PromptSettings,
    SimilaritySettings,
    SweepSettings,
    check_induced_queries,
    induced_count,
    query_count,
    quick_sweeps,
)
from ..core.validate import check_device, check_model, positive_int
from ..data.config import TaskConfig
from ..data.tasks import generator_for, sample_prompts
from ..models.sizes import shape_of
from .matching import compare_layers, family_of, learner_weights, run_sweep, table1, trend, without_draws
from .nulls import flag_degenerate, null_predictions, null_table
from .readout import LayerReadouts, ReadoutSettings, finetune_layer_readouts, fit_layer_readouts, readout_table
from .similarity import induced_weights, sime, simw
from .span import span_table
from .spectral import NotMeasured, SpectralAnalysis, SpectralSettings, spectral_analysis, spectral_cost
from .spectral_references import reference_families
from .states import query_states, x_states
from .verdicts import Candidate, final_layer_verdicts, pick, sime_between, simw_between

log = logging.getLogger(__name__)
STREAMS = {"train": Stream.READOUT_TRAIN, "val": Stream.READOUT_VAL, "test": Stream.TEST, "queries": Stream.QUERIES}


@dataclass
class LayerSettings:
    """The layer analyses' settings: the recipe's [prompts], [readout] and [similarity] sections
    (probe/core/settings.py, where each key's default and meaning are written) and its sweeps, plus
    how to run (batch size, device, memory budget)."""

    prompts: PromptSettings = field(default_factory=PromptSettings)
    readout: ReadoutSettings = field(default_factory=ReadoutSettings)
    similarity: SimilaritySettings = field(default_factory=SimilaritySettings)
    sweeps: tuple[SweepSettings, ...] = field(default_factory=quick_sweeps)  # analyses/quick.toml's
    spectral: SpectralSettings = field(default_factory=SpectralSettings)
    batch_size: int = 256
    device: str = "cpu"
    memory: MemoryBudget = field(default_factory=MemoryBudget)

    @classmethod
    def from_recipe(cls, recipe, device: str = "cpu", memory: MemoryBudget | None = None) -> LayerSettings:
        """The layer settings a report runs with `recipe` (a Recipe, e.g. `probe.recipe("quick")`)."""
        return cls(
            recipe.prompts,
            recipe.readout,
            recipe.similarity,
            tuple(recipe.sweeps),
            recipe.spectral,
            device=device,
            memory=memory or MemoryBudget(),
        )

    def __post_init__(self) -> None:

        positive_int(self.batch_size, "batch_size")
        self.sweeps = tuple(self.sweeps)
        check_device(self.device)

    @property
    def n_induced(self) -> int:
        """Test prompts whose induced weights are compared (SimW, span test): the first prompts.induced."""
        return induced_count(self.prompts.induced, self.prompts.test)


class ModelLens:
    """The model's own read-out at every layer (`model.lens`), instead of retrained ones."""

    def __init__(self, model):
        if not hasattr(model, "lens"):
            raise ConfigError("readout_method 'model' needs a model with a lens(resid) method")
        self.model = model

    @torch.no_grad()
    def predict(self, states: np.ndarray) -> np.ndarray:
        s = torch.as_tensor(np.asarray(states), dtype=torch.float32)
        device = next(iter(self.model.parameters()), torch.empty(0)).device
        return self.model.lens(s.to(device)).double().cpu().numpy()

    def predict_layer(self, layer: int, states: np.ndarray) -> np.ndarray:
        return self.predict(states)  # the same read-out at every layer


@dataclass
class InducedWeights:
    """Each layer's induced weights on the first n_induced held-out prompts (Fu et al. 2024, eq.
    11-12), those prompts, and the weights induced from each half of the queries (None with fewer
    than 2 d queries): what the spectral instrument reads (`layer_spectrum`)."""

    weights: np.ndarray  # (L+1, m, n, d)
    xs: np.ndarray  # (m, n, d)
    ys: np.ndarray  # (m, n)
    halves: tuple[np.ndarray, np.ndarray] | None = None
    queries: np.ndarray | None = None  # (m, Q, d): the fresh queries (SimW's learners are asked them too)

    ARRAYS = ("weights", "xs", "ys")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Its arrays by name (induced_<name>), as a stage's data keeps them (the stage cache writes
        each as a .npy file)."""
        out = {f"induced_{name}": np.asarray(getattr(self, name)) for name in self.ARRAYS}
        if self.halves is not None:
            out.update({"induced_half_a": self.halves[0], "induced_half_b": self.halves[1]})
        if self.queries is not None:
            out["induced_queries"] = self.queries
        return out

    @classmethod
    def from_arrays(cls, get) -> InducedWeights | None:
        """Read back from `get(name)` (a stage's data); None where the layers did not induce weights."""
        weights, xs, ys = (get(f"induced_{name}") for name in cls.ARRAYS)
        if weights is None or xs is None or ys is None:
            return None
        a, b = get("induced_half_a"), get("induced_half_b")
        return cls(weights, xs, ys, None if a is None or b is None else (a, b), get("induced_queries"))


@dataclass
class LayerAnalysis:
    """The layer analyses of one model (`analyse_layers`, `probe.analyse`; a report's layers stage).

    Layers are boundaries 0..L (0: the embedding output, l: after block l); n_examples t is the
    number of in-context examples before the query x_{t+1}; similarities are in [-1, 1] (SimE,
    Fu et al. 2024, eq. 10; SimW, eq. 11); errors are squared error / d; ci_low / ci_high are bootstrap
    5-95% intervals over the test prompts; `k` is a value of the sweep's axis (iterations, steps).

    readouts: the fitted per-layer read-outs (LayerReadouts: coef (L+1, D), intercept, alpha) or
        the model's own lens.
    readout: layer, n_examples, error, ci_low, ci_high: each layer's read-out error.
    cells: layer, sweep, grid_index, metric ("sime" / "simw"), value, ci_low, ci_high, and the
        sweep's grid keys (iterations, steps, eta, ...): every heatmap cell.
    best: sweep, learner, metric, layer, k, k_low, k_high (the interval of the best k), similarity,
        ci_low, ci_high, at_grid_end, zero_similarity / random_similarity (the null predictors'),
        predicts_zero, degenerate (the best match is no better than a null).
    trends: per sweep and metric, {learner, metric, layers, linear_r2, exponential_r2, slope,
        growth, verdict}: how the best k grows with depth ("linear, about 3.0 iterations per layer").
    table1: family, sweep, k, rank (1: most similar), similarity, ci_low, ci_high, zero_similarity,
        random_similarity, degenerate: the final layer's best match per learner family (Fu et al. 2024
        Table 1), one row per family in the sweeps' order.
    span: predictor, index, n_examples, residual, random_null, kind: the span-of-examples test
        (Fu et al. 2024, App. B.4), the relative residual of each layer's induced weights outside the
        span of the examples, beside a random vector's.
    nulls: layer, null ("zero" / "random_model"), similarity, ci_low, ci_high, relative_norm,
        predicts_zero: SimE of the null predictors per layer.
    spectral: the spectral instrument on the induced weights (SpectralAnalysis; None without SimW or
        when [spectral] is off).
    verdicts: claim, a, b, metric, sweep_a, sweep_b, k_a, k_b, difference (a - b), ci_low, ci_high,
        resolution, verdict ("a closer", "b closer", "not separable at this resolution"): Table 1's
        paired comparisons (probe/analysis/verdicts.py).
    timings: seconds per step.
    """

    readouts: LayerReadouts | ModelLens | None
    readout: pd.DataFrame  # layer x n_examples error/d with bands
    cells: pd.DataFrame  # heatmap cells: layer x learner grid x metric
    best: pd.DataFrame  # best match per (learner, metric, layer), with null baselines and `degenerate`
    trends: list[dict[str, Any]]
    table1: pd.DataFrame
    span: pd.DataFrame
    nulls: pd.DataFrame = field(default_factory=pd.DataFrame)  # per layer: SimE vs the zero / random-model predictor
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)  # paired final-layer verdicts (analysis/verdicts.py)
    timings: dict[str, float] = field(default_factory=dict)
    spectral: SpectralAnalysis | NotMeasured | None = None  # each layer's spectral filter (analysis/spectral.py)
    induced: InducedWeights | None = None  # what the spectral filter was measured on (None without SimW)


def analysis_prompts(task: TaskConfig, settings: LayerSettings, split: str, n: int):
    return sample_prompts(task, n, generator=generator_for(settings.prompts.seed, STREAMS[split]))


def fresh_queries(task: TaskConfig, prompts, n_queries: int, seed: int) -> torch.Tensor:
    """T fresh queries per prompt from the prompt's own input distribution (Fu et al. 2024, eq. 11)."""
    g = generator_for(seed, STREAMS["queries"])
    z = torch.randn(prompts.xs.shape[0], n_queries, task.n_dims, generator=g)
    a = prompts.params.get("sigma_sqrt")
    return z if a is None else z @ a


class _Clock:
    """Seconds per named phase."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._last, 2)
        self._last = now


def fit_readouts(model, task: TaskConfig, settings: LayerSettings, progress: bool = False):
    """Layer read-outs (retrained or the model's own) and the held-out prompts' per-layer predictions.

    Returns (readouts, eval prompts, layer_preds (L+1, B, n))."""
    dev, bs = settings.device, settings.batch_size
    train = analysis_prompts(task, settings, "train", settings.prompts.train)
    val = analysis_prompts(task, settings, "val", settings.prompts.val)
    ev = analysis_prompts(task, settings, "test", settings.prompts.test)
    readouts: LayerReadouts | ModelLens
    if settings.readout.method == "model":
        readouts = ModelLens(model)
    else:
        h_train, _ = x_states(model, train.xs, train.ys, dev, bs, progress, settings.memory)
        h_val, _ = x_states(model, val.xs, val.ys, dev, bs, progress, settings.memory)
        fitted = fit_layer_readouts(h_train, train.ys.numpy(), h_val, val.ys.numpy(), settings.readout.alphas)
        if settings.readout.method == "adam":
            fitted = finetune_layer_readouts(
                fitted, h_train, train.ys.numpy(), settings.readout.finetune_steps, seed=settings.prompts.seed
            )
        readouts = fitted
        del h_train, h_val  # the held-out states are captured after these are freed: never all three at once
    h_eval, _ = x_states(model, ev.xs, ev.ys, dev, bs, progress, settings.memory)
    return readouts, ev, readouts.predict(h_eval)


def induced_layer_weights(model, task: TaskConfig, settings: LayerSettings, readouts, ev, progress: bool = False):
    """Each layer's induced weights (Fu et al. 2024, eq. 11-12) on the first n_induced held-out prompts:
    (weights (L+1, m, n, d), the fresh queries (m, Q, d), and the weights induced from each half
    of the queries, two independent estimates (None with fewer than 2 d queries))."""
    m = settings.n_induced
    sub = type(ev)(ev.xs[:m], ev.ys[:m], None if ev.w is None else ev.w[:m], {k: v[:m] for k, v in ev.params.items()})
    queries = fresh_queries(task, sub, query_count(settings.prompts.queries, task.n_dims), settings.prompts.seed)
    q_preds = query_states(
        model,
        sub.xs,
        sub.ys,
        queries,
        settings.device,
        4 * settings.batch_size,
        progress,
        readout=readouts.predict_layer,
        memory=settings.memory,
    )  # (L+1, m, n, Q)
    preds = torch.as_tensor(q_preds)
    half, d = queries.shape[1] // 2, task.n_dims
    halves = None
    if half >= d:
        halves = tuple(
            induced_weights(preds[..., part], queries[:, part]).numpy()
            for part in (slice(0, half), slice(half, 2 * half))
        )
    return induced_weights(preds, queries).numpy(), queries, halves


def compare_sweeps(
    layer_preds: np.ndarray,
    layer_weights: np.ndarray | None,
    queries,
    ev,
    settings: LayerSettings,
    progress: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame, list[pd.DataFrame], dict[str, dict[str, Candidate]]]:
    """Heatmap cells and best matches of every sweep (SimE on all held-out prompts, SimW on the
    first n_induced), span tables of a few iterates of each learner, and per metric each learner
    family's final-layer candidate for the paired verdicts."""

    m, dev = settings.n_induced, settings.device
    cells, best, span_parts = [], [], []
    finals: dict[str, dict[str, Candidate]] = {"sime": {}, "simw": {}}
    lp_last = torch.as_tensor(layer_preds[-1:], dtype=torch.float64)
    for sweep in tqdm(settings.sweeps, desc="learners", disable=not progress, leave=False):
        result = run_sweep(sweep, ev.xs, ev.ys, None, dev)
        _keep_best(
            finals["sime"],
            sweep,
            result,
            sime(lp_last, result.preds.cpu(), ev.ys, settings.similarity.include_first)[0],
            result.preds.cpu(),
        )
        c, b = compare_layers(
            layer_preds,
            None,
            ev.ys,
            sweep,
            result,
            None,
            settings.similarity.include_first,
            settings.similarity.bootstrap,
            settings.prompts.seed,
        )
        cells.append(c)
        best.append(b)
        if layer_weights is None:
            continue
        sub_result = run_sweep(sweep, ev.xs[:m], ev.ys[:m], queries, dev)
        c, b = compare_layers(
            layer_preds[:, :m],
            layer_weights,
            ev.ys[:m],
            sweep,
            sub_result,
            queries,
            settings.similarity.include_first,
            settings.similarity.bootstrap,
            settings.prompts.seed,
        )
        cells.append(c[c.metric == "simw"])
        best.append(b[b.metric == "simw"])
        w = learner_weights(sub_result, queries).cpu()
        _keep_best(
            finals["simw"], sweep, sub_result, simw(torch.as_tensor(layer_weights[-1:], dtype=torch.float64), w)[0], w
        )
        for i in sorted({0, w.shape[0] // 2, w.shape[0] - 1}):
            label = f"{sweep.label}[{sweep.axis}={sub_result.grid[i].get(sweep.axis)}]" if sweep.axis else sweep.label
            span_parts.append(span_table(w[i : i + 1], ev.xs[:m], label, "index").assign(kind="learner"))
    join = lambda frames: pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return join(cells), join(best), span_parts, finals


TIE = 1e-12  # candidates' mean similarities closer than this are equal (float round-off)


def _keep_best(kept: dict[str, Candidate], sweep, result, values: Tensor, outputs: Tensor) -> None:
    """The final layer's match with this sweep (values (K, P)) as its family's candidate for the
    paired verdicts, if it beats the family's other sweeps (as Table 1 keeps the best per family)."""
    k = pick(values)
    family = family_of(sweep.label)
    grid_value = result.grid[k].get(sweep.axis, k) if sweep.axis else k
    found = Candidate(family, sweep.label, grid_value, values[k], outputs[k])
    # a tie (two sweeps holding the same learner setting) keeps the recipe's first, not round-off's pick
    if family not in kept or float(found.per_prompt.mean()) > float(kept[family].per_prompt.mean()) + TIE:
        kept[family] = found


def layer_costs(shape, task: TaskConfig, settings: LayerSettings, sweeps, spectrum: bool) -> list[budget.Estimate]:
    """What the layer analyses ask of this machine (probe/core/budget.py), the one definition the
    report's budget and `analyse_layers` share: the read-outs (`readout_costs`), SimW's query forwards
    (`induced_costs`), the sweeps' learners and similarities (`sweeps`) and, with `spectrum`, the
    spectral instrument on the induced weights (a report counts each in its own stage)."""
    p, points = settings.prompts, task.n_points
    out = readout_costs(shape, task, settings) + budget.match_estimates(shape, points, p, settings.similarity, sweeps)
    out += induced_costs(shape, task, settings) if settings.similarity.simw else []
    if spectrum:
        n_boot = settings.similarity.bootstrap
        out.append(
            spectral_cost(settings.spectral, settings.n_induced, shape.layers + 1, task.n_dims, n_boot, task.n_points)
        )
    return out


def readout_costs(shape, task: TaskConfig, settings: LayerSettings) -> list[budget.Estimate]:
    """The read-outs' captures, with the 'adam' read-out's fine-tune (the report's readout stage)."""
    out = budget.readout_estimates(shape, task.n_points, settings.prompts)
    if settings.readout.method == "adam":
        out.append(
            budget.finetune_estimate(settings.readout.finetune_steps, shape, settings.prompts.train, task.n_points)
        )
    return out


def induced_costs(shape, task: TaskConfig, settings: LayerSettings) -> list[budget.Estimate]:
    """SimW's fresh-query forwards (the report's induced stage)."""
    return budget.query_estimates(shape, task.n_points, settings.prompts)


def check_layer_budget(model, task: TaskConfig, settings: LayerSettings, sweeps, spectrum: bool) -> None:
    """Refuse, before any work, settings this machine cannot afford (`layer_costs`)."""
    budget.check(layer_costs(shape_of(model), task, settings, sweeps, spectrum))


def analyse_layers(model, task: TaskConfig, settings: LayerSettings, progress: bool = False) -> LayerAnalysis:
    """Read-outs per layer, then every layer against every sweep (SimE, SimW), with null
    baselines, trends, Table 1 and the span test."""
    check_model(model)
    if settings.similarity.simw:
        check_induced_queries(settings.prompts.queries, task.n_dims, off="similarity.simw = false")
    check_layer_budget(model, task, settings, settings.sweeps, settings.similarity.simw and settings.spectral.enabled)
    clock = _Clock()
    readouts, ev, layer_preds = fit_readouts(model, task, settings, progress)
    readout = readout_table(
        layer_preds, ev.ys.numpy(), task.n_dims, settings.similarity.bootstrap, settings.prompts.seed
    )
    clock.lap("readout")
    induced = None
    if settings.similarity.simw:
        layer_weights, queries, halves = induced_layer_weights(model, task, settings, readouts, ev, progress)
        induced = induced_on(layer_weights, ev, settings, halves, queries)
        clock.lap("query_states")
    res = match_layers(model, settings, ev, layer_preds, induced, progress, clock)
    res.readouts, res.readout = readouts, readout
    if induced is not None and settings.spectral.enabled:
        res.spectral = measure_spectrum(induced, settings)
        clock.lap("spectral")
    res.timings = clock.timings
    return res


def match_layers(
    model,
    settings: LayerSettings,
    ev,
    layer_preds: np.ndarray,
    induced: InducedWeights | None,
    progress: bool = False,
    clock: _Clock | None = None,
) -> LayerAnalysis:
    """Every layer against every sweep (SimE on the held-out prompts `ev`, SimW on the induced
    weights where given), with null baselines, trends, Table 1, paired verdicts and the span test,
    from the read-outs' predictions `layer_preds` (L+1, B, n) (`fit_readouts`); its `readouts` and
    `readout` are left empty (a report's readout stage makes them)."""
    clock = clock or _Clock()
    layer_weights = None if induced is None else induced.weights
    queries = None if induced is None else torch.as_tensor(induced.queries)
    cells, best, span_parts, finals = compare_sweeps(layer_preds, layer_weights, queries, ev, settings, progress)
    clock.lap("learners")
    nulls = null_table(
        layer_preds,
        ev.ys,
        null_predictions(model, ev.xs, ev.ys, settings.prompts.seed, settings.device),
        settings.similarity.include_first,
        settings.similarity.bootstrap,
        settings.prompts.seed,
    )
    trends, t1 = [], pd.DataFrame()
    if not best.empty:
        best = flag_degenerate(best, nulls)
        trends = [
            trend(best, s.label, metric, s.axis)
            for s in settings.sweeps
            if s.axis
            for metric in sorted(best.metric.unique())
        ]
        t1 = table1(best, int(layer_preds.shape[0] - 1))
        best = without_draws(best)
    sim = settings.similarity
    verdicts = pd.concat(
        [
            final_layer_verdicts(
                finals["sime"], "sime", sime_between(ev.ys, sim.include_first), sim.bootstrap, settings.prompts.seed
            ),
            final_layer_verdicts(finals["simw"], "simw", simw_between, sim.bootstrap, settings.prompts.seed),
        ],
        ignore_index=True,
    )
    span = pd.DataFrame()
    if layer_weights is not None:
        layers = span_table(torch.as_tensor(layer_weights), ev.xs[: settings.n_induced], "layer", "index").assign(
            kind="layer"
        )
        span = pd.concat([layers, *span_parts], ignore_index=True)
    clock.lap("similarity")
    return LayerAnalysis(
        None, pd.DataFrame(), cells, best, trends, t1, span, nulls, verdicts, clock.timings, None, induced
    )


def fixed_steps(sweeps) -> tuple[float | None, float | None]:
    """The fixed step sizes the recipe's sweeps use (a planted model's, set by `adapt_recipe`): a
    numeric paper-convention GD eta and a numeric Newton alpha, or None (the spectral references'
    defaults)."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    eta = alpha = None
    for s in sweeps:
        if s.learner == "gd" and s.grid.get("convention", ["paper"]) == ["paper"]:
            eta = next((float(v) for v in s.grid.get("eta", []) if number(v)), eta)
        if s.learner == "newton":
            alpha = next((float(v) for v in s.grid.get("alpha", []) if number(v)), alpha)
    return eta, alpha


def induced_on(layer_weights, ev, settings: LayerSettings, halves=None, queries=None) -> InducedWeights:
    """The induced weights with the n_induced held-out prompts they were induced on (and the fresh
    queries they were induced from)."""
    m = settings.n_induced
    kept = None if queries is None else np.asarray(queries)
    return InducedWeights(np.asarray(layer_weights), ev.xs[:m].numpy(), ev.ys[:m].numpy(), halves, kept)


def layer_spectrum(induced: InducedWeights, settings: LayerSettings) -> SpectralAnalysis:
    """The spectral instrument on each layer's induced weights; `induced.halves`, the weights induced
    from each half of the queries, correct the non-filter share for query noise."""
    xs, ys = torch.as_tensor(induced.xs), torch.as_tensor(induced.ys)
    families = reference_families(xs.shape[-1], *fixed_steps(settings.sweeps), xs=xs)
    return spectral_analysis(
        induced.weights,
        xs,
        ys,
        settings.spectral,
        settings.similarity.bootstrap,
        settings.prompts.seed,
        families,
        halves=induced.halves,
    )


def measure_spectrum(induced: InducedWeights, settings: LayerSettings) -> SpectralAnalysis | NotMeasured:
    """`layer_spectrum`, or why the data at hand cannot support it (a report degrades to "not
    measured"; `icl-probe spectral`, through `analyse_spectrum`, refuses)."""
    try:
        return layer_spectrum(induced, settings)
    except NotMeasurable as e:
        return NotMeasured(str(e), e.knob)


def analyse_spectrum(model, task: TaskConfig, settings: LayerSettings, progress: bool = False) -> SpectralAnalysis:
    """The spectral instrument alone (`icl-probe spectral`, `probe.spectral`): the layers' read-outs
    and induced weights exactly as `analyse_layers` makes them, without the sweeps."""
    check_model(model)
    check_induced_queries(settings.prompts.queries, task.n_dims)
    induced = replace(settings, similarity=replace(settings.similarity, simw=True))  # it always fits them
    check_layer_budget(model, task, induced, (), spectrum=True)
    readouts, ev, _ = fit_readouts(model, task, settings, progress)
    layer_weights, _, halves = induced_layer_weights(model, task, settings, readouts, ev, progress)
    return layer_spectrum(induced_on(layer_weights, ev, settings, halves), settings)
