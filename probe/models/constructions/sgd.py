"""Minibatch SGD (`planted="sgd"`, eta = planted_scale, K = planted_batch; Hataya & Imaizumi 2024, Thm. 4, eq. 9).

The GD construction (probe/models/constructions/gd.py) with Hataya & Imaizumi 2024's minibatch masks
(Assumption 1). Tokens [x, r, xq, one, b (L), g]; example i of run t carries the bits
b_l = masks[l, t, i] (min(K, t) distinct examples of prefix t per step, from
`minibatch_masks(L, n, K, planted_seed)`, kept as the `masks` buffer and replayed by the `sgd`
learner with masks_seed = planted_seed). Layer l: one linear head
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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...core.errors import ConfigError
from ...core.seeds import Stream, stream_seed
from ...core.settings import SweepSettings
from ...data.positions import prefix_mask
from ...learners import LEARNERS
from ...learners.stochastic import STOCHASTIC_STEPS, minibatch_masks
from .base import Construction, PlantOptions, check_step, construction, gd_stable_limit, select
from .gd import fit_gd_sweeps

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..planted import PlantedICL

SGD_BOUND = 1000.0  # R: the gradient is exact while every |residual| <= R


def gate_mlp(model: PlantedICL, layer: int, bit: int) -> None:
    """The layer's MLP writes g = ReLU(r - R(1 - b)) - ReLU(-r - R(1 - b)) = b r for |r| <= R."""
    s, bound = model.layout, model.config.planted_bound
    for unit, sign in ((0, 1.0), (1, -1.0)):
        model.mlp_in[layer, unit, s["r"]] = sign
        model.mlp_in[layer, unit, s["one"]] = -bound
        model.mlp_in[layer, unit, bit] = bound
        model.mlp_out[layer, s["g"], unit] = sign


@construction
class SGD(Construction):
    name = "sgd"
    title = "minibatch SGD with seeded masks (Hataya & Imaizumi 2024, Thm. 4)"
    learner = "sgd"
    first, per_step = 0, 1
    matching_sweep = "sgd_replay"

    def slots(self, cfg: ModelConfig) -> list[tuple[str, int]]:
        d = cfg.n_dims
        return [("x", d), ("r", 1), ("xq", d), ("one", 1), ("b", self.mask_steps(cfg)), ("g", 1)]

    def d_mlp(self, cfg: ModelConfig) -> int:
        return 2

    def mask_steps(self, cfg: ModelConfig) -> int:
        return cfg.n_layer // self.per_step

    def tokens(self, model: PlantedICL, h: Tensor, xs: Tensor, ys: Tensor) -> tuple[Tensor, Tensor]:
        """Examples carry (x, y, 1), their mask bits and step 1's gate b_1 y; divisor |B_t| = min(K, t)."""
        n, s = xs.shape[1], model.layout
        seen = prefix_mask(n, xs.device).to(xs.dtype).view(1, n, n, 1)
        masks = model.masks[:, :n, :n].to(xs.dtype)  # (L, run t, i)
        h[:, :, :n, s["x"]] = xs.unsqueeze(1) * seen
        h[:, :, :n, s["r"]] = ys.view(-1, 1, n, 1) * seen
        h[:, :, :n, s["one"]] = seen.expand(h.shape[0], n, n, 1)
        h[:, :, :n, s["b"]] = masks.permute(1, 2, 0).unsqueeze(0).expand(h.shape[0], n, n, -1)
        h[:, :, :n, s["g"]] = (ys.view(-1, 1, n) * masks[0]).unsqueeze(-1)  # step 1's gate b_1 y (w_0 = 0)
        h[:, :, -1, s["xq"]] = xs
        h[:, :, -1, s["one"]] = 1.0
        return h, masks[0].sum(-1)

    def plant_masks(self, model: PlantedICL) -> None:
        cfg = model.config
        model.masks.copy_(minibatch_masks(self.mask_steps(cfg), cfg.n_positions, cfg.planted_batch, cfg.planted_seed))

    def plant(self, model: PlantedICL) -> None:
        """Masked GD steps, gates by a two-ReLU MLP."""
        cfg, s = model.config, model.layout
        self.plant_masks(model)
        for l in range(cfg.n_layer):
            model.q[l, 0] = select(s, "x", "x") + select(s, "x", "xq")
            model.k[l, 0] = select(s, "x", "x")
            model.v[l, 0] = select(s, "r", "g", -cfg.planted_scale)  # r_j -= eta/|B| sum_i g_i <x_i, x_j>
            model.per_example[l, 0] = 1
            model.skip[l] = -select(s, "g", "g")
            if l + 1 < cfg.n_layer:  # the next step's gate, from b_{l+1}
                gate_mlp(model, l, s["b"].start + l + 1)
        model.read[s["r"]] = -1.0

    def step_size(self, layers: int, d: int, options: PlantOptions) -> float:
        limit = gd_stable_limit(d)
        return check_step(limit / 2 if options.step_size is None else options.step_size, limit, d, "SGD")

    def model_fields(self, layers: int, d: int, options: PlantOptions) -> dict[str, Any]:
        step = self.step_size(layers, d, options)
        if options.batch < 1:
            raise ConfigError(f"--batch must be an integer >= 1, got {options.batch}")
        return {
            "n_head": 1,
            "planted_scale": step,
            "planted_batch": options.batch,
            "planted_seed": options.seed,
            "planted_bound": SGD_BOUND,
        }

    def adapt_sweeps(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        self.add_replays(sweeps, cfg)
        fit_gd_sweeps(sweeps, cfg)

    def add_replays(self, sweeps: list[SweepSettings], cfg: ModelConfig) -> None:
        """Its learner replaying the model's masks (`<name>_replay`) and masks of another seed
        (`<name>_other`, the model seed's other-masks stream: what a user without the model's seed meets), at every step up to the depth."""
        steps = sorted(set(STOCHASTIC_STEPS) | set(range(cfg.n_layer // self.per_step + 1)))
        title = LEARNERS.get(self.learner).label
        present = {s.label for s in sweeps}
        for suffix, seed, which in (
            ("replay", cfg.planted_seed, "the model's minibatches"),
            ("other", stream_seed(cfg.planted_seed, Stream.OTHER_MASKS), "other minibatches"),
        ):
            if f"{self.name}_{suffix}" not in present:
                grid = {
                    "steps": steps,
                    "eta": [cfg.planted_scale],
                    "batch_size": [cfg.planted_batch],
                    "masks_seed": seed,
                }
                sweeps.append(SweepSettings(f"{self.name}_{suffix}", self.learner, "steps", grid, f"{title} ({which})"))
