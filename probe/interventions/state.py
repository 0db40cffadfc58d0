"""The layer map's causal check where the learner's state lives in the context: write a state, resume.

The context patch of probe/interventions/patch.py tests the GD picture (the query accumulates the
prediction, the context feeds every later step). The Newton constructions keep their iterate M_k
in the context instead (the column tokens, or T x_i in the example tokens: `LearnerState` in
probe/models/planted.py), and M_k depends on the x's only, so a patch from prompts that share the
x's moves nothing the map decides. This check writes a state instead: at boundary b, through a
TransformerLens hook, the stored iterate is replaced by M' = alpha S'_t / t of fresh x's (the
construction's M_0 on other prompts), and the remaining layers run on the clean prompt. If
boundary b + lag holds iteration k(b + lag) of a map k (the first prediction to read the state),
the layers after b run K - k(b + lag) more steps from M' (K = k(L)), and the prediction for
x_{t+1} is

    e_k(b) = x_{t+1}^T N^{K - k(b + lag)}(M'; S_t / t) X_t^T y_t / t,    N: M <- 2M - M (S_t / t) M

(Fu et al. 2024, eq. 8 resumed from M'). Effects are read along the change that writing M' with no step
left would make, c = x_{t+1}^T M' X_t^T y_t / t - f_K (f_K: the clean K-step prediction):
observed(b) = sum (f_written(b) - f_clean) c / sum c^2 and expected_k(b) = sum (e_k(b) - f_K) c /
sum c^2, summed over the queries per prompt, so that `compare_maps` compares the claimed map with
its shifted and constant alternatives paired over prompts. Early in the model the remaining steps
wash M' out, late they cannot: the effect grows with depth at the rate the map says. Queries with
t < d examples are left out (S_t is singular there, and a state outside its range is not washed
out but amplified).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor

from ..core.errors import ConfigError
from ..core.seeds import Stream
from ..data.config import TaskConfig
from ..data.tasks import generator_for, sample_prompts
from ..learners.base import prefix_moments
from ..learners.iterative import newton_schulz
from .patch import ContextPatch, boundary_table, compare_maps, named_alternatives
from .runner import Hook, Runner, boundary_hook_name

PICTURE = "state written in the context (Newton's iterate resumed)"


def state_of(runner: Runner):
    """The model's `LearnerState` (where it keeps a matrix iterate), or None."""
    return getattr(runner.model, "learner_state", None)


def source_xs(task: TaskConfig, n_prompts: int, seed: int) -> Tensor:
    """Fresh x's whose M_0 is written into the clean runs (stream Stream.STATE_SOURCE)."""
    return sample_prompts(task, n_prompts, task.n_points, generator=generator_for(seed, Stream.STATE_SOURCE)).xs


def normalised_moments(xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
    """S_t / t (B, n, d, d) and X_t^T y_t / t (B, n, d) per prefix run t (t = 0 gives 0), float64."""
    s, b = prefix_moments(xs.double(), ys.double())
    t = torch.arange(xs.shape[1], dtype=torch.float64).clamp_min(1)
    return s / t.view(1, -1, 1, 1), b / t.view(1, -1, 1)


def state_examples(n: int, d: int, examples: Sequence[int]) -> list[int]:
    """The pooled numbers of examples t with t >= d (a full-rank S_t)."""
    kept = [t for t in examples if d <= t < n]
    if not kept:
        raise ConfigError(f"the state check needs queries after at least d = {d} examples; the prompts have {n} points")
    return kept


def write_hook(runner: Runner, boundary: int, m: Tensor) -> Hook:
    """A hook at `boundary` that replaces the stored iterate by m (B, n, d, d), one matrix per prompt
    and prefix run: each held slot becomes m times the token's source slot (LearnerState.slots)."""
    state, layout = state_of(runner), runner.model.layout
    b, n = m.shape[:2]

    def edit(value: Tensor, hook) -> Tensor:
        h = value.clone().view(b, n, *value.shape[1:])  # (B, runs, T, W): run index = prompt * n + t
        for held, source in state.slots:
            h[..., layout[held]] = torch.einsum("bnts,bnhs->bnth", h[..., layout[source]], m.to(h.dtype))
        return h.view_as(value)

    return boundary_hook_name(boundary, runner.n_layers), edit


class StateEffects:
    """The learner's side of the state check for one map (module docstring): per prompt,
    sum_t (e_k(b) - f_K) c at each tested boundary b, and the normaliser sum_t c^2."""

    def __init__(
        self,
        layer_map: dict,
        lag: int,
        tested: list[int],
        start: Tensor,
        s: Tensor,
        xq: Tensor,
        b: Tensor,
        c: Tensor,
        f_k: Tensor,
    ):
        n_layers = max(layer_map)
        final = int(layer_map[n_layers])
        self.norm = (c**2).sum(1)
        self.remaining = {}
        for boundary in tested:
            steps = max(final - int(layer_map[min(boundary + lag, n_layers)]), 0)
            m = newton_schulz(start, s, steps)
            e = torch.einsum("btd,btde,bte->bt", xq, m, b)
            self.remaining[boundary] = ((e - f_k) * c).sum(1)

    def per_prompt(self, boundary: int) -> Tensor:
        return self.remaining[boundary]

    def expected(self, boundary: int) -> float:
        return float(self.per_prompt(boundary).sum() / self.norm.sum())


def state_map_check(
    runner: Runner,
    xs: Tensor,
    ys: Tensor,
    xs_source: Tensor,
    layer_map: dict,
    examples: Sequence[int],
    n_boot: int = 1000,
    seed: int = 0,
    min_expected: float = 0.05,
) -> tuple[pd.DataFrame, dict]:
    """Write M' of `xs_source` at every boundary where the state is whole, and compare the observed
    effects with the claimed Newton map's and its named alternatives' (shifted +-1, +-2, constant).
    Returns one row per boundary (boundary, k, observed, observed_lo, observed_hi, expected,
    consistency) and compare_maps's summary, with the picture tested named."""
    state = state_of(runner)
    if state is None:
        raise ConfigError("this model does not say where it keeps a learner's state; use the context-patch check")
    n_layers, (_, n, d) = runner.n_layers, xs.shape
    if n_layers not in layer_map:
        raise ConfigError(f"the layer map must include the last boundary {n_layers}")
    if xs_source.shape != xs.shape:
        raise ConfigError(f"source x's {tuple(xs_source.shape)} must have the clean prompts' shape {tuple(xs.shape)}")
    ts = torch.tensor(state_examples(n, d, examples))
    tested = state.boundaries(n_layers)
    alpha = float(runner.model.config.planted_scale)
    s, b = normalised_moments(xs, ys)
    s_src, _ = normalised_moments(xs_source, torch.zeros(xs_source.shape[:2]))
    start_all = alpha * s_src  # (B, n, d, d): the construction's M_0 of the fresh x's, per prefix run
    f_clean = runner.predict(xs, ys).double()[:, ts]
    written = {
        boundary: runner.predict(xs, ys, [write_hook(runner, boundary, start_all.float())]).double()[:, ts]
        for boundary in tested
    }
    s, b, xq, start = s[:, ts], b[:, ts], xs.double()[:, ts], start_all[:, ts]
    f_k = torch.einsum("btd,btde,bte->bt", xq, newton_schulz(alpha * s, s, int(layer_map[n_layers])), b)
    c = torch.einsum("btd,btde,bte->bt", xq, start, b) - f_k
    patched = ContextPatch(ts.tolist(), {bd: ((written[bd] - f_clean) * c).sum(1) for bd in tested}, (c**2).sum(1))

    def effects(m: dict) -> StateEffects:
        return StateEffects(m, state.lag, tested, start, s, xq, b, c, f_k)

    claimed = effects(layer_map)
    held = {b: layer_map[min(b + state.lag, n_layers)] for b in tested}  # the iterate the state holds
    frame = boundary_table(patched, tested, claimed, held, n_boot, seed, min_expected)
    alternatives = {name: effects(m) for name, m in named_alternatives(layer_map, n_layers).items()}
    summary = compare_maps(frame, patched, tested, claimed, alternatives, n_boot, seed, min_expected)
    return frame, {**summary, "picture": PICTURE}
