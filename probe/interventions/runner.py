"""Run a transformer with TransformerLens-named hooks that edit its activations, for either layout.

GPT-2 family models run their own forward, one sequence per prompt (tokens x_1, y_1, ..., x_n,
y_n), with functions on its hook points (probe/models/hooked.py);
planted models run one sequence per prefix (probe/models/planted.py, `_Sites`), where
token position 2i (x_{i+1}, the query of run i) is the last token of run i and position 2i+1
(the example (x_{i+1}, y_{i+1})) is example slot i of every later run. A `Runner` hides that
difference: interventions are written once, with hook functions on the native layout, and
token masks over the 2n interleaved positions are translated by `stream_mask`.

Layer boundaries are numbered as in probe/capture/hooks.py (0 = embeddings, l = after block l).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from ..capture import hooks as H
from ..core.errors import ConfigError
from ..core.registry import Registry
from ..core.validate import check_device
from ..data.positions import X_TOKENS, Y_TOKENS, keys_before, prefix_mask
from .edits import Hook, patch_hook
from .resumed import context_patch_predictions, patched_resid_predictions


class Runner:
    """Predictions of a transformer under a list of TransformerLens forward hooks.

    With `query=t` only what the prediction for y_{t+1} depends on is run (the first t+1 points
    of a GPT-2 prompt; the one prefix run t of a planted model) and predictions are (B,);
    `states` and `stream_mask` must then be called with the same `query`."""

    model: Any  # the model the hooks edit
    n_layers: int
    heads: list[int]  # attention heads that can be ablated
    has_mlp: bool

    def predict(self, xs: Tensor, ys: Tensor, hooks: Sequence[Hook] = (), query: int | None = None) -> Tensor:
        raise NotImplementedError

    def states(
        self, xs: Tensor, ys: Tensor, names: list[str], hooks: Sequence[Hook] = (), query: int | None = None
    ) -> dict[str, Tensor]:
        """Activations at `names` in the native layout (after `hooks` have edited the run)."""
        caught: dict[str, Tensor] = {}

        def keep(value: Tensor, hook, name: str) -> None:
            caught[name] = value.detach().clone()

        self.predict(xs, ys, [*hooks, *[(name, _bind(keep, name=name)) for name in names]], query)
        return caught

    def patched(
        self, name: str, xs: Tensor, ys_target: Tensor, source: Tensor, masks: Tensor, query: int, max_rows: int
    ) -> Tensor:
        """Predictions (K, B) for y_{query+1} of the target run with `source` (states at hook `name`
        captured with the same `query`) patched in where masks[k] (2n,) is true, through a hook; K
        copies batched, max_rows rows at a time."""
        b = xs.shape[0]
        step = max(1, max_rows // b)
        out = []
        for start in range(0, masks.shape[0], step):
            m = masks[start : start + step]
            k = m.shape[0]
            hook = patch_hook(name, self.stream_mask(m, b, query), source.repeat(k, *([1] * (source.dim() - 1))))
            out.append(self.predict(xs.repeat(k, 1, 1), ys_target.repeat(k, 1), [hook], query).view(k, b))
        return torch.cat(out)

    def patched_resid(
        self,
        xs: Tensor,
        ys_target: Tensor,
        ys_source: Tensor,
        boundaries: list[int],
        positions: list[int],
        query: int,
        max_rows: int = 4096,
    ) -> dict[int, Tensor]:
        """boundary -> (K, B) predictions for y_{query+1} of the target run with the source run's
        residual stream patched in at positions[k] (GPT2Runner: the blocks above the boundary
        resumed on the tokens the patch can change; probe/interventions/resumed.py)."""
        masks = torch.zeros(len(positions), xs.shape[1] * 2, dtype=torch.bool)
        masks[torch.arange(len(positions)), torch.tensor(positions)] = True
        names = {b: boundary_hook_name(b, self.n_layers) for b in boundaries}
        source = self.states(xs, ys_source, list(names.values()), query=query)
        return {b: self.patched(name, xs, ys_target, source[name], masks, query, max_rows) for b, name in names.items()}

    def context_patched(
        self,
        xs: Tensor,
        ys: Tensor,
        ys_source: Tensor,
        boundaries: list[int],
        examples: list[int],
        max_rows: int = 4096,
    ) -> dict[int, Tensor]:
        """boundary -> (B, T) predictions for y_{t+1}, t in `examples`, of the clean run with every
        token before the query x_{t+1} taken from the source run at the boundary (GPT2Runner: only
        the query token recomputed, resumed.py)."""
        n = xs.shape[1]
        names = {b: boundary_hook_name(b, self.n_layers) for b in boundaries}
        out = {b: torch.zeros(xs.shape[0], len(examples)) for b in boundaries}
        for j, t in enumerate(examples):
            mask = keys_before(torch.tensor([2 * t]), 2 * n)  # every token before the query x_{t+1}
            source = self.states(xs, ys_source, list(names.values()), query=t)
            for b, name in names.items():
                out[b][:, j] = self.patched(name, xs, ys, source[name], mask, t, max_rows)[0]
        return out

    def predict_each(self, xs: Tensor, ys: Tensor, edits: Sequence[tuple[int, Sequence[Hook]]]) -> list[Tensor]:
        """Predictions (B, n) under each edit (start, hooks), whose hooks change nothing below block
        `start`: one hooked run each (GPT2Runner: one unedited run, then the blocks from `start`
        resumed with the hooks attached)."""
        return [self.predict(xs, ys, hooks) for _, hooks in edits]

    def stream_mask(self, token_mask: Tensor, n_prompts: int, query: int | None = None) -> Tensor:
        """A (K, 2n) boolean mask over interleaved positions, for K copies of n_prompts prompts
        stacked copy-major, as a mask broadcastable to the native stream (K*B..., T, 1)."""
        raise NotImplementedError

    def native_values(self, values: Tensor, query: int) -> Tensor:
        """Per-token values (B, P, D) on the first P interleaved positions, laid out like the native
        stream of a run stopping at the prediction for x_{query+1} (zeros elsewhere)."""
        raise NotImplementedError

    def prompt_mean(self, value: Tensor, n_prompts: int) -> Tensor:
        """Mean over prompts of a native-layout activation, kept per position (and per run)."""
        raise NotImplementedError

    def silent(self, layer: int, head: int | None = None) -> bool:
        """Whether the weights make this head's (or, head None, the MLP's) output exactly zero on
        every input, so that ablating it changes nothing."""
        return False

    def expand_mean(self, mean: Tensor, like: Tensor) -> Tensor:
        """`prompt_mean`'s result broadcast back to a native-layout activation of any batch."""
        raise NotImplementedError


def _bind(fn: Callable, **kwargs) -> Callable:

    return partial(fn, **kwargs)


class GPT2Runner(Runner):
    """GPT-2 family: its forward with hook functions attached; ablation and residual patching resume
    the blocks from the edited boundary instead (`resumed=False`: through hooks as well)."""

    def __init__(self, model, device: str, resumed: bool = True):

        self.model = model.to(device)
        self.n_layers = model.n_layers
        self.heads = list(range(model.config.n_head))
        self.has_mlp = True
        self.device = device
        self.resumed = resumed

    def patched_resid(self, xs, ys_target, ys_source, boundaries, positions, query, max_rows=4096):
        if not self.resumed:
            return super().patched_resid(xs, ys_target, ys_source, boundaries, positions, query, max_rows)

        moved = (z.to(self.device) for z in (xs, ys_target, ys_source))
        out = patched_resid_predictions(self.model, *moved, boundaries, positions, query)
        return {b: p.float().cpu() for b, p in out.items()}

    @torch.no_grad()
    def predict_each(self, xs, ys, edits):
        if not self.resumed:
            return super().predict_each(xs, ys, edits)
        model = self.model
        streams = model.run(xs.to(self.device), ys.to(self.device)).resid
        out = []
        for start, hooks in edits:
            with model.hooks(list(hooks)):
                final = model.resume(streams[start], start)
            out.append(model.lens(final[:, X_TOKENS]).float().cpu())
        return out

    def context_patched(self, xs, ys, ys_source, boundaries, examples, max_rows=4096):
        if not self.resumed:
            return super().context_patched(xs, ys, ys_source, boundaries, examples, max_rows)

        moved = (z.to(self.device) for z in (xs, ys, ys_source))
        out = context_patch_predictions(self.model, *moved, boundaries, examples)
        return {b: p.float().cpu() for b, p in out.items()}

    @torch.no_grad()
    def predict(self, xs: Tensor, ys: Tensor, hooks: Sequence[Hook] = (), query: int | None = None) -> Tensor:
        if query is not None:  # causal: the first query + 1 points are all the prediction depends on
            xs, ys = xs[:, : query + 1], ys[:, : query + 1]
        preds = self.model.run_with_hooks(xs.to(self.device), ys.to(self.device), list(hooks)).pred.float().cpu()
        return preds if query is None else preds[:, query]

    def stream_mask(self, token_mask: Tensor, n_prompts: int, query: int | None = None) -> Tensor:
        if query is not None:
            token_mask = token_mask[:, : 2 * query + 2]
        return token_mask.repeat_interleave(n_prompts, dim=0).unsqueeze(-1).to(self.device)

    def native_values(self, values: Tensor, query: int) -> Tensor:
        out = values.new_zeros(values.shape[0], 2 * query + 2, values.shape[-1])
        out[:, : values.shape[1]] = values
        return out.to(self.device)

    def prompt_mean(self, value: Tensor, n_prompts: int) -> Tensor:
        return value.mean(0, keepdim=True)

    def expand_mean(self, mean: Tensor, like: Tensor) -> Tensor:
        return mean.expand_as(like)


class HookedRunner(GPT2Runner):
    """Linear self-attention models (probe/models/lsa.py): every intervention through hooks on their
    one forward (no resumed paths); MLP blocks only in lsa_mlp."""

    def __init__(self, model, device: str):
        super().__init__(model, device, resumed=False)
        self.has_mlp = bool(getattr(model, "mlp", False))


class PlantedRunner(Runner):
    """Planted models: their hooked forward, one sequence per prefix run."""

    def __init__(self, model, device: str):
        self.model = model.to(device)
        self.n_layers = model.n_layers
        self.heads = list(range(model.q.shape[1]))  # hook_z's last head carries the skip map (planted.py, _Sites)
        self.has_mlp = bool(model.d_mlp)
        self.device = device

    def silent(self, layer: int, head: int | None = None) -> bool:
        m = self.model  # no biases: a zero weight matrix makes the output 0 (probe/models/planted.py)
        if head is None:
            return not (bool(m.mlp_in[layer].any()) and bool(m.mlp_out[layer].any()))
        return not (bool(m.q[layer, head].any()) and bool(m.k[layer, head].any()) and bool(m.v[layer, head].any()))

    @torch.no_grad()
    def predict(self, xs: Tensor, ys: Tensor, hooks: Sequence[Hook] = (), query: int | None = None) -> Tensor:

        runs = None if query is None else [query]
        preds = self.model.run_with_hooks(xs.to(self.device), ys.to(self.device), list(hooks), runs).pred.float().cpu()
        return preds if query is None else preds[:, 0]

    def _runs(self, n: int) -> int:
        return n + self.model.n_extra_tokens + 1

    def stream_mask(self, token_mask: Tensor, n_prompts: int, query: int | None = None) -> Tensor:
        k, two_n = token_mask.shape
        n = two_n // 2
        per_run = torch.zeros(k, n, self._runs(n), dtype=torch.bool, device=token_mask.device)
        per_run[:, :, -1] = token_mask[:, X_TOKENS]  # x token i is the query of run i
        seen = prefix_mask(n, token_mask.device)  # example i is in run r > i
        per_run[:, :, :n] = token_mask[:, Y_TOKENS].unsqueeze(1) & seen
        if query is not None:
            per_run, n = per_run[:, query : query + 1], 1
        return per_run.repeat_interleave(n_prompts, dim=0).reshape(k * n_prompts * n, -1, 1).to(self.device)

    def native_values(self, values: Tensor, query: int) -> Tensor:
        """Run `query` holds example i's own token (interleaved y token 2i + 1) and the query (x token
        2 query); the x tokens of earlier examples are queries of other runs, absent from this one."""
        b, p, width = values.shape
        out = values.new_zeros(b, self._runs(query + 1), width)
        slots = [i for i in range(query) if 2 * i + 1 < p]
        out[:, slots] = values[:, [2 * i + 1 for i in slots]]
        if p > 2 * query:
            out[:, -1] = values[:, 2 * query]
        return out.to(self.device)

    def prompt_mean(self, value: Tensor, n_prompts: int) -> Tensor:
        return value.reshape(n_prompts, -1, *value.shape[1:]).mean(0)  # (runs, T, ...)

    def expand_mean(self, mean: Tensor, like: Tensor) -> Tensor:
        return mean.repeat(like.shape[0] // mean.shape[0], *([1] * (mean.dim() - 1)))


# runner name -> Runner class; a family names its own (its class's `intervention_runner`,
# probe/models/base.py FamilyTraits; subclasses inherit it: lsa_sparse and lsa_mlp are lsa's), and a
# family module outside probe/ may register a Runner of its own here. A family that names none (the
# LSTM, a user's own model) has no TransformerLens form to intervene on.
RUNNERS: Registry[Callable[[Any, str], Runner]] = Registry("intervention runner")  # (model, device) -> Runner
RUNNERS.register("gpt2")(GPT2Runner)
RUNNERS.register("hooked")(HookedRunner)
RUNNERS.register("planted")(PlantedRunner)


def _runner_class(model) -> Callable[[Any, str], Runner] | None:
    name = getattr(type(model), "intervention_runner", "")
    return RUNNERS.get(name) if name else None


def has_runner(model) -> bool:
    """Whether the model's family has a Runner: a TransformerLens form to ablate, patch and steer."""
    return _runner_class(model) is not None


def runner_refusal(model) -> str:
    """Why the model has no Runner ("" where it has one): what an intervention stage reports instead."""
    if has_runner(model):
        return ""
    family = getattr(model, "family", type(model).__name__)
    return (
        f"this checkpoint is a {family} model, with no attention heads or residual stream to intervene on; "
        "use a GPT-2 family, linear self-attention or planted checkpoint"
    )


def runner_for(model, device: str = "cpu") -> Runner:
    """The Runner of its model's family (RUNNERS); models without a TransformerLens form get a clear error."""

    device = check_device(device)
    runner = _runner_class(model)
    if runner is not None:
        return runner(model.eval(), device)
    raise ConfigError(
        f"interventions need a transformer with TransformerLens-named hook points (GPT-2, linear self-attention "
        f"or planted); "
        f"this checkpoint is a {getattr(model, 'family', type(model).__name__)} model, which has no "
        "attention heads or residual stream to ablate or patch"
    )


# ------------------------------------------------------------------ hook builders (native layout)


def skip_hooks(layers: list[int]) -> list[Hook]:
    """Remove the residual update of each block in `layers`: resid_post(l) := resid_pre(l)."""
    saved: dict[int, Tensor] = {}
    hooks: list[Hook] = []
    for layer in layers:

        def keep(value: Tensor, hook, layer: int = layer) -> None:
            saved[layer] = value

        def restore(value: Tensor, hook, layer: int = layer) -> Tensor:
            return saved[layer]

        hooks += [(H.resid_pre(layer), keep), (H.resid_post(layer), restore)]
    return hooks


def head_hook(layer: int, head: int, replacement: Callable[[Tensor], Tensor] | None) -> Hook:
    """Replace head `head`'s output z (..., heads, d_head) at `layer` by zero or `replacement(z)`."""

    def edit(z: Tensor, hook) -> Tensor:
        z = z.clone()
        z[..., head, :] = 0.0 if replacement is None else replacement(z)[..., head, :]
        return z

    return H.head_outputs(layer), edit


def replace_hook(name: str, replacement: Callable[[Tensor], Tensor] | None) -> Hook:
    """Replace a whole activation by zero or `replacement(value)`."""

    def edit(value: Tensor, hook) -> Tensor:
        return torch.zeros_like(value) if replacement is None else replacement(value)

    return name, edit


def boundary_hook_name(boundary: int, n_layers: int) -> str:
    if not 0 <= boundary <= n_layers:
        raise ConfigError(f"layer boundary must lie in 0..{n_layers}, got {boundary}")
    return H.resid(boundary)
