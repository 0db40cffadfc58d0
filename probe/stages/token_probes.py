"""The report's [token_probes] stage (probe/core/stages.py): what each example's tokens hold of the
state a learner keeps (the analysis: probe/analysis/token_probes.py) - its settings, summary.json
block, figure, page section, findings line and evidence-table row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..analysis.token_probes import (
    TOKEN_KINDS,
    TOKEN_TARGETS,
    probed_tokens,
    settings_targets,
    token_estimates,
    token_probe_study,
)
from ..capture.streams import column_count
from ..core import budget
from ..core.config import Section, setting
from ..core.errors import ConfigError
from ..core.plotting import legend_outside, pyplot, save_png
from ..core.seeds import Stream
from ..core.stages import AnalysisStage, register_stage, streams_made_before
from ..core.validity import Domain, Validity
from ..models.sizes import shape_of


def _positive_number(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return 0 < value < float("inf")


@dataclass
class TokenProbeSettings(Section):
    """Per-token state probes (this module): recipe section [token_probes],
    `icl-probe token-probes`."""

    SECTION = "token_probes"
    enabled: bool = setting(True, "probe each example's tokens for S x, S^3 x and Newton's M_k x in reports")
    targets: tuple[str, ...] = setting(
        TOKEN_TARGETS[:3], "targets (also w_newton, w_gd, w_ols)", TOKEN_TARGETS, nonempty=True, noun="token target"
    )
    tokens: tuple[str, ...] = setting(
        TOKEN_KINDS,
        "token kinds probed (column: where the model keeps column tokens, a planted Newton model; left out elsewhere)",
        TOKEN_KINDS,
        nonempty=True,
        noun="token",
    )
    iterations: tuple[int, ...] = setting(tuple(range(9)), "Newton iteration counts k of newton_mx", minimum=0)
    alpha: str = setting(
        "auto",
        "newton_mx's M_0 = alpha S/t: auto (a planted Newton model's own alpha, else spectral), spectral, or a number",
    )
    gd_steps: tuple[int, ...] = setting((1, 2, 4, 8, 16, 32, 64), "GD step counts k of w_gd", minimum=0)
    eta: str = setting(
        "auto", "w_gd's step: auto (a planted GD model's own step, else 1 / lambda_max(S/t)) or a number"
    )
    prompts: int = setting(512, "training prompts")
    test: int = setting(256, "held-out prompts")

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, rules in (("eta", ("auto",)), ("alpha", ("auto", "spectral"))):
            if getattr(self, key) not in rules and not _positive_number(getattr(self, key)):
                raise ConfigError(
                    f"token_probes.{key} must be {', '.join(rules)} or a positive number, got {getattr(self, key)!r}"
                )

    def eta_for(self, model_config) -> float | str:
        """GD's step for a checkpoint: "auto" is a planted GD model's own fixed step, else 1/lambda_max."""
        if self.eta == "auto":
            return float(model_config.planted_scale) if model_config.planted == "gd" else "auto"
        return float(self.eta)

    def alpha_for(self, model_config) -> float | str:
        """The alpha rule for a checkpoint: "auto" is a planted Newton model's own fixed alpha."""
        if self.alpha == "auto":
            planted = model_config.planted in ("newton", "newton-relu")
            return float(model_config.planted_scale) if planted else "spectral"
        return self.alpha if self.alpha == "spectral" else float(self.alpha)


@dataclass
class TokenProbeSeries:
    """One per-token probe by layer: held-out R^2 and its gain over the floor (the same probe on the
    example's own x; at a column token, on its e_j), each with a 90% interval (the gain's paired)."""

    token: str
    target: str
    iterations: int | None
    floor_r2: float
    r2: list[float]
    r2_low: list[float]
    r2_high: list[float]
    gain: list[float]
    gain_low: list[float]
    gain_high: list[float]


@dataclass
class TokenProbes:
    """What each example's tokens hold of the state a learner keeps, layer by layer."""

    layer: list[int]
    series: list[TokenProbeSeries]
    definition: str = (
        "ridge read-out of each example token's residual stream, one map per layer and token kind, of (S/t) x, "
        "(S/t)^3 x and Newton's M_k x with S the normalised moment the token can see (at a planted Newton model's "
        "column token j: the matrices' column j); R^2 on held-out prompts"
    )


def token_probe_block(table: pd.DataFrame) -> TokenProbes:
    """summary.json's block: every probe's series by layer (rows of `fit_token_probes`)."""
    series = []
    for (token, target), rows in table.groupby(["token", "target"], sort=False):
        rows = rows.sort_values("layer")
        k = rows.iterations.iloc[0]
        series.append(
            TokenProbeSeries(
                token=str(token),
                target=str(target),
                iterations=None if pd.isna(k) else int(k),
                floor_r2=float(rows.floor_r2.iloc[0]),
                **{c: [float(v) for v in rows[c]] for c in COLUMNS},  # NaN: null in summary.json (strict)
            )
        )
    return TokenProbes(sorted(int(v) for v in table.layer.unique()), series)


COLUMNS = ("r2", "r2_low", "r2_high", "gain", "gain_low", "gain_high")


def token_probe_figure(table: pd.DataFrame, stem: Path) -> list[Path]:
    """R^2 of each per-token probe by layer (probe/analysis/token_probes.py), one panel per token
    kind, 90% bands; Newton's M_k x in shades of one colour by k."""
    plt = pyplot()
    tokens = list(dict.fromkeys(table.token))
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.8 * len(tokens), 3.4), squeeze=False, sharey=True)
    newton = sorted(table.iterations.dropna().unique())
    shades = plt.get_cmap("Blues")
    for ax, token in zip(axes[0], tokens):
        part = table[table.token == token]
        for i, (name, r) in enumerate(part.groupby("target", sort=False)):
            r = r.sort_values("layer")
            k = r.iterations.iloc[0]
            color = shades(0.35 + 0.6 * newton.index(k) / max(len(newton) - 1, 1)) if pd.notna(k) else f"C{i + 1}"
            ax.plot(r.layer, r.r2, "-o", ms=3, color=color, label=name)
            ax.fill_between(r.layer, r.r2_low, r.r2_high, color=color, alpha=0.12)
        ax.set(xlabel="layer boundary", title=f"{token} tokens", ylim=(min(-0.05, part.r2.min()), 1.02))
    axes[0][0].set_ylabel("held-out R^2")
    legend_outside(axes[0][-1], 7)
    return save_png(fig, stem)


def _best(block: TokenProbes, series: list[TokenProbeSeries], by: str) -> tuple[TokenProbeSeries, int]:
    """The series and layer index with the largest `by` (r2 or gain)."""
    return max(((s, i) for s in series for i in range(len(block.layer))), key=lambda p: getattr(p[0], by)[p[1]])


FAMILIES = (("sx", "S x"), ("s3x", "S^3 x"), ("newton_mx", "M_k x"))


HELD = 0.99  # R^2 at which a token holds Newton's M_k x as Fu et al.'s construction does
VALIDATED_ON = (
    "planted Newton and Newton-ReLU (M_k x held at R^2 1 where the constructions write it: newton); planted GD "
    "(nothing beyond x: undecided, never newton): tests/test_token_probes.py, tests/test_evidence.py"
)


# the conditions its known answers cover: planted Newton, Newton-ReLU and GD at d = 4, isotropic
TOKEN_DOMAIN = Validity(
    (Domain(d=(4, 4), kappa=(1, 1), readout=(), tests="tests/test_token_probes.py, tests/test_evidence.py"),),
    tested_against="planted GD (holds nothing beyond x)",
)


DESCRIPTION = (
    "What each example's tokens hold of the state a learner keeps: a Newton-type learner builds a d x d matrix "
    "from S = X^T X (Fu et al.'s construction keeps M_k x_i in example i's token; M_1 = 2 alpha S - alpha^2 S^3), "
    "GD keeps a d-vector. Per layer boundary and token kind (x token: the examples before it; y token: through "
    "it; a planted Newton model's column token j: column j of the matrices), one ridge map reads (S/t) x, "
    "(S/t)^3 x and M_k x (M_0 = alpha S/t) from the token's stream; held-out R^2 with 90% bands. At large t S/t "
    "is near I, so what the token alone holds (its x, or e_j) already gives part of S x: each layer is compared "
    "with that floor (the gain, with a paired interval, is in summary.json and data/token_probes.csv). Known "
    "answers: the planted Newton models hold M_k x exactly (R^2 1) where their constructions write it; the "
    "planted GD model holds no more than its raw tokens."
)


class TokenProbesStage(AnalysisStage):
    """State in the tokens: the report's `token_probes` stage (module docstring)."""

    name = "token_probes"
    papers = ("Fu et al. 2024: the Iterative Newton construction, whose tokens hold M_k x_i",)
    settings = TokenProbeSettings
    block = TokenProbes
    title = "State in the tokens"
    description = DESCRIPTION
    reads = ("similarity",)
    flags = (("test", "test-prompts"),)
    captions = (
        (
            "token_probes",
            "Held-out R^2 per layer boundary, one panel per token kind; Newton's M_k x in blue shades by k.",
        ),
    )

    def run(self, c) -> dict[str, pd.DataFrame]:
        """The [token_probes] settings on the report's checkpoint."""
        s = c.recipe.token_probes
        targets = settings_targets(s, c.ckpt.config.model)
        tokens = probed_tokens(c.ckpt.model, s.tokens)
        if not tokens:
            raise ConfigError(
                f"token_probes.tokens = {list(s.tokens)}: this {type(c.ckpt.model).__name__} keeps no column tokens "
                "(only planted linear-attention Newton models do): probe its x and y tokens"
            )
        return {
            "token_probes": token_probe_study(
                c.ckpt.model,
                c.ckpt.config.task,
                targets,
                s.prompts,
                s.test,
                c.recipe.prompts.seed,
                c.device,
                tokens,
                c.recipe.similarity.bootstrap,
                c.streams.reader(self.name),  # the probe study's streams of the same prompts, where it kept them
            )
        }

    def summarise(self, tables, recipe):
        return token_probe_block(tables["token_probes"])

    def probe_stream_sets(self, recipe, ckpt) -> tuple[tuple[int, int], ...]:
        """The training and test streams, where made a block of layers at a time (`token_probe_study`:
        a model that resumes a forward from a layer, no column tokens probed)."""
        s = recipe.token_probes
        if "column" in probed_tokens(ckpt.model, s.tokens) or not getattr(ckpt.model, "key_value_cache", False):
            return ()
        return ((Stream.PROBE_TRAIN, s.prompts), (Stream.PROBE_TEST, s.test))

    def figures(self, tables: dict[str, pd.DataFrame], fig_dir: Path, context) -> dict[str, Path]:
        return {"token_probes": token_probe_figure(tables["token_probes"], fig_dir / "token_probes")[0]}

    def estimates(self, recipe, ckpt) -> list[budget.Estimate]:
        s = recipe.token_probes
        targets, tokens = settings_targets(s, ckpt.config.model), probed_tokens(ckpt.model, s.tokens)
        columns = column_count(ckpt.model) if "column" in tokens else 0
        shape, points = shape_of(ckpt.config.model), ckpt.config.task.n_points
        made = streams_made_before(self.name, recipe, ckpt)  # read from the probe study's, not run again
        own = zip(("token_probes.prompts", "token_probes.test"), self.probe_stream_sets(recipe, ckpt))
        read = tuple(knob for knob, prompt_set in own if prompt_set in made)
        return token_estimates(
            shape, points, s.prompts, s.test, recipe.similarity.bootstrap, targets, len(tokens), columns, read
        )

    def findings(self, block: TokenProbes, summary) -> str | None:
        """Per token kind: the largest gain over the floor (the example x alone; at a column token its
        e_j) of S x and S^3 x, and of Newton's M_k x (over k); at column tokens, the matrices' columns."""
        parts = []
        for token in dict.fromkeys(s.token for s in block.series):
            column = token == "column"
            floor = "e_j alone" if column else "x alone"
            for name, words in FAMILIES:
                words = words.replace(" x", " columns") if column else words
                series = [s for s in block.series if s.token == token and s.target.startswith(name)]
                if not series:
                    continue
                best, i = _best(block, series, "gain")
                k = "" if best.iterations is None else f", k = {best.iterations}"
                parts.append(
                    f"{words} at {token} tokens: R^2 {best.r2[i]:.2f} at layer {block.layer[i]}{k}, "
                    f"{best.gain[i]:+.2f} [{best.gain_low[i]:+.2f}, {best.gain_high[i]:+.2f}] over {floor} "
                    f"({best.floor_r2:.2f})"
                )
        intro = "State in the tokens (the largest gain over a probe of what the token alone holds): "
        return intro + "; ".join(parts) + "." if parts else None

    def tables(self, block: TokenProbes, summary, tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Per token kind and target family, the layer with the largest gain over the floor."""
        rows = []
        for token in dict.fromkeys(s.token for s in block.series):
            for name, words in FAMILIES:
                series = [s for s in block.series if s.token == token and s.target.startswith(name)]
                if series:
                    s, i = _best(block, series, "gain")
                    rows.append(
                        {
                            "token": token,
                            "target": words.replace(" x", " columns") if token == "column" else words,
                            "k": "" if s.iterations is None else s.iterations,
                            "layer": block.layer[i],
                            "R^2": s.r2[i],
                            "floor R^2": s.floor_r2,
                            "gain": s.gain[i],
                            "gain 90%": f"[{s.gain_low[i]:+.3f}, {s.gain_high[i]:+.3f}]",
                        }
                    )
        return {
            "The largest gain over the floor per token kind and target (Newton's M_k x: over k)": pd.DataFrame(rows)
        }

    def evidence(self, block: TokenProbes, summary, a: str, b: str) -> list[dict]:
        """The evidence table's row for Newton against GD: newton where some layer's token holds M_k x at
        R^2 >= HELD beyond what the token alone gives, for some k >= 1 (M_0 x is not counted); otherwise
        undecided (a model without that state is not thereby GD)."""
        # M_0 x = alpha (S/t) x is one linear-attention head's output, not a Newton iterate: k >= 1 only
        newton = [s for s in block.series if s.target.startswith("newton_mx") and s.iterations]
        if {a, b} != {"newton", "gd"} or not newton:
            return []
        s, i = _best(block, newton, "r2")
        held = s.r2[i] >= HELD and s.gain_low[i] > 0
        return [
            {
                "instrument": "state in the tokens",
                "favours": "newton" if held else None,
                "effect": f"best M_k x probe: R^2 {s.r2[i]:.3f} [{s.r2_low[i]:.3f}, {s.r2_high[i]:.3f}] at layer "
                f"{block.layer[i]}, k = {s.iterations}, {s.token} tokens ({'e_j' if s.token == 'column' else 'x'} alone "
                f"{s.floor_r2:.2f}); held as the construction holds it at R^2 >= {HELD}",
                "validated_on": VALIDATED_ON,
                "domain": TOKEN_DOMAIN,
                "cannot_tell_apart": "a model without a per-token Newton state may keep it in another form (spread over "
                "tokens, nonlinear): absence never reads as GD",
            }
        ]


TOKEN_PROBES = register_stage(TokenProbesStage())
