"""Activation patching through TransformerLens-named hooks, and the causal check of the layer map.

Prompt pairs share the x's and differ in the function: clean (X, y) and corrupted (X, y'), with
y' from a fresh w (or a fresh ReLU network) on the same X (`paired_prompts`).

Patching heatmap (`patching_heatmap`): at each site (the residual stream at a layer boundary,
or a block's attention / MLP output) and each token position p, the clean activation replaces
the corrupted one at p only; the effect is read at the final query x_{q+1} (q examples before it):

    restored(site, p) = sum_prompts (f_patched - f_corr)(f_clean - f_corr) / sum_prompts (f_clean - f_corr)^2,

1 when patching p restores the clean prediction, 0 when it has no effect (a projection of the
change onto the clean-minus-corrupted direction; a ratio of sums, so prompts with tiny changes
do not dominate). Intervals: bootstrap over prompts.

Iteration-consistent patching (`iteration_patching`): the heatmap claims that boundary l holds
learner A after k(l) steps. The protocol tests the picture behind that claim, in which the
query's stream at boundary l already carries A's k(l)-step prediction and the blocks above add
A's remaining progress, k(l) -> k(L), read from the context. Patch, at boundary l, every token
before the query x_{t+1} from the source run (X, y') into the clean run (X, y); the query token
stays clean. Under the picture the patched prediction is

    f_patched = f_clean + [p_A,k(L)(y') - p_A,k(L)(y)] - [p_A,k(l)(y') - p_A,k(l)(y)]        (*)

(A's query prediction from the clean k(l)-th iterate, then the source's remaining increments).
With a_k = p_A,k(y') - p_A,k(y) the expected fraction of the full change is
phi_A(l) = sum (a_k(L) - a_k(l)) a_k(L) / sum a_k(L)^2, the observed one
phi(l) = sum (f_patched - f_clean)(f_src - f_clean) / sum (f_src - f_clean)^2, and the
consistency phi(l) / phi_A(l) is 1 when the model moves exactly as (*) says and 0 when the
patch has no effect. (*) is exact for the planted GD model (its query accumulates the updates
that the example tokens compute). The claimed map is compared, paired over prompts, with named
alternatives: the map shifted by +-1 and +-2 boundaries, a constant map and the other learners'
maps (`compare_maps`). Where the learner's state lives in the context instead (the Newton
constructions keep M_k in column or example tokens and read y from the examples at every layer),
the full context patch transfers the same fraction at every boundary whatever the map: the check
then says it cannot test the map, rather than reading the flat effect as evidence against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..analysis.evaluate import eval_prompts
from ..analysis.matching import run_sweep
from ..analysis.stats import bootstrap_ratio, percentile_interval, resamples
from ..analysis.verdicts import decide, verdict_words
from ..capture import hooks as H
from ..core.errors import ConfigError
from ..core.progress import tqdm
from ..core.seeds import Stream
from ..data.config import TaskConfig
from ..data.tasks import generator_for, relu_network_forward, sample_prompts
from .runner import Runner, boundary_hook_name

SITES = ("resid", "attn_out", "mlp_out")
STREAM = Stream.CORRUPTED  # the corrupted functions' sampling stream


def paired_prompts(
    task: TaskConfig, n_prompts: int, seed: int, n_points: int | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """(xs, ys_clean, ys_corrupted): the evaluation prompts and the same x's under a fresh function."""

    clean = eval_prompts(task, n_prompts, seed, n_points)
    g = generator_for(seed, STREAM)
    other = sample_prompts(task, n_prompts, clean.xs.shape[1], generator=g)
    if other.w is not None:
        ys = torch.einsum("bnd,bd->bn", clean.xs, other.w)
    elif task.name == "relu_network":
        ys = relu_network_forward([other.params[f"layer{j}"] for j in range(len(other.params))], clean.xs)
    else:
        raise ConfigError(
            f"patching needs a task whose function can be redrawn on the same x's; {task.name!r} is not one"
        )
    if task.noise_std > 0:
        ys = ys + task.noise_std * torch.randn(ys.shape, generator=g)
    return clean.xs, clean.ys, ys


def site_name(site: str, layer: int, n_layers: int) -> str:
    """Hook name of a patching site: `layer` is a boundary (0..L) for "resid", a block otherwise."""
    if site == "resid":
        return boundary_hook_name(layer, n_layers)
    if site not in SITES:
        raise ConfigError(f"patching site must be one of {SITES}, got {site!r}")
    if not 0 <= layer < n_layers:
        raise ConfigError(f"block index must lie in 0..{n_layers - 1}, got {layer}")
    return H.block_output(layer, site)


def token_label(position: int) -> str:
    """Interleaved position -> "x3" / "y3" (1-based example index, as in the papers)."""
    return f"{'xy'[position % 2]}{position // 2 + 1}"


def _patches(runner: Runner, names, xs, ys_clean, ys_corrupt, positions, q: int, max_rows: int):
    """(site, layer, name) -> patched predictions (K, B): the residual stream by the runner's
    `patched_resid`, block outputs through hooks with the clean states captured once."""
    masks = torch.zeros(len(positions), xs.shape[1] * 2, dtype=torch.bool)
    masks[torch.arange(len(positions)), torch.tensor(positions)] = True
    boundaries = [layer for site, layer, _ in names if site == "resid"]
    resid = runner.patched_resid(xs, ys_corrupt, ys_clean, boundaries, positions, q, max_rows) if boundaries else {}
    blocks = [name for site, _, name in names if site != "resid"]
    clean_states = runner.states(xs, ys_clean, blocks, query=q) if blocks else {}

    def patched_at(site: str, layer: int, name: str) -> Tensor:
        if site == "resid":
            return resid[layer]
        return runner.patched(name, xs, ys_corrupt, clean_states[name], masks, q, max_rows)

    return patched_at


def patching_heatmap(
    runner: Runner,
    xs: Tensor,
    ys_clean: Tensor,
    ys_corrupt: Tensor,
    sites: tuple[str, ...] = ("resid",),
    query: int | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    max_rows: int = 4096,
    progress: bool = False,
    max_positions: int = 0,
) -> pd.DataFrame:
    """Fraction of the clean prediction at the query restored by patching each site x position.

    Columns: site, layer (boundary for "resid", block otherwise), position, token, restored,
    restored_lo, restored_hi. Positions after the query token cannot affect it and are left out;
    max_positions > 0 keeps only the query token and the max_positions - 1 tokens before it.
    """

    q, sites = _patch_request(runner, xs.shape[1], query, sites)
    f_clean = runner.predict(xs, ys_clean, query=q).double()
    f_corr = runner.predict(xs, ys_corrupt, query=q).double()
    positions = list(range(2 * q + 1))
    if max_positions > 0:
        positions = positions[-max_positions:]
    layers = {s: range(runner.n_layers + 1) if s == "resid" else range(runner.n_layers) for s in sites}
    names = [(s, l, site_name(s, l, runner.n_layers)) for s in sites for l in layers[s]]
    patched_at = _patches(runner, names, xs, ys_clean, ys_corrupt, positions, q, max_rows)
    den = (f_clean - f_corr) ** 2
    rows = []
    for site, layer, name in tqdm(names, desc="patch", disable=not progress, leave=False):
        patched = patched_at(site, layer, name).double()
        num = ((patched - f_corr) * (f_clean - f_corr)).T  # (B, K)
        ratio, lo, hi = bootstrap_ratio(num, den.unsqueeze(1).expand_as(num), n_boot=n_boot, seed=seed)
        for j, p in enumerate(positions):
            rows.append(
                {
                    "site": site,
                    "layer": layer,
                    "position": p,
                    "token": token_label(p),
                    "restored": ratio[j].item(),
                    "restored_lo": lo[j].item(),
                    "restored_hi": hi[j].item(),
                }
            )
    return pd.DataFrame(rows)


def _patch_request(runner: Runner, n: int, query: int | None, sites: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
    """The query index (default n - 1) and the sites the runner has (no mlp_out without MLPs)."""
    q = n - 1 if query is None else int(query)
    if not 0 <= q < n:
        raise ConfigError(f"query must lie in 0..{n - 1} (examples before the query), got {query}")
    bad = set(sites) - set(SITES)
    if bad:
        raise ConfigError(f"patching sites must be among {SITES}, got {sorted(bad)}")
    return q, tuple(s for s in sites if s != "mlp_out" or runner.has_mlp)


def _learner_changes(sweep, xs: Tensor, ys: Tensor, ys_src: Tensor, ks: list) -> dict:
    """a_k = p_A,k(y') - p_A,k(y) (B, n) for every grid value k in ks."""

    if sweep.axis is None:
        raise ConfigError(f"learner sweep {sweep.label!r} has no iteration axis to test a layer map against")
    clean, src = run_sweep(sweep, xs, ys, None), run_sweep(sweep, xs, ys_src, None)
    index: dict = {}
    for i, params in enumerate(clean.grid):
        index.setdefault(params[sweep.axis], i)
    missing = [k for k in ks if k not in index]
    if missing:
        raise ConfigError(f"{sweep.label}: {sweep.axis} {missing} not in the sweep's grid")
    return {k: (src.preds[index[k]] - clean.preds[index[k]]).double().cpu() for k in ks}


def _phi(num: Tensor, den: Tensor) -> float:
    return float(num.sum() / den.sum())


@dataclass
class ContextPatch:
    """Model side of iteration-consistent patching: per boundary, the prompts' (moved . change)
    and change^2 summed over the pooled queries, so that phi(l) = sum num / sum den."""

    examples: list[int]
    num: dict[int, Tensor]  # boundary -> (B,)
    den: Tensor  # (B,)


def context_patching(
    runner: Runner,
    xs: Tensor,
    ys: Tensor,
    ys_src: Tensor,
    boundaries: list[int],
    examples: Sequence[int] | None = None,
    max_rows: int = 4096,
) -> ContextPatch:
    """Patch, at each boundary, every token before each query x_{t+1} from the source run (X, y')
    into the clean run (X, y), the query itself kept clean; pooled over t in `examples` (default 1..n-1)."""
    n_layers, n = runner.n_layers, xs.shape[1]
    ts = list(examples if examples is not None else range(1, n))
    if not ts or min(ts) < 1 or max(ts) >= n:
        raise ConfigError(f"examples must lie in 1..{n - 1}")
    f_clean, f_src = runner.predict(xs, ys).double(), runner.predict(xs, ys_src).double()
    change = (f_src - f_clean)[:, ts]  # (B, T)
    for b in boundaries:
        boundary_hook_name(b, n_layers)  # checks the range
    patched = runner.context_patched(xs, ys, ys_src, list(boundaries), ts, max_rows)
    moved = {b: patched[b].double() - f_clean[:, ts] for b in boundaries}
    return ContextPatch(ts, {b: (moved[b] * change).sum(1) for b in boundaries}, (change**2).sum(1))


def iteration_patching(
    runner: Runner,
    xs: Tensor,
    ys: Tensor,
    ys_src: Tensor,
    sweep,
    layer_map: dict[int, object],
    examples: Sequence[int] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    max_rows: int = 4096,
    min_expected: float = 0.05,
    patched: ContextPatch | None = None,
    others: dict[str, tuple] | None = None,
    skip: Sequence[int] = (),
) -> tuple[pd.DataFrame, dict]:
    """Observed vs expected effect of patching each boundary's context from the source prompts.

    layer_map: boundary -> the iteration (value of sweep.axis) the heatmap matched it to; it must
    include the last boundary L. The expected effect of patching the context at boundary b is what
    resuming the learner from the patched state gives when b holds iteration k = map(b): the
    source's remaining change a_K - a_k (Fu et al. 2024, §4's GD picture: the running prediction lives in
    the query, the context feeds every later step). examples: numbers of examples t before the
    query that are pooled (default 1..n-1). `patched`: a `context_patching` result to reuse (the
    model side does not depend on the map). `others`: other learners' maps, label -> (sweep, map),
    tested as alternatives. `skip`: boundaries left out of every map alike (those whose layer
    predicts ~0: GD's step 0 expects the whole change there, Newton's iteration 0 less, a convention
    and not evidence); the shifted maps still read the claim's counts there. Returns one row per boundary (boundary, k, observed, observed_lo,
    observed_hi, expected, consistency) and a summary: the map's mean |observed - expected|
    (`deviation`) and its paired comparison with each named alternative (`map_alternatives`).
    """
    n_layers = runner.n_layers
    if n_layers not in layer_map:
        raise ConfigError(f"the layer map must include the last boundary {n_layers}")
    tested = sorted(b for b in layer_map if b < n_layers and b not in skip)
    if patched is None:
        patched = context_patching(runner, xs, ys, ys_src, tested, examples, max_rows)
    missing = [b for b in tested if b not in patched.num]
    if missing:
        raise ConfigError(f"boundaries {missing} were not patched")
    claimed = ExpectedEffects(sweep, layer_map, xs, ys, ys_src, patched.examples)
    frame = boundary_table(patched, tested, claimed, {b: layer_map[b] for b in tested}, n_boot, seed, min_expected)
    alternatives = named_alternatives(layer_map, n_layers)
    effects = {name: ExpectedEffects(sweep, m, xs, ys, ys_src, patched.examples) for name, m in alternatives.items()}
    learners = {}  # alternative name -> the other learner's sweep label
    for label, (other_sweep, other_map) in (others or {}).items():
        effects[f"{label} map"] = ExpectedEffects(other_sweep, other_map, xs, ys, ys_src, patched.examples)
        learners[f"{label} map"] = label
    summary = compare_maps(frame, patched, tested, claimed, effects, n_boot, seed, min_expected, learners)
    summary["skipped"] = sorted(b for b in skip if b in layer_map and b < n_layers)
    return frame, summary


def boundary_table(
    patched: ContextPatch, tested: list[int], claimed, ks: dict, n_boot: int, seed: int, min_expected: float
) -> pd.DataFrame:
    """One row per tested boundary: boundary, k (the map's count there, `ks`), the observed effect
    with its bootstrap interval over prompts, the claimed map's expected effect, and their ratio
    (consistency; NaN where less than `min_expected` was expected)."""
    rows = []
    for boundary in tested:
        ratio, lo, hi = bootstrap_ratio(patched.num[boundary], patched.den, n_boot=n_boot, seed=seed)
        exp = claimed.expected(boundary)
        rows.append(
            {
                "boundary": boundary,
                "k": ks[boundary],
                "observed": ratio.item(),
                "observed_lo": lo.item(),
                "observed_hi": hi.item(),
                "expected": exp,
                "consistency": ratio.item() / exp if abs(exp) >= min_expected else float("nan"),
            }
        )
    columns = ["boundary", "k", "observed", "observed_lo", "observed_hi", "expected", "consistency"]
    return pd.DataFrame(rows, columns=columns)


class Effects(Protocol):
    """The learner's side of a map check for one map: per-prompt numerators at each boundary and
    the per-prompt normaliser (ExpectedEffects here, StateEffects in state.py)."""

    norm: Tensor

    def per_prompt(self, boundary: int) -> Tensor: ...

    def expected(self, boundary: int) -> float: ...


class ExpectedEffects:
    """Per prompt, the learner's side of the map check for one map: at boundary b the source's
    change still to come, sum_t (a_K - a_map(b)) a_K, and the normaliser sum_t a_K^2 (both (P,)),
    a_k = p_k(X, y') - p_k(X, y) pooled over the examples t."""

    def __init__(self, sweep, layer_map: dict, xs: Tensor, ys: Tensor, ys_src: Tensor, examples: list[int]):
        n_layers = max(layer_map)
        t_idx = torch.tensor(examples)
        a = _learner_changes(sweep, xs, ys, ys_src, sorted(set(layer_map.values()), key=float))
        final = a[layer_map[n_layers]][:, t_idx]
        self.layer_map = layer_map
        self.norm = (final**2).sum(1)
        self.remaining = {k: ((final - change[:, t_idx]) * final).sum(1) for k, change in a.items()}

    def per_prompt(self, boundary: int) -> Tensor:
        return self.remaining[self.layer_map[boundary]]

    def expected(self, boundary: int) -> float:
        return _phi(self.per_prompt(boundary), self.norm)


def named_alternatives(layer_map: dict, n_layers: int) -> dict[str, dict]:
    """The maps a claimed map is tested against: shifted by -2, -1, +1, +2 boundaries (boundary b
    given the claim's count at b + s, clamped to 0..L) and constant (every boundary below L given
    the claim's count at the middle boundary); the last boundary keeps its count in all of them."""
    out = {}
    for shift in (-2, -1, 1, 2):
        out[f"shifted {shift:+d}"] = {
            b: layer_map[min(max(b + shift, 0), n_layers)] if b < n_layers else layer_map[b] for b in layer_map
        }
    middle = layer_map[sorted(layer_map)[len(layer_map) // 2]]
    out["constant"] = {b: middle if b < n_layers else layer_map[b] for b in layer_map}
    return out


CLAIMED = "claimed map"  # the winner's name when the claimed map wins against an alternative
PICTURE_TOLERANCE = 0.1  # some map must come this close (mean |observed - expected|) for the picture to hold


def compare_maps(
    frame: pd.DataFrame,
    patched: ContextPatch,
    tested: list[int],
    claimed: Effects,
    alternatives: Mapping[str, Effects],
    n_boot: int,
    seed: int,
    min_expected: float,
    learners: Mapping[str, str] | None = None,
) -> dict:
    """The claimed map against each alternative, paired over prompts (`learners`: the sweep label
    of each alternative that is another learner's map, recorded in its row): on every bootstrap resample of
    the prompts, the mean over boundaries of |observed - expected| for both maps (observed and
    expected as ratios of the resample's sums), and their difference (alternative - claim: > 0 when
    the claim fits better). Verdicts as probe/analysis/verdicts.py's; `resolution` is the mean over
    boundaries of |expected(alternative) - expected(claim)|: the most the two maps can differ by. The
    check cannot test a map where the observed effect does not vary across the boundaries (it spans
    less than `min_expected`, or every boundary's interval overlaps every other's: the patched context
    then carries the learner's whole state at every depth, as in the Newton constructions), where no map
    comes within PICTURE_TOLERANCE of the observed effect (the picture does not hold: planted Adam, whose
    query holds the moments and a step's gradient mid-step), nor against an alternative whose
    expectation differs from the claim's by less than `min_expected` at every boundary. A map is
    confirmed when its deviation is within the check's noise floor, the mean half-width of the
    observed effects' intervals (what sampling alone moves them by); where neither map of a
    comparison is, its verdict is "neither map confirmed" whichever deviates less."""
    if frame.empty:
        return {"deviation": float("nan"), "testable": False, "reason": "no boundaries to test", "map_alternatives": []}
    if float(claimed.norm.sum()) == 0:  # e.g. every boundary at GD's 0 steps: the learner ignores y
        return {
            "deviation": float("nan"),
            "testable": False,
            "reason": "the map's last iterate predicts the same for y and y' (nothing to expect)",
            "map_alternatives": [],
        }
    alternatives = {name: e for name, e in alternatives.items() if float(e.norm.sum()) > 0}
    observed = frame.observed.to_numpy()
    deviation = float(abs(observed - frame.expected.to_numpy()).mean())
    num = torch.stack([patched.num[b] for b in tested])  # (Bd, P)
    (idx,) = resamples(num.shape[1], n_boot, seed)
    obs = num[:, idx].sum(-1) / patched.den[idx].sum(-1)  # (Bd, R)

    def deviations(effects: Effects) -> Tensor:
        exp = torch.stack([effects.per_prompt(b) for b in tested])[:, idx].sum(-1) / effects.norm[idx].sum(-1)
        return (obs - exp).abs().mean(0)  # (R,)

    points = {
        name: float(abs(observed - [effects.expected(b) for b in tested]).mean())
        for name, effects in alternatives.items()
    }
    reason = untestable(frame, min([deviation, *points.values()]), min_expected)
    flat = reason is not None
    floor = float(((frame.observed_hi - frame.observed_lo) / 2).mean())
    base = deviations(claimed)
    rows = []
    for name, effects in alternatives.items():
        diff = deviations(effects) - base
        lo, hi = (float(v) for v in percentile_interval(diff.unsqueeze(-1))[:2])
        gap = [abs(effects.expected(b) - claimed.expected(b)) for b in tested]
        resolution = float(sum(gap) / len(gap))
        point = points[name] - deviation
        testable = not (flat or max(gap) < min_expected)
        confirmed = deviation <= floor or points[name] <= floor
        winner = decide(lo, hi, resolution, CLAIMED, name, testable) if confirmed else None
        rows.append(
            {
                "alternative": name,
                "difference": point,
                "ci_low": lo,
                "ci_high": hi,
                "resolution": resolution,
                "learner": (learners or {}).get(name),
                "testable": testable,
                "alternative_deviation": points[name],
                "confirmed": confirmed,
                "winner": winner,
                "verdict": verdict_words(winner, testable, confirmed),
            }
        )
    return {
        "deviation": deviation,
        "noise_floor": floor,
        "confirmed": deviation <= floor,
        "testable": not flat,
        "reason": reason,
        "map_alternatives": rows,
    }


def untestable(frame: pd.DataFrame, closest: float, min_expected: float) -> str | None:
    """Why the map check cannot test any map here (compare_maps), or None: the observed effect is
    flat over the boundaries, or no map (`closest`: the smallest mean |observed - expected|) comes
    within PICTURE_TOLERANCE of it."""
    spread = float(frame.observed.max() - frame.observed.min())
    if len(frame) > 1 and (spread < min_expected or float(frame.observed_lo.max()) <= float(frame.observed_hi.min())):
        return (
            f"patching the context moves the prediction by the same fraction at every boundary "
            f"({frame.observed.min():.2f}-{frame.observed.max():.2f}): the context carries the state at every depth"
        )
    if closest > PICTURE_TOLERANCE:
        return (
            f"no map fits the picture this check assumes (the query accumulating the learner's prediction, the context "
            f"feeding the rest): the closest of the claimed and alternative maps deviates by {closest:.3f}"
        )
    return None


def spread_examples(n: int, most: int) -> list[int]:
    """At most `most` numbers of examples t in 1..n-1, evenly spread (all of them when most <= 0)."""
    ts = list(range(1, n))
    if most <= 0 or len(ts) <= most:
        return ts
    return sorted({int(v + 0.5) for v in np.linspace(1, n - 1, most)})
