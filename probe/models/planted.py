"""Transformers whose weights are set by hand to run a known learner: ground truth for analyses.

Architecture (shared by both constructions): linear self-attention layers (von Oswald et al.
2023, "Transformers learn in-context by gradient descent", eq. 1-2) with a linear skip map,

    h_j <- h_j + sum_heads c_head * sum_i (V h_i) <K h_i, Q h_j> + A h_j,

where c_head is 1/t (t = examples in the prompt) or 1, and no LayerNorm or MLP. Each prediction
for x_{t+1} is computed by one run over the first t examples (full attention among them, as in
von Oswald et al.'s one-query setting), so causality holds by construction; all prefixes run
at once. The read-out is a fixed linear map of the query token.

GD (`planted="gd"`, eta = planted_scale): tokens [x-slot, r-slot, xq-slot]; examples start as
(x_i, y_i), the query as (x_q, 0). One head with Q = K = x (xq for the query), V = -eta r:
r_j <- r_j - eta/t sum_i r_i <x_i, x_j>, so after l layers r_i = y_i - w_l.x_i and
r_q = -w_l.x_q, w_l being l steps of GD on ||y - Xw||^2/(2t) from 0 (seed 003 eq. 6, paper
convention). Read-out: -r_q. Layer l = GD step l.

Newton (`planted="newton"`, alpha = planted_scale): Iterative Newton (seed 003 eq. 8) on the
normalised moment S/t with a fixed M_0 = alpha S/t, using d extra "column" tokens that carry the
columns m_j of M_k (hidden size O(d), as seed 003 Thm. 1; linear instead of ReLU attention).
Layer 1: m_j = alpha/t sum_i x_i <x_i, e_j>, and the query gathers b = 1/t sum_i y_i x_i.
Then two layers per iteration: (A) u_j = S m_j / t (columns attend to examples) and
z = M_k x_q (query attends to columns); (B) m_j <- 2 m_j - M_k u_j (columns attend to columns)
and p = 1/t sum_i y_i <x_i, z> = x_q . M_k b (query attends to examples). Read-out: p.
Layer map: boundaries 0-2 predict 0; boundary l >= 3 holds iteration (l - 3) // 2.
Matching learner: newton with alpha = planted_scale (a number: fixed scale on S/t).

Newton with ReLU attention (`planted="newton-relu"`, alpha = planted_scale): the construction of
seed 003 Thm. 1 (App. B.2). Every head is a full-attention ReLU head of Def. 5 (eq. 17),
sigma(a) = ReLU(a)/t; a product a.V is the pair ReLU(a) V - ReLU(-a) V (heads 2k and 2k+1, the
second with Q and V negated). Tokens [x, y, xq, tx, tq, p] (hidden size 4d + 2); example i starts
as (x_i, y_i), the query as x_q. Layer 0 (eq. 20-23): T^(0) x = alpha S/t x into tx (examples) and
tq (query). Layer l >= 1: the attention of eq. 26-28 gives T x_t - 1/2 T (S/t) T x_t, the MLP of
eq. 29 (hidden size 4d, ReLU(a) - ReLU(-a) = a) doubles the tx and tq slots, so
T^(l) = 2 T^(l-1) - T^(l-1) (S/t) T^(l-1) (eq. 31); a third head pair writes the prediction
p = 1/t sum_i y_i <x_i, T^(l-1) x_q> = x_q . T^(l-1) X^T y / t, replacing the previous p (skip map).
Layer map: boundaries 0-1 predict 0; boundary l >= 2 holds iteration l - 2: one layer per
iteration, against two for the linear-attention construction above.
Deviations from the paper, all stated: (i) eq. 20 and 27 take V_1 = V_2 with
Q_2^T K_2 = -Q_1^T K_1, which sums to |a| V, not a V; the pair needs V_2 = -V_1. (ii) The factor n
of Q (-n/2 I) and V (n alpha I) is dropped, so T iterates Newton on S/t with M_0 = alpha S/t:
the same w_k as the paper's Newton on S with alpha/t^2. (iii) The mov / aff steps of eq. 19 and 22
are folded into the embedding (T x starts in its own zero slot). (iv) The read-out of eq. 32-34
(mov, mul, Lemma 1, mov, mul after the last iteration) is replaced by one head pair per layer, so
that every layer boundary can be read out; the query keeps T x_q in its own slot, so that, as in
eq. 17's sum over the examples only, it is never a key.

Minibatch SGD (`planted="sgd"`, eta = planted_scale, K = planted_batch; seed 000 Thm. 4, eq. 9):
the GD construction above with seed 000's minibatch masks (Assumption 1). Tokens [x, r, xq, one,
b (L), g]; example i of run t carries the bits b_l = masks[l, t, i] (min(K, t) distinct examples
of prefix t per step, from `minibatch_masks(L, n, K, planted_seed)`, kept as the `masks` buffer
and replayed by the `sgd` learner with masks_seed = planted_seed). Layer l: one linear head
r_j <- r_j - eta/|B_t| sum_i g_i <x_i, x_j> (query as in GD) with g_i the gated residual, so the
residuals hold y - w_l.x and the read-out -r_q = w_l.x_q, w_l being l steps of eq. 9 from 0. The
skip map clears g; the layer's ReLU MLP writes the next step's gate (proof of Thm. 4),
g = ReLU(r - R(1 - b_{l+1})) - ReLU(-r - R(1 - b_{l+1})), R = planted_bound. For the square loss
d_1 l(s, y) = s - y is exactly a sum of two ReLUs (Def. 1 with eps = 0 on [-R, R]): g = b r
exactly while every |residual| <= R, so eq. 10-11 hold with eps = 0 (the model equals the
learner to float round-off); an unselected example with |r| > R leaks |r| - R into the step.
Deviations: the gates sit in the MLP after each layer's attention instead of inside ReLU
attention scores (the same two ReLUs); the first step's gate b_1 y is folded into the
embedding, so boundary l holds step l (Thm. 4 counts one more layer); the 1/K of eq. 9 is
1/min(K, t) for prefixes shorter than K.

Adam (`planted="adam"`, eta = planted_scale, K = planted_batch; seed 000 Thm. 5, eq. 12-15 with
beta1 = 0.9, beta2 = 0.999 and eps = 1e-8 inside the root as printed): the SGD construction's
tokens plus the Adam state in the query token [flag, G, m, v, P, u] (every example token holds 0
there). Four layers per step k: (A) the query gathers G = 1/|B_t| sum_i g_i x_i = -gradient (one
linear head, keys read g); (B) d heads of the query with itself give G_c^2 exactly (a product of
one token's entries is a bilinear form), the skip map makes m <- b1 m - (1-b1) G and
v <- b2 v + (1-b2) G^2 and clears G, and the MLP writes P = psi_k(v) = 1 / sqrt(v / (1 - b2^k) + eps),
a sum of ReLUs interpolating psi_k at geometric knots (the only approximation: relative
accuracy `adam_psi_error()` in probe/models/adam_psi.py, about 5e-3); (C) d heads give u_c = m_c P_c / (1 - b1^k) exactly;
(D) every token attends to the query: r_j <- r_j + eta u.x_j (so the residuals hold y - w_k.x
and -r_q = w_k.x_q), and the MLP writes the next step's gates as in SGD. Boundary 4k holds step
k. Deviations: four layers per step instead of Thm. 5's two, because the squares and the
products m_c P_c are computed exactly by attention and only psi is approximated (1-D, so its
accuracy can be stated); the first gate is folded into the embedding as for SGD. Eq. 16's bound
is then checked with eps = the step map's error (tests).

A random number from the data (`planted="uniform"`, eps = planted_scale; seed 000 Thm. 2, eq.
8, 17): one block, two ReLU-attention heads. In run t the last example's first coordinate
z_t is held out (moved into the query token, folded into the embedding) and the first t - 1
examples are the keys: u = 1/(t-1) sum_{i<t} [ReLU(a (z_t - z_i) + 1/2) - ReLU(a (z_t - z_i) - 1/2)],
a = 1/(4 eps): the empirical CDF of z_1..z_{t-1} at z_t, each step a ramp of width 4 eps. Over
prompts u is close to U(0, 1) (KS distance <= eps + O(1/sqrt t)); it depends on which example
is last, so on the order of the examples.

A pseudo-random generator (`planted="prng"`, d = 32, M = n_head outputs; seed 000 Def. 2,
Thm. 3): xorshift32 (Marsaglia 2003, shifts 13, 17, 5) is s_t = A s_{t-1} over F_2 with o_t = s_t
(B = I). The seed s_0 is the first example's x read as 32 bits (0/1 entries). One block: head m
copies C_m s_0 into output slot o_m, C_m = A^m mod 2 (the query attends to the first example
only); the block's ReLU MLP reduces each count c in 0..32 mod 2 exactly, c mod 2 = c +
sum_j (-1)^j 2 ReLU(c - j). The read-out is o_1's first 24 bits as a number in [0, 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..core.config import ModelConfig
from ..data.positions import X_TOKENS, prefix_mask
from .adam_psi import psi_knots
from .base import ModelOutput
from .hooked import Hooked, HookFn, HookPoint
from .learner_state import LEARNER_STATES, LearnerState


def gd_stable_limit(d: int) -> float:
    """Largest step eta for which GD on ||y - Xw||^2/(2t) stays stable on typical prompts:
    2 / (1 + sqrt(d))^2, the Marchenko-Pastur edge of S/t at t = 1 (seed 003 §2, REFERENCE §2)."""
    return 2.0 / (1 + math.sqrt(d)) ** 2


def newton_default_alpha(d: int) -> float:
    """A fixed alpha with alpha * lambda_max(S/t)^2 < 2 on all but ~1e-4 of short prefixes."""
    return 1.0 / (2 * (1 + math.sqrt(d)) ** 2) ** 2


HEADS = {"gd": 2, "newton": 2, "newton-relu": 6, "sgd": 1, "uniform": 2}  # per layer (prng: n_head; adam: d)
ADAM_LAYERS_PER_STEP = 4
RELU_ATTENTION = ("newton-relu", "uniform")
PRNG_READ_BITS = 24  # bits of o_1 in the read-out (exact in float32)


class Layout:
    """Named slots of the token vector."""

    def __init__(self, algorithm: str, d: int, layers: int = 1, outputs: int = 1):
        names = {
            "sgd": [("x", d), ("r", 1), ("xq", d), ("one", 1), ("b", layers), ("g", 1)],
            "adam": [("x", d), ("r", 1), ("xq", d), ("one", 1), ("b", layers // ADAM_LAYERS_PER_STEP), ("g", 1)]
            + [("flag", 1), ("G", d), ("m", d), ("v", d), ("P", d), ("u", d)],
            "uniform": [("x", d), ("one", 1), ("qone", 1), ("z", 1), ("u", 1)],
            "prng": [("s", d), ("first", 1), ("qone", 1), ("o", outputs * d)],
            "gd": [("x", d), ("r", 1), ("xq", d)],
            "newton": [
                ("x", d),
                ("y", 1),
                ("xq", d),
                ("one", 1),
                ("e", d),
                ("m", d),
                ("u", d),
                ("b", d),
                ("z", d),
                ("p", 1),
            ],
            "newton-relu": [("x", d), ("y", 1), ("xq", d), ("tx", d), ("tq", d), ("p", 1)],
        }[algorithm]
        self.slots, start = {}, 0
        for name, size in names:
            self.slots[name] = slice(start, start + size)
            start += size
        self.width = start

    def __getitem__(self, name: str) -> slice:
        return self.slots[name]


MLP_BLOCK_BYTES = 16 << 20  # hidden activations per block of the planted MLPs (below glibc's mmap threshold)


def planted_sizes(cfg: ModelConfig) -> tuple[int, int, int]:
    """(token width, heads per layer, MLP hidden size) of a construction, from its config alone."""
    width = Layout(cfg.planted, cfg.n_dims, cfg.n_layer, cfg.n_head).width
    heads = cfg.n_dims if cfg.planted == "adam" else HEADS.get(cfg.planted, cfg.n_head)
    d_mlp = {
        "newton-relu": 4 * cfg.n_dims,
        "sgd": 2,
        "adam": 2 * cfg.n_dims * (len(psi_knots()) - 1),
        "prng": cfg.n_head * cfg.n_dims**2,
    }.get(cfg.planted, 0)
    return width, heads, d_mlp


def planted_bytes(cfg: ModelConfig) -> int:
    """float32 bytes of a construction's weights (query, key, value, skip and MLP maps per layer)."""
    width, heads, d_mlp = planted_sizes(cfg)
    return 4 * cfg.n_layer * ((3 * heads + 1) * width * width + 2 * d_mlp * width)


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


class PlantedICL(Hooked, nn.Module):
    family = "planted"
    capture_backend = "planted"  # probe/capture/backends.py
    runner = "planted"  # probe/interventions/runner.py
    q: nn.Parameter  # (L, heads, W, W) query maps
    k: nn.Parameter
    v: nn.Parameter
    skip: nn.Parameter  # (L, W, W)
    per_example: Tensor  # (L, heads) buffer: 1 scales the head by 1/t
    read: nn.Parameter  # (W,)
    mlp_in: nn.Parameter  # (L, 4d, W), ReLU MLP of "newton-relu" only
    mlp_out: nn.Parameter  # (L, W, 4d)
    masks: Tensor  # (L, n, n) buffer of "sgd" only: seed 000 Assumption 1's minibatch masks

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.layout = Layout(cfg.planted, cfg.n_dims, cfg.n_layer, cfg.n_head)
        self.relu_attention = cfg.planted in RELU_ATTENTION
        w, heads, self.d_mlp = planted_sizes(cfg)
        self.q = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.k = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.v = nn.Parameter(torch.zeros(cfg.n_layer, heads, w, w), requires_grad=False)
        self.skip = nn.Parameter(torch.zeros(cfg.n_layer, w, w), requires_grad=False)
        self.register_buffer("per_example", torch.zeros(cfg.n_layer, heads))  # 1: scale the head by 1/t
        self.read = nn.Parameter(torch.zeros(w), requires_grad=False)
        if cfg.planted in ("sgd", "adam"):  # seed 000 Assumption 1: masks[l, t, i], example i in prefix t's batch
            steps = cfg.n_layer // ADAM_LAYERS_PER_STEP if cfg.planted == "adam" else cfg.n_layer
            self.register_buffer("masks", torch.zeros(steps, cfg.n_positions, cfg.n_positions))
        if self.d_mlp:
            self.mlp_in = nn.Parameter(torch.zeros(cfg.n_layer, self.d_mlp, w), requires_grad=False)
            self.mlp_out = nn.Parameter(torch.zeros(cfg.n_layer, w, self.d_mlp), requires_grad=False)
        self.blocks = nn.ModuleList(_Sites(bool(self.d_mlp)) for _ in range(cfg.n_layer))  # hook points only
        self.name_hook_points()

    @property
    def n_extra_tokens(self) -> int:
        """Tokens between the example slots and the query in each run (Newton's column tokens)."""
        return self.config.n_dims if self.config.planted == "newton" else 0

    @property
    def learner_state(self) -> LearnerState | None:
        """Where the construction keeps its learner's matrix iterate, if it keeps one (Newton)."""
        return LEARNER_STATES.get(self.config.planted)

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

        Token order in run t: the n example slots (only the first t are examples), the d column
        tokens (Newton), then the query x_{t+1}."""
        b, n, d = xs.shape
        s, ly = self.layout, self.layout.width
        n_cols = self.n_extra_tokens
        h = xs.new_zeros(b, n, n + n_cols + 1, ly)
        seen = prefix_mask(n).to(xs.dtype).view(1, n, n, 1)  # (run t, i)
        stochastic = {
            "sgd": self._sgd_tokens,
            "adam": self._sgd_tokens,
            "uniform": self._uniform_tokens,
            "prng": self._prng_tokens,
        }
        if self.config.planted in stochastic:
            return stochastic[self.config.planted](h, xs, ys, seen)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        if self.config.planted == "gd":
            h[:, :, :n, s["r"]] = ys.view(b, 1, n, 1) * seen
        else:
            h[:, :, :n, s["y"]] = ys.view(b, 1, n, 1) * seen
        if self.config.planted == "newton":
            h[:, :, n : n + d, s["e"]] = torch.eye(d, dtype=xs.dtype)
            h[:, :, -1, s["one"]] = 1.0
        h[:, :, -1, s["xq"]] = xs  # run t queries x_{t+1}
        return h, torch.arange(n, dtype=xs.dtype)

    def _sgd_tokens(self, h: Tensor, xs: Tensor, ys: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
        n, s = xs.shape[1], self.layout
        masks = self.masks[:, :n, :n].to(xs.dtype)  # (L, run t, i)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        h[:, :, :n, s["r"]] = ys.view(-1, 1, n, 1) * seen
        h[:, :, :n, s["one"]] = seen.expand(h.shape[0], n, n, 1)
        h[:, :, :n, s["b"]] = masks.permute(1, 2, 0).unsqueeze(0).expand(h.shape[0], n, n, -1)
        h[:, :, :n, s["g"]] = (ys.view(-1, 1, n) * masks[0]).unsqueeze(-1)  # step 1's gate b_1 y (w_0 = 0)
        h[:, :, -1, s["xq"]] = xs
        h[:, :, -1, s["one"]] = 1.0
        if "flag" in s.slots:  # Adam: the query token holds the optimizer state
            h[:, :, -1, s["flag"]] = 1.0
        return h, masks[0].sum(-1)  # |B_t| = min(K, t)

    def _uniform_tokens(self, h: Tensor, xs: Tensor, ys: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
        n, s = xs.shape[1], self.layout
        keys = torch.ones(n, n).tril(-2).to(xs.dtype).view(1, n, n, 1)  # run t: examples 0..t-2 are keys
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * keys
        h[:, :, :n, s["one"]] = keys.expand(h.shape[0], n, n, 1)
        last = (torch.arange(n) - 1).clamp(min=0)  # run t holds out example t-1 (0-based)
        h[:, :, -1, s["z"]] = xs[:, last, :1] * (torch.arange(n) > 0).to(xs.dtype).view(1, n, 1)
        h[:, :, -1, s["qone"]] = 1.0
        return h, (torch.arange(n) - 1).clamp(min=0).to(xs.dtype)

    def _prng_tokens(self, h: Tensor, xs: Tensor, ys: Tensor, seen: Tensor) -> tuple[Tensor, Tensor]:
        s = self.layout
        has_seed = (torch.arange(xs.shape[1]) > 0).to(xs.dtype).view(1, -1, 1)  # run t >= 1 has seen x_1
        h[:, :, 0, s["s"]] = xs[:, :1] * has_seed
        h[:, :, 0, s["first"]] = has_seed
        h[:, :, -1, s["qone"]] = 1.0
        return h, torch.zeros(xs.shape[1], dtype=xs.dtype)

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
            for head in range(self.q.shape[1]):
                if not (self.q[l, head].any() and self.v[l, head].any()):
                    continue
                q, k, v = h @ self.q[l, head].T, h @ self.k[l, head].T, h @ self.v[l, head].T
                att = self.scores(q, k) @ v  # (B, n, T, W): sum_i sigma(<K h_i, Q h_j>) V h_i
                attn = attn + att * (scale if self.per_example[l, head] else 1.0)
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
        for head in range(self.q.shape[1]):
            pattern = self.scores(h @ self.q[l, head].T, h @ self.k[l, head].T)  # [j, i] = sigma(<K h_i, Q h_j>)
            patterns.append(pattern * scale if self.per_example[l, head] else pattern)
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
        queries = torch.tensor(runs, dtype=torch.long)
        seq[:, 2 * queries] = state[:, :, -1]
        examples = [(i, at[min(i + 1, n - 1)]) for i in range(n) if min(i + 1, n - 1) in at]
        if examples:
            token, run = (torch.tensor(v, dtype=torch.long) for v in zip(*examples))
            seq[:, 2 * token + 1] = state[:, run, token]
        return seq

    @staticmethod
    def runs_reading(positions, n: int) -> list[int]:
        """The prefix runs whose states the interleaved tokens `positions` are read from (interleave_runs)."""
        return sorted({p // 2 if p % 2 == 0 else min(p // 2 + 1, n - 1) for p in positions})

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred
