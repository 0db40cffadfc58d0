"""The probe study of a report (Akyurek et al. 2023, §5, App. C.8): every layer x prefix x target x kind,
trained on one set of prompts and tested on another, beside its two controls: the same probes on a
random-weights model of the architecture (`random_model`) and on targets shuffled across prompts
(`shuffled`; fitted in one grid with the model's own probes, on the same streams, so that every read
of them serves both). The probes themselves are probe/analysis/probes.py's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..capture.stream_store import StreamReader
from ..capture.streams import LayerStreams, by_position_streams
from ..core import budget
from ..core.allocator import release_free_memory
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.memory import MemoryBudget
from ..core.progress import tqdm
from ..core.seeds import Stream, stream_generator
from ..core.validate import check_device, check_model, positive_int
from ..data.tasks import sample_prompts
from ..models.sizes import shape_of
from .probes import ALPHAS, FTOL, GTOL, HIDDEN, MAX_ITER, R2_DRAWS, fit_probe_grids, probe_dtype, probe_targets
from .verdicts import decide

PROBE_KINDS = ("linear", "mlp")
PROBE_TARGETS = ("xty", "w_ols", "xtx")
DEFAULT_PROBE_TARGETS = ("xty", "w_ols")


@dataclass
class ProbeSettings(Section):
    """Attention-pooled probes (probe/analysis/probe_study.py): recipe section [probes],
    `icl-probe probes` flags. The prompts' seed and test-set size come from [prompts]."""

    SECTION = "probes"

    enabled: bool = setting(True, "run the probes in reports")
    kinds: tuple[str, ...] = setting(PROBE_KINDS, "probe kinds", PROBE_KINDS, nonempty=True, noun="probe kind")
    targets: tuple[str, ...] = setting(
        DEFAULT_PROBE_TARGETS,
        "probe targets: X^T y, w_OLS and (xtx) S = X^T X / t of the prefix",
        PROBE_TARGETS,
        nonempty=True,
        noun="target",
    )
    prefixes: tuple[int, ...] | None = setting(
        None, "prefix lengths t probed (none: 1, d, 2d and n-1 below n)", nonempty=True
    )
    alphas: tuple[float, ...] = setting(
        ALPHAS,
        "ridge penalties of the probes' heads, as fractions of the features' mean eigenvalue; chosen per probe "
        "by leave-one-out",
        nonempty=True,
    )
    hidden: int = setting(HIDDEN, "width of the MLP probes' GELU layer")
    mlp_head: str = setting(
        "random",
        "the MLP probes' hidden layer: trained as a two-layer network (weight decay and start chosen on a "
        "validation share; about 5x the probes' time) or random features only",
        ("trained", "random"),
    )
    max_iter: int = setting(MAX_ITER, "the most L-BFGS iterations per round of a probe's pooling fit")
    gtol: float = setting(GTOL, "a pooling fit has converged when |gradient|_inf is at most this")
    ftol: float = setting(
        FTOL, "a pooling fit has also converged when an iteration lowers the objective by at most this"
    )
    prompts: int = setting(512, "training prompts (penalties by leave-one-out on them)", minimum=3)
    controls: bool = setting(True, "random-weights model and shuffled-target controls")
    precision: str = setting(
        "float64",
        "the hidden states' precision (the probes' heads and objective are float64): float32 halves their memory",
        ("float64", "float32"),
    )

    def check_for(self, n_points: int) -> None:
        """The prefixes against a task's prompt length (known only with a model): 1..n_points - 1."""
        if self.prefixes and (min(self.prefixes) < 1 or max(self.prefixes) >= n_points):
            raise ConfigError(
                f"probes.prefixes must lie in 1..{n_points - 1} (examples before a query; the prompts have "
                f"{n_points} points), got {list(self.prefixes)}"
            )


def default_prefixes(n_dims: int, n_points: int) -> tuple[int, ...]:
    return tuple(sorted({t for t in (1, n_dims, 2 * n_dims, n_points - 1) if 1 <= t < n_points}))


def probe_study(
    model,
    task,
    settings: ProbeSettings,
    n_test: int = 256,
    seed: int = 0,
    device: str = "cpu",
    control_model=None,
    progress: bool = False,
    memory: MemoryBudget | None = None,
    n_boot: int = 1000,
    streams: StreamReader | None = None,
) -> pd.DataFrame:
    """Probes for every layer x prefix x target x kind on `model`, tested on `n_test` held-out prompts,
    with the controls of the module docstring (`random_model` needs `control_model`; column `control`);
    R^2 intervals over `n_boot` resamples of the test prompts (column R2_DRAWS, for `probe_intervals`).
    `streams`: the report's stream store, which keeps the model's float64 streams for the token probes."""
    check_model(model)
    device, n_test = check_device(device), positive_int(n_test, "probe test prompts")
    budget.check(budget.probe_estimates(shape_of(model), task.n_points, settings, n_test))
    settings.check_for(task.n_points)
    prefixes = settings.prefixes or default_prefixes(task.n_dims, task.n_points)
    combos = [(t, target) for t in prefixes for target in settings.targets]
    train = sample_prompts(task, settings.prompts, generator=stream_generator(seed, Stream.PROBE_TRAIN))
    test = sample_prompts(task, n_test, generator=stream_generator(seed, Stream.PROBE_TEST))
    targets_train = {k: probe_targets(train.xs, train.ys, k) for k in settings.targets}
    targets_test = {k: probe_targets(test.xs, test.ys, k) for k in settings.targets}
    # one grid per target width (a grid stacks its targets): X^T y and w_OLS have d, S has d (d + 1) / 2
    width = {k: v.shape[-1] for k, v in targets_train.items()}
    groups = [[c for c in combos if width[c[1]] == w] for w in dict.fromkeys(width[t] for _, t in combos)]
    perm = torch.randperm(settings.prompts, generator=stream_generator(seed, Stream.SHUFFLE))
    shuffled = {k: v[perm] for k, v in targets_train.items()}
    release_free_memory()  # the targets' least-squares temporaries (~0.4 GB at d = 20) before the streams
    models = [("none", model, streams)] + (
        [("random_model", control_model, None)] if settings.controls and control_model is not None else []
    )
    fit, dtype, frames = _fit_options(settings, seed, device), probe_dtype(settings.precision), []
    blocks = layer_blocks(model, settings.prompts, task.n_points, dtype, device)
    fits = len(models) * (2 if settings.controls else 1) * len(blocks)
    bar = tqdm(total=fits, desc="probes", disable=not progress, leave=False)
    for control, m, own in models:  # one model's streams at a time, a block of layers at a time
        for first, train_states, test_streams in _streams_by_block(m, train, test, blocks, device, dtype, memory, own):
            targets = {control: targets_train}
            if control == "none" and settings.controls:
                targets["shuffled"] = shuffled
            grids = _fit_block(train_states, targets, groups, settings.kinds, fit)
            del train_states
            release_free_memory()  # the fits' temporaries before the test streams
            test_states = test_streams()
            for name, per_width in grids:
                for group, grid in enumerate(per_width):
                    scored = grid.score(test_states, targets_test, n_boot, seed)
                    frames.append(scored.assign(layer=scored.layer + first, control=name, group=group))
                bar.update()
            del test_states, grids
            release_free_memory()  # this block's fit temporaries leave the heap before the next streams
    bar.close()
    return _in_grid_order(pd.concat(frames, ignore_index=True), [name for name, _, _ in models], settings)


def _fit_options(settings: ProbeSettings, seed: int, device: str) -> dict[str, Any]:
    """`fit_probe_grid`'s options from the probe settings (layer-major streams)."""
    return {
        "alphas": settings.alphas,
        "hidden": settings.hidden,
        "max_iter": settings.max_iter,
        "gtol": settings.gtol,
        "ftol": settings.ftol,
        "seed": seed,
        "device": device,
        "precision": settings.precision,
        "mlp_head": settings.mlp_head,
        "layout": "lpnd",
    }


def _fit_block(train_states, targets: dict[str, dict], groups, kinds, fit: dict[str, Any]) -> list[tuple[str, list]]:
    """(control, one fitted grid per target width) for each set of training targets (the model's own
    and, where the controls are on, the shuffled ones), all on one block's training streams: the
    sets fitted as one grid per width (`fit_probe_grids`), the last of which centres the streams in place."""
    per_width = []
    for i, g in enumerate(groups):
        last = i == len(groups) - 1
        per_width.append(fit_probe_grids(train_states, targets, g, kinds, overwrite_states=last, **fit))
        release_free_memory()  # the fit's temporaries before the next fit on the same streams
    return [(name, [grids[name] for grids in per_width]) for name in targets]


PROBE_BLOCK_BYTES = 192 << 20  # the training streams of the layers the probes fit at once (float64, GPT-2)
DEVICE_BLOCK_BYTES = 4 << 30  # the same on a GPU, where the blocks are held (each block is a run of L-BFGS)


def layer_blocks(model, n_prompts: int, n_points: int, dtype: torch.dtype, device: str = "cpu") -> list[slice]:
    """The blocks of layer boundaries the probes are fitted a block at a time: on models that resume
    a forward from a layer (`LayerStreams`: GPT-2) with float64 streams, as many boundaries as
    PROBE_BLOCK_BYTES of training streams hold in host memory (at Garg et al.'s standard shape, 512
    prompts: 2 of its 13 boundaries), or DEVICE_BLOCK_BYTES on a GPU (there all 13: one block, one
    run of each fit, instead of 7); otherwise every boundary at once (`by_position_streams`). Each
    probe's fit reads its own layer alone, so the fits are the same in blocks to the round-off of the
    batched products (a batch of fewer probes can take another kernel: on an AVX-512 CPU penalties
    moved by ~6e-10 relative, iterations and convergence equal) and R^2 the same to ~1e-12."""
    boundaries = model.n_layers + 1
    if not _streams_by_layer(model, dtype):
        return [slice(0, boundaries)]
    per_boundary = 2 * n_points * n_prompts * model.d_model * 8
    size = max(1, (PROBE_BLOCK_BYTES if device == "cpu" else DEVICE_BLOCK_BYTES) // per_boundary)
    return [slice(lo, min(boundaries, lo + size)) for lo in range(0, boundaries, size)]


def _streams_by_layer(model, dtype: torch.dtype) -> bool:
    """Whether the probes' streams are made a block of layers at a time (`LayerStreams`): float64
    streams of a model that resumes a forward from a layer."""
    return dtype == torch.float64 and bool(getattr(model, "key_value_cache", False))


def _streams_by_block(
    model, train, test, blocks: list[slice], device: str, dtype: torch.dtype, memory, streams: StreamReader | None
):
    """Per block of `layer_blocks`: (its first boundary, its training streams (k, 2n, N, D), a
    function giving its test streams), the training streams made before the test streams are asked
    for, so a block's fits never hold both; `streams`: the report's stream store (`LayerStreams` `share`)."""
    if not _streams_by_layer(model, dtype):
        yield (
            0,
            by_position_streams(model, train.xs, train.ys, device, dtype=dtype, memory=memory),
            (lambda: by_position_streams(model, test.xs, test.ys, device, dtype=dtype, memory=memory)),
        )
        return
    shares = [
        None if streams is None else streams.share(s, len(p.xs))
        for s, p in ((Stream.PROBE_TRAIN, train), (Stream.PROBE_TEST, test))
    ]
    trains = LayerStreams(model, train.xs, train.ys, device, share=shares[0], blocks_on_device=True)
    tests = LayerStreams(model, test.xs, test.ys, device, share=shares[1], blocks_on_device=True)

    def test_block(rows: slice) -> torch.Tensor:
        trains.release()  # the block's fits are done: its training streams go before its test streams come
        return tests[rows]

    for rows in blocks:
        yield rows.start, trains[rows], (lambda rows=rows: test_block(rows))
        tests.release()


def _in_grid_order(table: pd.DataFrame, controls: list[str], settings: ProbeSettings) -> pd.DataFrame:
    """The blocks' rows in the order one grid of every layer gives them: by control (the model, its
    shuffled targets, the random-weights model), target width group, kind, layer; within those, the
    (prefix, target) pairs in their order."""
    rank = {name: i for i, name in enumerate([controls[0], "shuffled", *controls[1:]])}
    kinds = {kind: i for i, kind in enumerate(settings.kinds)}
    keys = pd.DataFrame({"c": table.control.map(rank), "g": table.group, "k": table.kind.map(kinds), "l": table.layer})
    order = keys.sort_values(["c", "g", "k", "l"], kind="stable").index
    return table.loc[order].drop(columns="group").reset_index(drop=True)


LEVEL = 0.90


def probe_intervals(table: pd.DataFrame) -> dict[str, Any]:
    """From the model's own probes (control "none") and their R2_DRAWS, paired over resamples of
    the test prompts: per target and kind the 90% interval of R^2 by layer (mean over prefixes)
    and of the best layer; per kind and pair of targets, the best layer of the second minus that
    of the first with its interval, and `earlier`: the target decoded at an earlier layer on at
    least 95% of resamples (the interval excludes 0), else None. JSON-ready."""
    own = table[table.control == "none"]
    q = [(1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100]
    fits: dict[str, dict[str, Any]] = {}
    best_draws: dict[tuple[str, str], tuple[int, np.ndarray]] = {}
    for (target, kind), rows in own.groupby(["target", "kind"], sort=False):
        layers = sorted(rows.layer.unique())
        by_layer = np.stack(
            [np.mean(np.stack(list(rows[rows.layer == l][R2_DRAWS])), axis=0) for l in layers], axis=-1
        )  # (R, layers)
        point = rows.groupby("layer").r2.mean().reindex(layers).to_numpy()
        best = np.asarray(layers)[by_layer.argmax(-1)]
        best_draws[(target, kind)] = (int(layers[int(np.nanargmax(point))]), best)
        low, high = np.percentile(best, q, method="nearest")
        fits.setdefault(target, {})[kind] = {
            "r2_low": [float(v) for v in np.percentile(by_layer, q[0], axis=0)],
            "r2_high": [float(v) for v in np.percentile(by_layer, q[1], axis=0)],
            "best_layer_low": int(low),
            "best_layer_high": int(high),
        }
    order = []
    targets = list(dict.fromkeys(own.target))
    for kind in dict.fromkeys(own.kind):
        for i, first in enumerate(targets):
            for then in targets[i + 1 :]:
                if (first, kind) not in best_draws or (then, kind) not in best_draws:
                    continue
                (p1, d1), (p2, d2) = best_draws[(first, kind)], best_draws[(then, kind)]
                diff = d2 - d1
                low, high = np.percentile(diff, q, method="nearest")
                earlier = decide(low, high, math.inf, first, then)  # the paired rule, no resolution bound
                order.append(
                    {
                        "kind": kind,
                        "first": first,
                        "then": then,
                        "difference": p2 - p1,
                        "ci_low": int(low),
                        "ci_high": int(high),
                        "earlier": earlier,
                    }
                )
    return {"fits": fits, "order": order}
