"""Activation patching through TransformerLens hooks, and the causal check of the layer map.

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
that the example tokens compute). Null: the same comparison for the map with its iteration
counts shuffled across layers (`deviation` vs `null_deviation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..analysis.matching import run_sweep
from ..capture import hooks as H
from ..config import TaskConfig
from ..errors import ConfigError
from ..evaluate import eval_prompts
from ..seeds import Stream
from ..settings import PATCH_SITES
from ..stats import bootstrap_ratio
from ..tasks import generator_for, relu_network_forward, sample_prompts
from .runner import Runner, boundary_hook_name, patch_hook

SITES = PATCH_SITES
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


def _patched_predictions(
    runner: Runner, name: str, xs: Tensor, ys_target: Tensor, source: Tensor, masks: Tensor, query: int, max_rows: int
) -> Tensor:
    """Predictions (K, B) for y_{query+1} of the target run with `source` (states captured with the
    same `query`) patched in where masks[k] (2n,) is true; K copies batched, max_rows at a time."""
    b = xs.shape[0]
    step = max(1, max_rows // b)
    out = []
    for start in range(0, masks.shape[0], step):
        m = masks[start : start + step]
        k = m.shape[0]
        hook = patch_hook(name, runner.stream_mask(m, b, query), source.repeat(k, *([1] * (source.dim() - 1))))
        out.append(runner.predict(xs.repeat(k, 1, 1), ys_target.repeat(k, 1), [hook], query).view(k, b))
    return torch.cat(out)


def token_label(position: int) -> str:
    """Interleaved position -> "x3" / "y3" (1-based example index, as in the papers)."""
    return f"{'xy'[position % 2]}{position // 2 + 1}"


def _hooked_patches(runner: Runner, names, resumed: dict, xs, ys_clean, ys_corrupt, positions, q: int, max_rows: int):
    """(site, layer, name) -> patched predictions (K, B): from `resumed` (the runner's hook-free
    residual path) where it has the layer, else through hooks with the clean states captured once."""
    masks = torch.zeros(len(positions), xs.shape[1] * 2, dtype=torch.bool)
    masks[torch.arange(len(positions)), torch.tensor(positions)] = True
    hooked = [name for site, layer, name in names if not (site == "resid" and layer in resumed)]
    clean_states = runner.states(xs, ys_clean, hooked, query=q) if hooked else {}

    def patched_at(site: str, layer: int, name: str) -> Tensor:
        if name in clean_states:
            return _patched_predictions(runner, name, xs, ys_corrupt, clean_states[name], masks, q, max_rows)
        return resumed[layer]

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
    resumed = (
        runner.patched_resid(xs, ys_corrupt, ys_clean, list(layers["resid"]), positions, q)
        if "resid" in sites
        else None
    )
    patched_at = _hooked_patches(runner, names, resumed or {}, xs, ys_clean, ys_corrupt, positions, q, max_rows)
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
    names = {b: boundary_hook_name(b, n_layers) for b in boundaries}
    resumed = runner.context_patched(xs, ys, ys_src, list(boundaries), ts)
    if resumed is not None:
        moved = {b: resumed[b].double() - f_clean[:, ts] for b in boundaries}
        return ContextPatch(ts, {b: (moved[b] * change).sum(1) for b in boundaries}, (change**2).sum(1))
    moved = {b: torch.zeros_like(change) for b in boundaries}
    for j, t in enumerate(ts):  # query x_{t+1}: every token before it comes from the source
        mask = (torch.arange(2 * n) < 2 * t).view(1, -1)
        src_states = runner.states(xs, ys_src, list(names.values()), query=t)
        for boundary, name in names.items():
            patched = _patched_predictions(runner, name, xs, ys, src_states[name], mask, t, max_rows)[0].double()
            moved[boundary][:, j] = patched - f_clean[:, t]
    num = {b: (moved[b] * change).sum(1) for b in boundaries}
    return ContextPatch(ts, num, (change**2).sum(1))


def iteration_patching(
    runner: Runner,
    xs: Tensor,
    ys: Tensor,
    ys_src: Tensor,
    sweep,
    layer_map: dict[int, object],
    examples: Sequence[int] | None = None,
    n_boot: int = 1000,
    n_perm: int = 200,
    seed: int = 0,
    max_rows: int = 4096,
    min_expected: float = 0.05,
    patched: ContextPatch | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Observed vs expected effect of patching each boundary's context from the source prompts.

    layer_map: boundary -> the iteration (value of sweep.axis) the heatmap matched it to; it must
    include the last boundary L. examples: numbers of examples t before the query that are
    pooled (default 1..n-1). `patched`: a `context_patching` result to reuse (the model side
    does not depend on the map). Returns one row per boundary (boundary, k, observed,
    observed_lo, observed_hi, expected, consistency) and a summary with the map's mean
    |observed - expected| against the same for shuffled maps.
    """
    n_layers = runner.n_layers
    if n_layers not in layer_map:
        raise ConfigError(f"the layer map must include the last boundary {n_layers}")
    tested = sorted(b for b in layer_map if b < n_layers)
    if patched is None:
        patched = context_patching(runner, xs, ys, ys_src, tested, examples, max_rows)
    missing = [b for b in tested if b not in patched.num]
    if missing:
        raise ConfigError(f"boundaries {missing} were not patched")
    t_idx = torch.tensor(patched.examples)
    a = _learner_changes(sweep, xs, ys, ys_src, sorted(set(layer_map.values()), key=float))
    final = a[layer_map[n_layers]][:, t_idx]

    def expected(k) -> float:
        return _phi((final - a[k][:, t_idx]) * final, final**2)

    rows = []
    for boundary in tested:
        ratio, lo, hi = bootstrap_ratio(patched.num[boundary], patched.den, n_boot=n_boot, seed=seed)
        exp = expected(layer_map[boundary])
        rows.append(
            {
                "boundary": boundary,
                "k": layer_map[boundary],
                "observed": ratio.item(),
                "observed_lo": lo.item(),
                "observed_hi": hi.item(),
                "expected": exp,
                "consistency": ratio.item() / exp if abs(exp) >= min_expected else float("nan"),
            }
        )
    frame = pd.DataFrame(rows)
    return frame, _shuffle_null(frame, layer_map, expected, n_perm, seed)


def spread_examples(n: int, most: int) -> list[int]:
    """At most `most` numbers of examples t in 1..n-1, evenly spread (all of them when most <= 0)."""
    ts = list(range(1, n))
    if most <= 0 or len(ts) <= most:
        return ts
    return sorted({int(v + 0.5) for v in np.linspace(1, n - 1, most)})


def _shuffle_null(frame: pd.DataFrame, layer_map: dict, expected, n_perm: int, seed: int) -> dict:
    """Mean |observed - expected| for the claimed map and for maps with shuffled iteration counts."""
    if frame.empty:
        return {"deviation": float("nan"), "null_deviation": float("nan"), "p_value": float("nan")}
    observed = frame.observed.to_numpy()
    rng = np.random.default_rng(seed)
    ks = [layer_map[b] for b in frame.boundary]
    cache = {k: expected(k) for k in set(ks)}

    def deviation(order) -> float:
        return float(np.mean(np.abs(observed - np.array([cache[k] for k in order]))))

    claimed = deviation(ks)  # computed as the shuffled maps are, so a map equal to the claim ties exactly
    null = np.array([deviation(rng.permutation(ks)) for _ in range(n_perm)])
    ties = null <= claimed + 1e-9 * max(abs(claimed), 1e-12)  # a tie counts against the claim, round-off or not
    return {
        "deviation": claimed,
        "null_deviation": float(null.mean()),
        "p_value": float((ties.sum() + 1) / (n_perm + 1)),
    }
