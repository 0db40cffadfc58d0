"""Iterative Newton with ReLU attention (`planted="newton-relu"`, alpha = planted_scale): the
construction of Fu et al. 2024, Thm. 1 (App. B.2).

Every head is a full-attention ReLU head of Def. 5 (eq. 17), sigma(a) = ReLU(a)/t; a product a.V
is the pair ReLU(a) V - ReLU(-a) V (heads 2k and 2k+1, the second with Q and V negated). Tokens
[x, y, xq, tx, tq, p] (hidden size 4d + 2); example i starts as (x_i, y_i), the query as x_q.
Layer 0 (eq. 20-23): T^(0) x = alpha S/t x into tx (examples) and tq (query). Layer l >= 1: the
attention of eq. 26-28 gives T x_t - 1/2 T (S/t) T x_t, the MLP of eq. 29 (hidden size 4d,
ReLU(a) - ReLU(-a) = a) doubles the tx and tq slots, so T^(l) = 2 T^(l-1) - T^(l-1) (S/t) T^(l-1)
(eq. 31); a third head pair writes the prediction p = 1/t sum_i y_i <x_i, T^(l-1) x_q> =
x_q . T^(l-1) X^T y / t, replacing the previous p (skip map). Layer map: boundaries 0-1 predict
0; boundary l >= 2 holds iteration l - 2: one layer per iteration, against two for the
linear-attention construction (probe/models/constructions/newton.py).

Deviations from the paper, all stated: (i) eq. 20 and 27 take V_1 = V_2 with
Q_2^T K_2 = -Q_1^T K_1, which sums to |a| V, not a V; the pair needs V_2 = -V_1. (ii) The factor n
of Q (-n/2 I) and V (n alpha I) is dropped, so T iterates Newton on S/t with M_0 = alpha S/t:
the same w_k as the paper's Newton on S with alpha/t^2. (iii) The mov / aff steps of eq. 19 and 22
are folded into the embedding (T x starts in its own zero slot). (iv) The read-out of eq. 32-34
(mov, mul, Lemma 1, mov, mul after the last iteration) is replaced by one head pair per layer, so
that every layer boundary can be read out; the query keeps T x_q in its own slot, so that, as in
eq. 17's sum over the examples only, it is never a key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..learner_state import LearnerState
from .base import construction, select
from .newton import NewtonBase

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..planted import PlantedICL


@construction
class NewtonReLU(NewtonBase):
    name = "newton-relu"
    title = "Iterative Newton with ReLU attention (Fu et al. 2024, Thm. 1)"
    first, per_step = 2, 1
    heads = 6
    relu_attention = True
    learner_state = LearnerState("newton", (("tx", "x"), ("tq", "xq")), first=1, every=1, lag=1)
    sibling = "newton"
    noun = "ReLU-attention Newton"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        return [("x", d), ("y", 1), ("xq", d), ("tx", d), ("tq", d), ("p", 1)]

    def d_mlp(self, cfg: ModelConfig) -> int:
        return 4 * cfg.n_dims

    def plant(self, model: PlantedICL) -> None:
        """Head pairs (2k, 2k+1) form a.V."""
        s, alpha = model.layout, model.config.planted_scale

        def pair(l: int, k: int, q: Tensor, key: Tensor, v: Tensor) -> None:
            for head, sign in ((2 * k, 1.0), (2 * k + 1, -1.0)):  # ReLU(a) V + ReLU(-a) (-V) = a V
                model.q[l, head], model.k[l, head], model.v[l, head] = sign * q, key, sign * v
                model.per_example[l, head] = 1  # sigma(a) = ReLU(a) / t

        x_key = select(s, "x", "x")
        pair(0, 0, select(s, "x", "x"), x_key, select(s, "tx", "x", alpha))  # eq. 21: tx = alpha S/t x_t
        pair(0, 1, select(s, "x", "xq"), x_key, select(s, "tq", "x", alpha))  # and tq = alpha S/t x_q
        d = model.n_dims
        for l in range(1, model.config.n_layer):
            t_key = select(s, "x", "tx")  # keys T x_j of the examples
            pair(l, 0, select(s, "x", "x", -0.5), t_key, select(s, "tx", "tx"))  # eq. 28: T x - 1/2 T S/t T x
            pair(l, 1, select(s, "x", "xq", -0.5), t_key, select(s, "tq", "tx"))  # the same for the query
            pair(l, 2, select(s, "x", "tq"), x_key, select(s, "p", "y"))  # p = 1/t sum_i y_i <x_i, T x_q>
            model.skip[l] = -select(s, "p", "p")  # the new p replaces the old
            for block, slot in enumerate(("tx", "tq")):  # eq. 29: h + [I 0; 0 0] h as W_out ReLU(W_in h)
                rows = slice(2 * d * block, 2 * d * block + 2 * d)
                eye = torch.eye(d)
                model.mlp_in[l, rows, s[slot]] = torch.cat([eye, -eye])
                model.mlp_out[l, s[slot], rows] = torch.cat([eye, -eye], dim=1)
        model.read[s["p"]] = 1.0
