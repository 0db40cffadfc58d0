"""Transformers whose weights are set by hand to run a known learner: ground truth for analyses.

Architecture (shared by every construction): linear self-attention layers (von Oswald et al.
2023, "Transformers learn in-context by gradient descent", eq. 1-2) with a linear skip map,

    h_j <- h_j + sum_heads c_head * sum_i (V h_i) <K h_i, Q h_j> + A h_j,

where c_head is 1/t (t = examples in the prompt) or 1 (ReLU attention applies ReLU to the scores), no
LayerNorm, and in some constructions a ReLU MLP after the attention. Each prediction
for x_{t+1} is computed by one run over the first t examples (full attention among them, as in
von Oswald et al.'s one-query setting), so causality holds by construction; all prefixes run
at once. The read-out is a fixed linear map of the query token.

The constructions (GD, Newton with linear or ReLU attention, SGD, Adam, a uniform random number,
a pseudo-random generator) are described, one class each, in probe/models/constructions/; this
module is the architecture they run on, and `plant` builds one.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ..core.budget import Shape
from ..core.errors import ConfigError
from ..core.validate import check_memory
from ..data.positions import X_TOKENS
from .base import FamilyTraits, ModelOutput
from .config import FAMILIES, ModelConfig
from .constructions import CONSTRUCTIONS
from .hooked import Hooked, HookFn, HookPoint
from .learner_state import LearnerState

MLP_BLOCK_BYTES = 16 << 20  # hidden activations per block of the planted MLPs (below glibc's mmap threshold)


def planted_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    """(token width, heads per layer, MLP hidden size) of a construction, from its config alone."""
    return CONSTRUCTIONS.get(cfg.planted).sizes(cfg)


def planted_bytes(cfg: ModelConfig) -> int:
    """float32 bytes of a construction's weights (query, key, value, skip and MLP maps per layer)."""
    return 4 * PlantedICL.parameter_count(cfg)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_pattern = (
            HookPoint()
        )  # (runs, heads + 1, T, T): weights [j, i]; the last head is the skip map's identity
        self.hook_z = HookPoint()  # (runs, T, heads + 1, W): each head's weighted values (the skip head: A h)


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()  # (runs, T, d_mlp): before and after the ReLU


class _Sites(nn.Module):
    """One layer's hook points, laid out as a TransformerLens transformer would hold the layer: one
    sequence per prefix run (runs = B x n, prompt-major), the skip map as one more head with an
    identity pattern, the heads' outputs summed (identity output projection)."""

    def __init__(self, has_mlp: bool) -> None:
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = _Attention()
        self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint()
        if has_mlp:
            self.mlp = _MLP()
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()


@FAMILIES.register("planted")
class PlantedICL(Hooked, FamilyTraits, nn.Module):
    capture_backend = "planted"
    intervention_runner = "planted"
    family = "planted"
    random_init = False  # its weights are the construction: a fresh instance is all zeros
    sized_by_config = False  # its weights file holds the construction's nonzero maps only

    @classmethod
    def adapt_recipe(cls, recipe, config):
        """Planted models are judged with their own read-out (retraining would rescale the planted
        predictor) and against their learner's exact hyper-parameters (the construction's
        `adapt_sweeps`)."""
        recipe = copy.deepcopy(recipe)
        recipe.readout.method = "model"
        CONSTRUCTIONS.get(config.model.planted).adapt_sweeps(recipe.sweeps, config.model)
        return recipe

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        super().check_config(cfg)
        try:
            CONSTRUCTIONS.get(cfg.planted)
        except ConfigError as err:
            raise ConfigError(f"model.planted: {err}") from None

    @classmethod
    def shape(cls, cfg: ModelConfig) -> Shape:
        """The construction's width, heads and MLP width (planted_sizes), not the config's n_embd."""
        width, heads, d_mlp = planted_sizes(cfg)
        return Shape(cfg.n_layer, width, cfg.n_dims, True, heads, d_mlp)

    @staticmethod
    def parameter_count(cfg: ModelConfig) -> int:
        """Entries of the query, key, value, skip and MLP maps of every layer, and the read-out."""
        width, heads, d_mlp = planted_sizes(cfg)
        return cfg.n_layer * ((3 * heads + 1) * width * width + 2 * d_mlp * width) + width

    q: nn.Parameter  # (L, heads, W, W) query maps
    k: nn.Parameter
    v: nn.Parameter
    skip: nn.Parameter  # (L, W, W)
    per_example: Tensor  # (L, heads) buffer: 1 scales the head by 1/t
    read: nn.Parameter  # (W,)
    mlp_in: nn.Parameter  # (L, 4d, W), ReLU MLP of "newton-relu" only
    mlp_out: nn.Parameter  # (L, W, 4d)
    masks: Tensor  # (L, n, n) buffer of "sgd" only: Hataya & Imaizumi 2024, Assumption 1's minibatch masks

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.construction = CONSTRUCTIONS.get(cfg.planted)
        self.layout = self.construction.layout(cfg)
        self.relu_attention = self.construction.relu_attention
        w, heads, self.d_mlp = self.construction.sizes(cfg)
        self.q = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.k = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.v = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.skip = nn.Parameter(torch.zeros(cfg.n_layer, w, w), requires_grad=False)
        self.register_buffer("per_example", torch.zeros(cfg.n_layer, heads))  # 1: scale the head by 1/t
        self.read = nn.Parameter(torch.zeros(w), requires_grad=False)
        steps = self.construction.mask_steps(cfg)
        if steps:  # Hataya & Imaizumi 2024, Assumption 1: masks[l, t, i], example i in prefix t's batch
            self.register_buffer("masks", torch.zeros(steps, cfg.n_positions, cfg.n_positions))
        if self.d_mlp:
            self.mlp_in = nn.Parameter(torch.zeros(cfg.n_layer, self.d_mlp, w), requires_grad=False)
            self.mlp_out = nn.Parameter(torch.zeros(cfg.n_layer, w, self.d_mlp), requires_grad=False)
        self.blocks = nn.ModuleList(_Sites(bool(self.d_mlp)) for _ in range(cfg.n_layer))  # hook points only
        self.name_hook_points()

    @property
    def n_extra_tokens(self) -> int:
        """Tokens between the example slots and the query in each run (Newton's column tokens)."""
        return self.construction.extra_tokens(self.config)

    @property
    def learner_state(self) -> LearnerState | None:
        """Where the construction keeps its learner's matrix iterate, if it keeps one (Newton)."""
        return self.construction.learner_state

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention weights [j, i] = <K h_i, Q h_j> (linear attention) or its ReLU (Def. 5, eq. 17)."""
        s = q @ k.transpose(-1, -2)
        return s.relu() if self.relu_attention else s

    def mlp(self, h: Tensor, l: int) -> Tensor:
        """The layer's ReLU MLP, a block of tokens at a time: its hidden activations for every token of
        every run would be a ~1.5 GB temporary (planted Adam, 1280 prompts), which glibc maps and
        unmaps anew each time (system time comparable to the arithmetic). Rows are independent, so
        the blocks give exactly the full product."""
        hooks = self.sites(l).mlp
        if hooks.hook_pre.active or hooks.hook_post.active:  # (B * n, T, d_mlp) through the hook points
            hidden = hooks.hook_post(hooks.hook_pre((h @ self.mlp_in[l].T).flatten(0, 1)).relu())
            return (hidden @ self.mlp_out[l].T).view(*h.shape[:-1], -1)
        flat = h.reshape(-1, h.shape[-1])
        rows = max(1, MLP_BLOCK_BYTES // (self.d_mlp * flat.element_size()))
        out = torch.empty(flat.shape[0], self.mlp_out.shape[1], dtype=h.dtype, device=h.device)
        for lo in range(0, flat.shape[0], rows):
            out[lo : lo + rows] = (flat[lo : lo + rows] @ self.mlp_in[l].T).relu() @ self.mlp_out[l].T
        return out.view(*h.shape[:-1], -1)

    # -- the protocol
    n_dims = property(lambda self: self.config.n_dims)
    n_layers = property(lambda self: self.config.n_layer)
    d_model = property(lambda self: self.layout.width)
    n_points = property(lambda self: self.config.n_positions)

    def readout(self, final: Tensor) -> Tensor:
        return final @ self.read

    def lens(self, resid: Tensor) -> Tensor:
        return self.readout(resid)

    def tokens(self, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Runs for every prefix: tokens (B, n, T, W) and each run's divisor of its per-example
        heads (n,): the number of examples t, or the keys a construction averages over.

        Token order in run t: the n example slots, the construction's extra tokens (Newton's d
        column tokens), then the query x_{t+1}; the construction fills them."""
        b, n, _ = xs.shape
        h = xs.new_zeros(b, n, n + self.n_extra_tokens + 1, self.layout.width)
        return self.construction.tokens(self, h, xs, ys)

    def layer(self, h: Tensor, l: int, t: Tensor) -> Tensor:
        """Layer l on the runs' tokens h (B, n, T, W); t (n,) the runs' divisors. Every site goes
        through its hook point (`_Sites`, laid out one sequence per run); the heads are computed
        one at a time, or stacked (the skip map as an identity-pattern head) when their pattern or
        outputs are hooked."""
        b, n, length, _ = h.shape
        sites = self.sites(l)

        def fire(point: HookPoint, value: Tensor) -> Tensor:  # (B, n, T, ...) as (B * n, T, ...)
            return point(value.reshape(b * n, length, -1)).view(b, n, length, -1) if point.active else value

        scale = torch.where(t > 0, 1 / t.clamp_min(1), torch.zeros_like(t)).view(1, -1, 1, 1)
        h = fire(sites.hook_resid_pre, h)
        if sites.attn.hook_pattern.active or sites.attn.hook_z.active:
            attn = self._stacked_heads(h, l, scale, sites.attn)
        else:
            attn = h @ self.skip[l].T
            active = (self.q[l].flatten(1).any(1) & self.v[l].flatten(1).any(1)).tolist()  # one host read per layer
            for head, per_example in enumerate((self.per_example[l] != 0).tolist()):
                if not active[head]:
                    continue
                q, k, v = h @ self.q[l, head].T, h @ self.k[l, head].T, h @ self.v[l, head].T
                att = self.scores(q, k) @ v  # (B, n, T, W): sum_i sigma(<K h_i, Q h_j>) V h_i
                attn = attn + att * (scale if per_example else 1.0)
        out = fire(sites.hook_resid_mid, h + fire(sites.hook_attn_out, attn))
        if self.d_mlp:
            out = out + fire(sites.hook_mlp_out, self.mlp(out, l))
        return fire(sites.hook_resid_post, out)

    def sites(self, l: int) -> _Sites:
        """Layer l's hook points."""
        return self.blocks[l]  # type: ignore[return-value]

    def _stacked_heads(self, h: Tensor, l: int, scale: Tensor, attn) -> Tensor:
        """The attention output with every head's pattern (runs, heads + 1, T, T) and output z
        (runs, T, heads + 1, W) through their hook points; the last head is the skip map A h."""
        b, n, length, width = h.shape
        patterns, values = [], []
        for head, per_example in enumerate((self.per_example[l] != 0).tolist()):
            pattern = self.scores(h @ self.q[l, head].T, h @ self.k[l, head].T)  # [j, i] = sigma(<K h_i, Q h_j>)
            patterns.append(pattern * scale if per_example else pattern)
            values.append(h @ self.v[l, head].T)
        patterns.append(torch.eye(length, dtype=h.dtype, device=h.device).expand(b, n, length, length))
        values.append(h @ self.skip[l].T)
        pattern = attn.hook_pattern(torch.stack(patterns, 2).view(b * n, -1, length, length))
        z = pattern @ torch.stack(values, 2).view(b * n, -1, length, width)  # (runs, heads + 1, T, W)
        return attn.hook_z(z.transpose(1, 2)).sum(2).view(b, n, length, width)

    def run(self, xs: Tensor, ys: Tensor, runs: list[int] | None = None) -> ModelOutput:
        """Predictions and the interleaved layer boundaries; `runs`: compute only these prefix runs
        (run t predicts y_{t+1}): `pred` is then (B, len(runs)) and the boundaries hold 0 at the
        tokens read from other runs (`interleave_runs`)."""
        h, t = self.tokens(xs.to(self.q.dtype), ys.to(self.q.dtype))
        if runs is not None:
            h, t = h[:, runs], t[runs]
        states = [h]
        for l in range(self.config.n_layer):
            h = self.layer(h, l, t)
            states.append(h)
        resid = [self.interleave_runs(state, runs, xs.shape[1]) for state in states]
        pred = self.readout(resid[-1][:, X_TOKENS] if runs is None else h[:, :, -1])  # each run's query token
        return ModelOutput(pred=pred, resid=resid, final=resid[-1])

    def run_with_hooks(
        self, xs: Tensor, ys: Tensor, fwd_hooks: list[tuple[str, HookFn]], runs: list[int] | None = None
    ) -> ModelOutput:
        """`run` with (TransformerLens hook name, fn(value, hook)) pairs attached for this call; the
        values are laid out one sequence per prefix run computed: (B * runs, T, ...), prompt-major."""
        with self.hooks(fwd_hooks):
            return self.run(xs, ys, runs)

    @staticmethod
    def interleave_runs(state: Tensor, runs: list[int] | None = None, n: int | None = None) -> Tensor:
        """Per-run token states (B, n, T, W) -> the x_1, y_1, ... layout (B, 2n, W): x token t is
        the query of run t, y token t is example t in run t+1 (the last run for the last one).
        With `runs`, state holds only those runs (B, len(runs), T, W) of n, and the tokens read
        from other runs are 0."""
        b = state.shape[0]
        n = state.shape[1] if n is None else n
        runs = list(range(n)) if runs is None else runs
        at = {run: i for i, run in enumerate(runs)}
        seq = state.new_zeros(b, 2 * n, state.shape[-1])
        queries = torch.tensor(runs, dtype=torch.long, device=state.device)
        seq[:, 2 * queries] = state[:, :, -1]
        examples = [(i, at[min(i + 1, n - 1)]) for i in range(n) if min(i + 1, n - 1) in at]
        if examples:
            token, run = (torch.tensor(v, dtype=torch.long, device=state.device) for v in zip(*examples))
            seq[:, 2 * token + 1] = state[:, run, token]
        return seq

    @staticmethod
    def runs_reading(positions, n: int) -> list[int]:
        """The prefix runs whose states the interleaved tokens `positions` are read from (interleave_runs)."""
        return sorted({p // 2 if p % 2 == 0 else min(p // 2 + 1, n - 1) for p in positions})

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


def plant(cfg: ModelConfig) -> PlantedICL:
    """A PlantedICL with the weights of its construction (probe/models/constructions/); refused before
    any allocation when its weights would not fit in memory."""
    check_memory(
        planted_bytes(cfg),
        f"a planted {cfg.planted} model with {cfg.n_layer} layers (d = {cfg.n_dims})",
        "use fewer layers or a smaller d (a prng model: fewer outputs)",
    )
    model = PlantedICL(cfg)
    with torch.no_grad():
        model.construction.plant(model)
    return model
