"""How each construction's weights are set: one function per construction (`PLANTS`) and `plant`,
which builds a PlantedICL and writes them. The constructions, their layouts and the equations
they implement are described in probe/models/planted.py, the architecture they run on."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.config import ModelConfig
from .adam_psi import ADAM_BETAS, psi, psi_knots
from .planted import ADAM_LAYERS_PER_STEP, PRNG_READ_BITS, Layout, PlantedICL, planted_bytes
from .xorshift import PRNG_BITS, xorshift32_matrix


def _sel(layout: Layout, width: int, rows: str, cols: str, scale: float = 1.0) -> Tensor:
    """A (width, width) matrix copying slot `cols` of the input into slot `rows` of the output."""
    m = torch.zeros(width, width)
    r, c = layout[rows], layout[cols]
    m[r, c] = scale * torch.eye(r.stop - r.start)
    return m


def _plant_relu_newton(model: PlantedICL) -> None:
    """Seed 003 Thm. 1 with ReLU attention (planted.py's docstring): head pairs (2k, 2k+1) form a.V."""
    s, w, alpha = model.layout, model.layout.width, model.config.planted_scale

    def pair(l: int, k: int, q: Tensor, key: Tensor, v: Tensor) -> None:
        for head, sign in ((2 * k, 1.0), (2 * k + 1, -1.0)):  # ReLU(a) V + ReLU(-a) (-V) = a V
            model.q[l, head], model.k[l, head], model.v[l, head] = sign * q, key, sign * v
            model.per_example[l, head] = 1  # sigma(a) = ReLU(a) / t

    x_key = _sel(s, w, "x", "x")
    pair(0, 0, _sel(s, w, "x", "x"), x_key, _sel(s, w, "tx", "x", alpha))  # eq. 21: tx = alpha S/t x_t
    pair(0, 1, _sel(s, w, "x", "xq"), x_key, _sel(s, w, "tq", "x", alpha))  # and tq = alpha S/t x_q
    d = model.n_dims
    for l in range(1, model.config.n_layer):
        t_key = _sel(s, w, "x", "tx")  # keys T x_j of the examples
        pair(l, 0, _sel(s, w, "x", "x", -0.5), t_key, _sel(s, w, "tx", "tx"))  # eq. 28: T x - 1/2 T S/t T x
        pair(l, 1, _sel(s, w, "x", "xq", -0.5), t_key, _sel(s, w, "tq", "tx"))  # the same for the query
        pair(l, 2, _sel(s, w, "x", "tq"), x_key, _sel(s, w, "p", "y"))  # p = 1/t sum_i y_i <x_i, T x_q>
        model.skip[l] = -_sel(s, w, "p", "p")  # the new p replaces the old
        for block, slot in enumerate(("tx", "tq")):  # eq. 29: h + [I 0; 0 0] h as W_out ReLU(W_in h)
            rows = slice(2 * d * block, 2 * d * block + 2 * d)
            eye = torch.eye(d)
            model.mlp_in[l, rows, s[slot]] = torch.cat([eye, -eye])
            model.mlp_out[l, s[slot], rows] = torch.cat([eye, -eye], dim=1)
    model.read[s["p"]] = 1.0


def _plant_sgd(model: PlantedICL) -> None:
    """Seed 000 Thm. 4 (planted.py's docstring): masked GD steps, gates by a two-ReLU MLP."""
    from ..learners.stochastic import minibatch_masks

    cfg, s, w = model.config, model.layout, model.layout.width
    model.masks.copy_(minibatch_masks(cfg.n_layer, cfg.n_positions, cfg.planted_batch, cfg.planted_seed))
    for l in range(cfg.n_layer):
        model.q[l, 0] = _sel(s, w, "x", "x") + _sel(s, w, "x", "xq")
        model.k[l, 0] = _sel(s, w, "x", "x")
        model.v[l, 0] = _sel(s, w, "r", "g", -cfg.planted_scale)  # r_j -= eta/|B| sum_i g_i <x_i, x_j>
        model.per_example[l, 0] = 1
        model.skip[l] = -_sel(s, w, "g", "g")
        if l + 1 < cfg.n_layer:  # the next step's gate, from b_{l+1}
            _gate_mlp(model, l, s["b"].start + l + 1)
    model.read[s["r"]] = -1.0


def _plant_adam(model: PlantedICL) -> None:
    """Seed 000 Thm. 5 (planted.py's docstring): layers (A) gradient, (B) moments and psi, (C) the step
    direction, (D) the update and the next gates."""
    from ..learners.stochastic import minibatch_masks

    cfg, s, w, d = model.config, model.layout, model.layout.width, model.config.n_dims
    (b1, b2), steps = ADAM_BETAS, cfg.n_layer // ADAM_LAYERS_PER_STEP
    model.masks.copy_(minibatch_masks(steps, cfg.n_positions, cfg.planted_batch, cfg.planted_seed))
    knots = psi_knots()
    values, width = psi(knots), torch.diff(knots)
    for k in range(1, steps + 1):
        a_, b_, c_, d_ = (ADAM_LAYERS_PER_STEP * (k - 1) + i for i in range(4))
        model.q[a_, 0], model.k[a_, 0] = _sel(s, w, "g", "flag"), _sel(s, w, "g", "g")  # (A) G = mean g_i x_i
        model.v[a_, 0], model.per_example[a_, 0] = _sel(s, w, "G", "x"), 1
        model.skip[a_] = -_sel(s, w, "g", "g")
        for coord in range(d):  # (B) (1 - b2) G_c^2 into v_c: the query with itself
            model.q[b_, coord, s["G"].start + coord, s["G"].start + coord] = 1.0
            model.k[b_, coord, s["G"].start + coord, s["G"].start + coord] = 1.0
            model.v[b_, coord, s["v"].start + coord, s["flag"].start] = 1 - b2
        model.skip[b_] = (
            (b1 - 1) * _sel(s, w, "m", "m") - (1 - b1) * _sel(s, w, "m", "G") + (b2 - 1) * _sel(s, w, "v", "v")
        ) - _sel(s, w, "G", "G")
        scale = 1 - b2**k  # P_c = psi(v_c / (1 - b2^k)) by relu_segments: z_j = (v / scale - t_j) / dt_j
        segments = len(width)
        for coord in range(d):
            low, high = (
                slice(2 * segments * coord, 2 * segments * coord + segments),
                slice(2 * segments * coord + segments, 2 * segments * (coord + 1)),
            )
            for units, offset, sign in ((low, 0.0, 1.0), (high, 1.0, -1.0)):  # ReLU(-z), ReLU(1 - z)
                model.mlp_in[b_, units, s["v"].start + coord] = (-1 / (scale * width)).float()
                model.mlp_in[b_, units, s["flag"].start] = (offset + knots[:-1] / width).float()
                model.mlp_out[b_, s["P"].start + coord, units] = (sign * torch.diff(values)).float()
            model.skip[b_, s["P"].start + coord, s["flag"].start] += float(values[-1])
        for coord in range(d):  # (C) u_c = m_c P_c / (1 - b1^k)
            model.q[c_, coord, s["m"].start + coord, s["m"].start + coord] = 1.0
            model.k[c_, coord, s["m"].start + coord, s["flag"].start] = 1.0
            model.v[c_, coord, s["u"].start + coord, s["P"].start + coord] = 1 / (1 - b1**k)
        model.skip[c_] = -_sel(s, w, "P", "P")
        model.q[d_, 0] = _sel(s, w, "u", "x") + _sel(s, w, "u", "xq")  # (D) r_j += eta u.x_j
        model.k[d_, 0] = _sel(s, w, "u", "u")
        model.v[d_, 0] = _sel(s, w, "r", "flag", cfg.planted_scale)
        model.skip[d_] = -_sel(s, w, "u", "u")
        if k < steps:
            _gate_mlp(model, d_, s["b"].start + k)
    model.read[s["r"]] = -1.0


def _gate_mlp(model: PlantedICL, layer: int, bit: int) -> None:
    """The layer's MLP writes g = ReLU(r - R(1 - b)) - ReLU(-r - R(1 - b)) = b r for |r| <= R."""
    s, bound = model.layout, model.config.planted_bound
    for unit, sign in ((0, 1.0), (1, -1.0)):
        model.mlp_in[layer, unit, s["r"]] = sign
        model.mlp_in[layer, unit, s["one"]] = -bound
        model.mlp_in[layer, unit, bit] = bound
        model.mlp_out[layer, s["g"], unit] = sign


def _plant_uniform(model: PlantedICL) -> None:
    """Seed 000 Thm. 2, eq. 17 (planted.py's docstring): the held-out coordinate's empirical CDF."""
    s, w, a = model.layout, model.layout.width, 1.0 / (4 * model.config.planted_scale)
    for head, (offset, sign) in enumerate(((0.5, 1.0), (-0.5, -1.0))):
        q = _sel(s, w, "one", "z", a) + _sel(s, w, "z", "qone")  # [a z, 1]
        k = _sel(s, w, "one", "one") + offset * _sel(s, w, "z", "one")  # [1, offset - a x_1]
        k[s["z"].start, s["x"].start] = -a
        model.q[0, head], model.k[0, head] = q, k
        model.v[0, head] = _sel(s, w, "u", "one", sign)
        model.per_example[0, head] = 1  # 1 / (t - 1): the keys
    model.read[s["u"]] = 1.0


def _plant_prng(model: PlantedICL) -> None:
    """Seed 000 Thm. 3 (planted.py's docstring): head m emits A^m s_0, the MLP reduces mod 2."""
    s, w, k, m_out = model.layout, model.layout.width, PRNG_BITS, model.config.n_head
    a, power = xorshift32_matrix(), torch.eye(PRNG_BITS, dtype=torch.float64)
    o = s["o"].start
    for m in range(m_out):
        power = (a @ power) % 2  # A^(m+1)
        model.q[0, m], model.k[0, m] = _sel(s, w, "first", "qone"), _sel(s, w, "first", "first")
        model.v[0, m, o + m * k : o + (m + 1) * k, s["s"]] = power.float()
    units = 0
    for bit in range(m_out * k):  # c mod 2 - c = sum_j (-1)^j 2 ReLU(c - j), exact on integers 0..k
        for j in range(1, k + 1):
            model.mlp_in[0, units, o + bit] = 1.0
            model.mlp_in[0, units, s["qone"]] = -float(j)
            model.mlp_out[0, o + bit, units] = 2.0 * (-1) ** j
            units += 1
    model.read[o : o + PRNG_READ_BITS] = 2.0 ** -torch.arange(1, PRNG_READ_BITS + 1, dtype=torch.float32)


def _plant_gd(model: PlantedICL) -> None:
    """von Oswald et al.'s GD (planted.py's docstring): one head per layer, r_j -= eta/t sum_i r_i <x_i, x_j>."""
    cfg, s, w = model.config, model.layout, model.layout.width
    for l in range(cfg.n_layer):
        model.q[l, 0] = _sel(s, w, "x", "x") + _sel(s, w, "x", "xq")  # query: x_j (or x_q)
        model.k[l, 0] = _sel(s, w, "x", "x")  # keys: examples' x (zero elsewhere)
        model.v[l, 0] = _sel(s, w, "r", "r", -cfg.planted_scale)
        model.per_example[l, 0] = 1
    model.read[s["r"]] = -1.0


def _plant_newton(model: PlantedICL) -> None:
    """Iterative Newton with linear attention and column tokens (planted.py's docstring)."""
    cfg, s, w = model.config, model.layout, model.layout.width
    alpha = cfg.planted_scale
    # layer 0: M_0 = alpha S/t into the column tokens, b = X^T y / t into the query
    model.q[0, 0], model.k[0, 0], model.v[0, 0] = (
        _sel(s, w, "x", "e"),
        _sel(s, w, "x", "x"),
        _sel(s, w, "m", "x", alpha),
    )
    model.q[0, 1], model.k[0, 1], model.v[0, 1] = (
        _sel(s, w, "one", "one"),
        _sel(s, w, "one", "y"),
        _sel(s, w, "b", "x"),
    )
    model.per_example[0] = 1
    for l in range(1, cfg.n_layer):
        if l % 2 == 1:  # (A) u_j = S m_j / t; z = M x_q
            model.q[l, 0], model.k[l, 0], model.v[l, 0] = (
                _sel(s, w, "x", "m"),
                _sel(s, w, "x", "x"),
                _sel(s, w, "u", "x"),
            )
            model.per_example[l, 0] = 1
            model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                _sel(s, w, "e", "xq"),
                _sel(s, w, "e", "e"),
                _sel(s, w, "z", "m"),
            )
        else:  # (B) m_j <- 2 m_j - M u_j, clear u; p = b . M x_q via examples, clear z
            model.q[l, 0], model.k[l, 0], model.v[l, 0] = (
                _sel(s, w, "e", "u"),
                _sel(s, w, "e", "e"),
                _sel(s, w, "m", "m", -1.0),
            )
            model.q[l, 1], model.k[l, 1], model.v[l, 1] = (
                _sel(s, w, "x", "z"),
                _sel(s, w, "x", "x"),
                _sel(s, w, "p", "y"),
            )
            model.per_example[l, 1] = 1
            model.skip[l] = _sel(s, w, "m", "m") - _sel(s, w, "u", "u") - _sel(s, w, "z", "z") - _sel(s, w, "p", "p")
    model.read[s["p"]] = 1.0


PLANTS = {
    "gd": _plant_gd,
    "newton": _plant_newton,
    "newton-relu": _plant_relu_newton,
    "sgd": _plant_sgd,
    "adam": _plant_adam,
    "uniform": _plant_uniform,
    "prng": _plant_prng,
}  # one function per construction (config.PLANTED_ALGORITHMS)


def plant(cfg: ModelConfig) -> PlantedICL:
    """A PlantedICL with the weights of its construction (probe/models/planted.py's docstring); refused before
    any allocation when its weights would not fit in memory."""
    from ..core.validate import check_memory

    check_memory(
        planted_bytes(cfg),
        f"a planted {cfg.planted} model with {cfg.n_layer} layers (d = {cfg.n_dims})",
        "use fewer layers",
    )
    model = PlantedICL(cfg)
    with torch.no_grad():
        PLANTS[cfg.planted](model)
    return model
