"""Report recipes: TOML files in analyses/ saying what a report runs.

    [prompts]     evaluate, train, val, eval, simw, queries, seed
    [readout]     method ("ridge" | "adam" | "model"), alphas, finetune_steps
    [similarity]  include_first, bootstrap, simw
    [[sweeps]]    label, learner, axis, grid = { ... }   (one per heatmap family)
    [probes]      enabled, kinds, targets, steps, lr, prompts, controls
    [forgetting]  enabled, prompts, learners (as [[sweeps]] entries)
    [interventions] enabled, prompts, patch_prompts, kinds, heads, sites, learners (causal checks)

Flags override recipe values (`--set prompts.eval=256`); the resolved recipe is written into
the report. Unknown keys and unknown learners fail before any heavy work.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import from_dict, load_recipe, merge, to_dict
from ..errors import ConfigError
from ..learners import LEARNERS
from ..resources import RECIPE_DIR
from ..validate import check_grid, finite_float, positive_int

AUTO_CAUSAL_SWEEPS = ("newton", "gd_log")
SWEEP_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass
class PromptsSection:
    evaluate: int = 1280  # prompts for error vs examples (Garg et al.'s 1280)
    train: int = 2048  # read-out / probe training prompts
    val: int = 512
    eval: int = 512  # held-out prompts for SimE, read-out errors
    simw: int = 128  # prompts for SimW and the span test
    queries: int = 0  # fresh queries per prefix for SimW (0: 4 d)
    seed: int = 0


@dataclass
class ReadoutSection:
    method: str = "ridge"
    alphas: tuple[float, ...] = (1e-6, 1e-4, 1e-2, 1.0)
    finetune_steps: int = 500


@dataclass
class SimilaritySection:
    include_first: bool = False
    bootstrap: int = 1000
    simw: bool = True


@dataclass
class SweepSection:
    label: str
    learner: str
    axis: str | None = None
    grid: dict[str, Any] = field(default_factory=dict)


@dataclass
class ProbesSection:
    enabled: bool = True
    kinds: tuple[str, ...] = ("linear", "mlp")
    targets: tuple[str, ...] = ("xty", "w_ols")
    steps: int = 300  # the most Adam steps (probes stop once their validation R^2 settles)
    lr: tuple[float, ...] = (1e-2,)  # several: chosen per probe on validation prompts
    hidden: tuple[int, ...] = (128,)  # MLP widths, chosen the same way
    patience: int = 5
    eval_every: int = 25
    prompts: int = 1024  # training prompts, a fifth held out for validation
    controls: bool = True


@dataclass
class ForgettingSection:
    enabled: bool = True
    prompts: int = 512
    # learners whose forgetting curves are drawn beside the model's (seed 003 App. A.4, Fig. 11)
    learners: list[SweepSection] = field(
        default_factory=lambda: [
            SweepSection("newton[3]", "newton", grid={"iterations": [3]}),
            SweepSection("newton[10]", "newton", grid={"iterations": [10]}),
            SweepSection("ogd", "ogd"),
            SweepSection("least_squares", "least_squares"),
        ]
    )


@dataclass
class InterventionsSection:
    """Causal checks (probe/interventions): ablations, the patching heatmap, and iteration-consistent
    patching of the SimE layer maps of the sweeps named in `learners`."""

    enabled: bool = True
    prompts: int = 256  # ablation prompts (and as many held out for mean-ablation)
    patch_prompts: int = 128  # clean / corrupted prompt pairs for patching
    kinds: tuple[str, ...] = ("zero", "mean", "skip")
    heads: bool = True  # single heads and MLPs (false: per-layer skips only)
    sites: tuple[str, ...] = ("resid",)
    max_positions: int = 0  # patching heatmap: the query token and this many - 1 before it (0: every token)
    max_queries: int = 0  # layer-map check: pool at most this many numbers of examples (0: all)
    learners: tuple[str, ...] = (
        "auto",
    )  # sweep labels whose layer maps are checked; auto: newton and gd_log if present

    def learner_labels(self, sweeps: list) -> list[str]:
        if tuple(self.learners) == ("auto",):
            return [s.label for s in sweeps if s.label in AUTO_CAUSAL_SWEEPS and s.axis]
        return list(self.learners)


def _check_sweep(s: SweepSection, what: str) -> None:
    """A learner sweep's learner, grid keys and axis exist; its grid is validated in place."""
    spec = LEARNERS.get(s.learner)  # unknown learner -> close-match suggestion
    unknown = set(s.grid) - set(spec.defaults)
    if unknown:
        raise ConfigError(
            f"{what} '{s.label}': learner '{s.learner}' has no hyper-parameter {sorted(unknown)}; "
            f"it takes {sorted(spec.defaults)}"
        )
    if s.axis is not None and s.axis not in spec.defaults:
        raise ConfigError(f"{what} '{s.label}': axis '{s.axis}' is not a hyper-parameter of '{s.learner}'")
    s.grid = check_grid(s.learner, s.grid, where=f"{what} '{s.label}'")


@dataclass
class Recipe:
    name: str = "quick"
    description: str = ""
    prompts: PromptsSection = field(default_factory=PromptsSection)
    readout: ReadoutSection = field(default_factory=ReadoutSection)
    similarity: SimilaritySection = field(default_factory=SimilaritySection)
    sweeps: list[SweepSection] = field(default_factory=list)
    probes: ProbesSection = field(default_factory=ProbesSection)
    forgetting: ForgettingSection = field(default_factory=ForgettingSection)
    interventions: InterventionsSection = field(default_factory=InterventionsSection)

    def __post_init__(self) -> None:
        self.sweeps = [s if isinstance(s, SweepSection) else from_dict(SweepSection, s, "sweeps") for s in self.sweeps]
        if not self.sweeps:
            raise ConfigError("a recipe needs at least one [[sweeps]] entry")
        labels = [s.label for s in self.sweeps]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"sweep labels must be unique, got {labels}")
        for s in self.sweeps:
            _check_sweep(s, "sweep")
            if not SWEEP_LABEL.fullmatch(s.label):
                raise ConfigError(
                    f"sweep label {s.label!r} must be letters, digits, '_', '-' or '.' "
                    "(it names output files), e.g. gd_log"
                )
        for s in self.forgetting.learners:
            _check_sweep(s, "forgetting learner")
        self._check_numbers()
        if self.readout.method not in ("ridge", "adam", "model"):
            raise ConfigError(f"readout.method must be 'ridge', 'adam' or 'model', got {self.readout.method!r}")
        for kind in self.probes.kinds:
            if kind not in ("linear", "mlp"):
                raise ConfigError(f"probes.kinds: unknown probe kind '{kind}' (linear, mlp)")
        for target in self.probes.targets:
            if target not in ("xty", "w_ols"):
                raise ConfigError(f"probes.targets: unknown target '{target}' (xty, w_ols)")

        self._check_interventions()

    def _check_interventions(self) -> None:
        iv = self.interventions
        for kind in iv.kinds:
            if kind not in ("zero", "mean", "skip"):
                raise ConfigError(f"interventions.kinds: unknown ablation kind '{kind}' (zero, mean, skip)")
        for site in iv.sites:
            if site not in ("resid", "attn_out", "mlp_out"):
                raise ConfigError(f"interventions.sites: unknown site '{site}' (resid, attn_out, mlp_out)")
        with_axis = [s.label for s in self.sweeps if s.axis]
        for label in iv.learner_labels(self.sweeps):
            if label not in with_axis:
                raise ConfigError(
                    f"interventions.learners: '{label}' is not a sweep with an iteration axis in this "
                    f"recipe; choose among {with_axis}"
                )
        positive_int(iv.prompts, "interventions.prompts")
        positive_int(iv.patch_prompts, "interventions.patch_prompts")
        positive_int(iv.max_positions, "interventions.max_positions", 0)
        positive_int(iv.max_queries, "interventions.max_queries", 0)

    def _check_numbers(self) -> None:
        p = self.prompts
        for name in ("evaluate", "train", "val", "eval", "simw"):
            positive_int(getattr(p, name), f"prompts.{name}")
        positive_int(p.queries, "prompts.queries", 0)
        positive_int(self.similarity.bootstrap, "similarity.bootstrap")
        positive_int(self.readout.finetune_steps, "readout.finetune_steps", 0)
        if not self.readout.alphas:
            raise ConfigError("readout.alphas is empty; give at least one ridge penalty, e.g. [1e-4, 1e-2]")
        for a in self.readout.alphas:
            finite_float(a, "readout.alphas", low=0.0)
        positive_int(self.probes.steps, "probes.steps")
        positive_int(self.probes.prompts, "probes.prompts", 2)
        positive_int(self.probes.patience, "probes.patience")
        positive_int(self.probes.eval_every, "probes.eval_every")
        if not self.probes.lr or not self.probes.hidden:
            raise ConfigError("probes.lr and probes.hidden need at least one value each, e.g. lr = [1e-2, 1e-3]")
        for lr in self.probes.lr:
            finite_float(lr, "probes.lr", low=0.0)
        for width in self.probes.hidden:
            positive_int(width, "probes.hidden")
        positive_int(self.forgetting.prompts, "forgetting.prompts")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def digest(self, *sections: str) -> str:
        """Hash of the named sections (all when none): the cache key of a stage."""
        data = self.to_dict()
        part = {k: data[k] for k in sections} if sections else data
        return hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_recipe(name_or_path: str | None, overrides: list[dict[str, Any]] | None = None) -> Recipe:
    """A recipe by name (analyses/<name>.toml) or path, with overrides applied and validated."""
    name_or_path = name_or_path or "quick"
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPE_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            from ..registry import unknown_name_message

            known = sorted(p.stem for p in RECIPE_DIR.glob("*.toml") if "[[sweeps]]" in p.read_text())
            raise ConfigError(unknown_name_message("recipe", name_or_path, known) + " (or pass a path to a .toml file)")
    data = load_recipe(path)
    data.setdefault("name", path.stem)
    for override in overrides or []:
        data = merge(data, override)
    return from_dict(Recipe, data)
