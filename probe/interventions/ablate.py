"""Ablations: how much the in-context error rises when a component is removed.

Components: every attention head (its output z zeroed, or replaced by its mean over held-out
prompts at each position: mean-ablation), every MLP block (hook_mlp_out zeroed or
mean-replaced) and every layer's whole residual update ("skip": resid_post(l) := resid_pre(l)).
The metric is the evaluation's: squared error / d against the number of in-context examples,
averaged over prompts with a percentile-bootstrap band (probe/analysis/evaluate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from ..analysis.stats import bootstrap_mean
from ..capture import hooks as H
from ..core.progress import tqdm
from ..core.validate import positive_int
from ..data.metrics import error_per_dim
from .runner import Hook, Runner, head_hook, replace_hook, skip_hooks

KINDS = ("zero", "mean", "skip")


@dataclass(frozen=True)
class Component:
    component: str  # "none", "head", "mlp" or "layer"
    layer: int  # -1 for "none"
    head: int  # -1 unless a head
    kind: str  # "none", "zero", "mean" or "skip"


def components(runner: Runner, kinds: tuple[str, ...] = KINDS, heads: bool = True) -> list[Component]:
    """Everything `ablate` can remove from this model, in a stable order."""
    bad = set(kinds) - set(KINDS)
    if bad:
        raise ValueError(f"ablation kinds must be among {KINDS}, got {sorted(bad)}")
    out = [Component("none", -1, -1, "none")]
    for layer in range(runner.n_layers):
        if "skip" in kinds:
            out.append(Component("layer", layer, -1, "skip"))
        for kind in (k for k in kinds if k != "skip"):
            if heads:
                out += [Component("head", layer, h, kind) for h in runner.heads]
            if runner.has_mlp:
                out.append(Component("mlp", layer, -1, kind))
    return out


def _means(runner: Runner, comps: list[Component], xs: Tensor, ys: Tensor) -> dict[str, Tensor]:
    """Mean activations over the held-out prompts, for the mean-ablations asked for."""
    names = sorted({_site(c) for c in comps if c.kind == "mean"})
    if not names:
        return {}
    caught = runner.states(xs, ys, names)
    return {name: runner.prompt_mean(value, xs.shape[0]) for name, value in caught.items()}


def _site(c: Component) -> str:
    return H.head_outputs(c.layer) if c.component == "head" else H.block_output(c.layer, "mlp_out")


def _start(runner: Runner, c: Component) -> int:
    """The first block an ablation of c changes (the unablated run: none)."""
    return runner.n_layers if c.kind == "none" else c.layer


def hooks_for(runner: Runner, c: Component, means: dict[str, Tensor]) -> list[Hook]:
    if c.kind == "none":
        return []
    if c.kind == "skip":
        return skip_hooks([c.layer])
    mean = means.get(_site(c))
    replacement = None if c.kind == "zero" else (lambda value, m=mean: runner.expand_mean(m, value))
    if c.component == "head":
        return [head_hook(c.layer, c.head, replacement)]
    return [replace_hook(_site(c), replacement)]


def ablate(
    runner: Runner,
    xs: Tensor,
    ys: Tensor,
    held_out: tuple[Tensor, Tensor],
    kinds: tuple[str, ...] = KINDS,
    heads: bool = True,
    n_boot: int = 1000,
    seed: int = 0,
    batch_size: int = 256,
    progress: bool = False,
) -> pd.DataFrame:
    """Error / d per component and number of examples: columns component, layer, head, kind,
    n_examples, error, error_lo, error_hi, increase (over the unablated model's error)."""

    batch_size = positive_int(batch_size, "ablation batch_size")
    comps = components(runner, kinds, heads)
    means = _means(runner, comps, *held_out)
    d = xs.shape[-1]
    rows = []
    baseline = None
    batches: list[list[Tensor]] = [[] for _ in comps]
    # a component whose weights make its output exactly zero ablates to the unablated model (comps[0])
    silent = [c.component in ("head", "mlp") and runner.silent(c.layer, c.head if c.head >= 0 else None) for c in comps]
    edits = [(_start(runner, c), hooks_for(runner, c, means)) for c, quiet in zip(comps, silent) if not quiet]
    for s in tqdm(range(0, xs.shape[0], batch_size), desc="ablate", disable=not progress, leave=False):
        ran = iter(runner.predict_each(xs[s : s + batch_size], ys[s : s + batch_size], edits))
        got: list[Tensor] = []
        for quiet in silent:  # comps[0], "none", is never silent
            got.append(got[0] if quiet else next(ran))
        for kept, preds in zip(batches, got):
            kept.append(preds)
    for c, kept in zip(comps, batches):
        err = error_per_dim(torch.cat(kept).double(), ys.double(), d)  # (P, n)
        lo, hi = bootstrap_mean(err, n_boot=n_boot, seed=seed)
        mean = err.mean(0)
        baseline = mean if baseline is None else baseline
        for t in range(err.shape[1]):
            rows.append(
                {
                    "component": c.component,
                    "layer": c.layer,
                    "head": c.head,
                    "kind": c.kind,
                    "n_examples": t,
                    "error": mean[t].item(),
                    "error_lo": lo[t].item(),
                    "error_hi": hi[t].item(),
                    "increase": (mean[t] - baseline[t]).item(),
                }
            )
    return pd.DataFrame(rows)


def summarise_ablation(frame: pd.DataFrame, n_examples: int) -> dict:
    """Per-layer skip error and the most harmful head / MLP at `n_examples` (for summary.json)."""
    at = frame[frame.n_examples == n_examples]
    skip = at[at.kind == "skip"].sort_values("layer")
    worst = at[at.component.isin(["head", "mlp"])].sort_values("increase", ascending=False).head(5)
    base = at[at.component == "none"]
    return {
        "n_examples": int(n_examples),
        "baseline_error": float(base.error.iloc[0]) if len(base) else float("nan"),
        "skip": {"layer": skip.layer.astype(int).tolist(), "error": skip.error.round(6).tolist()},
        "most_harmful": [
            {
                "component": r.component,
                "layer": int(r.layer),
                "head": int(r.head),
                "kind": r.kind,
                "increase": round(float(r.increase), 6),
            }
            for r in worst.itertuples()
        ],
    }


def component_label(row) -> str:
    if row.component == "head":
        return f"L{row.layer}.H{row.head} ({row.kind})"
    if row.component == "mlp":
        return f"L{row.layer}.MLP ({row.kind})"
    if row.component == "layer":
        return f"L{row.layer} skip"
    return "none"


def increase_matrix(frame: pd.DataFrame) -> pd.DataFrame:
    """Components x n_examples table of the error increase (the ablation figure's data)."""
    view = frame[frame.component != "none"].copy()
    view["label"] = [component_label(r) for r in view.itertuples()]
    order = list(dict.fromkeys(view.label))
    return view.pivot_table(index="label", columns="n_examples", values="increase").reindex(order)


__all__ = ["KINDS", "Component", "ablate", "components", "increase_matrix", "summarise_ablation"]
