"""summary.json's schema as dataclasses (README, "summary.json").

The report builds a `Summary` (probe/reporting/summary.py) and writes `summary.to_json()`; the
findings and the page read its attributes. `Summary.from_json(json.load(f))` reads a written
file back. Lists inside an entry are aligned by position (readout.layer[i] goes with
readout.error[i]). Fields with OMIT metadata are left out of the JSON when None; blocks the
schema does not interpret (recipe, versions, compare) stay plain dicts.
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from ..core.errors import ConfigError
from ..core.stages import DEFINITIONS, OMIT, RESERVED, by_block_key, dataclasses_in
from .dataclass_schema import MERGED, schema_of

SCHEMA_VERSION = 5  # 3: `verdicts`; 4: `spectral`, `evidence`, verdicts' `winner`; 5: trend and probe intervals, map checks' `confirmed`


def to_json(value: Any) -> Any:
    """Dataclasses -> dicts (in field order, optional Nones left out), recursively."""
    if hasattr(value, "to_json_value"):  # a block written in its own layout, of values converted here
        return to_json(value.to_json_value())
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("merged"):  # registered analyses' blocks, each under its own key
                out.update(to_json(item))
            elif not (f.metadata.get("omit_if_none") and item is None):
                out[f.name] = to_json(item)
        return out
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_json(item) for item in value]
    return value


def strict(value: Any) -> Any:
    """A JSON value with every NaN or infinity as null, so that strict parsers (JavaScript's
    JSON.parse) read summary.json: a number that is not defined (a consistency where nothing was
    expected, an interval with no resamples) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, list):
        return [strict(item) for item in value]
    return value


def from_json(kind: Any, value: Any) -> Any:
    """A JSON value read back as the annotated type `kind` (dataclasses, dicts of them, optionals)."""
    if value is None:
        return None
    if get_origin(kind) in (Union, types.UnionType):
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if isinstance(kind, type) and hasattr(kind, "from_json_value"):
        return kind.from_json_value(value)
    if isinstance(kind, type) and is_dataclass(kind):
        hints = get_type_hints(kind)
        return kind(**{f.name: from_json(hints[f.name], value[f.name]) for f in fields(kind) if f.name in value})
    if get_origin(kind) is dict:
        item = get_args(kind)[1]
        return {key: from_json(item, v) for key, v in value.items()}
    if get_origin(kind) is list and is_dataclass(get_args(kind)[0]):
        return [from_json(get_args(kind)[0], v) for v in value]
    return value


@dataclass
class CheckpointInfo:
    path: str
    format: str
    sha256: str
    name: str
    model: dict[str, Any]
    task: dict[str, Any]
    parameters: int
    train_step: int | None = field(default=None, metadata=OMIT)
    train_seconds: float | None = field(default=None, metadata=OMIT)


@dataclass
class IclError:
    """Squared error / d of the model's predictions by number of examples, with its 90% band."""

    n_examples: list[int]
    model: list[float]
    model_lo: list[float]
    model_hi: list[float]
    least_squares: list[float]
    knn3: list[float]
    averaging: list[float]


@dataclass
class Readout:
    layer: list[int]
    error: list[float]
    error_at_2d1: list[float] | None
    method: str
    alpha: list[float] | None
    error_definition: str = "mean over n_examples >= 1 of squared error / d on held-out prompts"


@dataclass
class Match:
    """One learner's best match per layer under one metric (seed 003 eq. 9-12), 90% intervals."""

    layer: list[int]
    k: list
    k_low: list
    k_high: list
    similarity: list[float]
    ci_low: list[float]
    ci_high: list[float]
    at_grid_end: list[bool]
    zero_similarity: list[float] | None = field(default=None, metadata=OMIT)
    degenerate: list[bool] | None = field(default=None, metadata=OMIT)


@dataclass
class TrendFit:
    """Linear and exponential fits of the best k against layer (seed 003 Fig. 3)."""

    linear_r2: float | None
    exponential_r2: float | None
    slope: float | None
    growth: float | None
    verdict: str
    layers: list[int]
    # 90% intervals over prompt resamples, and the share of resamples on which the shape holds
    slope_low: float | None = field(default=None, metadata=OMIT)
    slope_high: float | None = field(default=None, metadata=OMIT)
    growth_low: float | None = field(default=None, metadata=OMIT)
    growth_high: float | None = field(default=None, metadata=OMIT)
    shape_share: float | None = field(default=None, metadata=OMIT)


@dataclass
class Trend(TrendFit):
    """The SimE fit (the headline), with every metric's fit under by_metric."""

    by_metric: dict[str, TrendFit] = field(default_factory=dict)


@dataclass
class Table1Entry:
    """The final layer's best match against one learner family (seed 003 Table 1)."""

    sweep: str
    k: Any
    similarity: float
    ci_low: float
    ci_high: float
    degenerate: bool | None = field(default=None, metadata=OMIT)


@dataclass
class Verdict:
    """A paired comparison of two candidate learners (probe/analysis/verdicts.py): the mean per-prompt
    difference Sim(a) - Sim(b) with its bootstrap interval, the resolution (the largest difference
    a model that is exactly a could show), the winner (a, b, or None: what code reads) and the
    verdict in words: "<a> closer", "<b> closer", "not separable at this resolution" or "cannot test
    here"; `evidence` names what separates the pair when this comparison does not."""

    claim: str
    a: str
    b: str
    metric: str
    difference: float
    ci_low: float
    ci_high: float
    resolution: float
    verdict: str
    winner: str | None = None  # a, b, or None (not separable, or cannot test): what code reads
    sweep_a: str | None = field(default=None, metadata=OMIT)
    sweep_b: str | None = field(default=None, metadata=OMIT)
    k_a: Any = field(default=None, metadata=OMIT)
    k_b: Any = field(default=None, metadata=OMIT)
    evidence: str | None = field(default=None, metadata=OMIT)
    # causal map checks: whether either map came within the check's noise floor (False: "neither map confirmed")
    confirmed: bool | None = field(default=None, metadata=OMIT)


@dataclass
class Table1:
    sime: dict[str, Table1Entry]
    null: dict[str, dict[str, float]] | None = field(default=None, metadata=OMIT)


@dataclass
class Nulls:
    """Per layer: SimE against the zero predictor and a random-weights model; predicts ~0."""

    layer: list[int]
    predicts_zero: list[bool]
    relative_norm: list[float]
    sime: dict[str, list[float]]
    rule: str = (
        "a best match is degenerate when SimE(layer, zero predictor) >= its ci_low, or the layer predicts ~0 "
        "(||f|| < 0.1 ||y||)"
    )


@dataclass
class Span:
    layer: list[int]
    n_examples: list[int]
    residual: list[float]
    random_null: list[float]
    statistic: str = "root mean square over prompts of ||w - P_t w|| / ||w||"


@dataclass
class SpectralFit:
    """One bin variable's measurement per layer (probe/analysis/spectral.py): the local exponent p
    with its 90% interval, the best-fitting filter class and member (k on its axis, gain), its
    relative fit error, the runner-up class and the paired interval of (runner-up - best) error."""

    p: list[float]
    p_low: list[float]
    p_high: list[float]
    bins_used: list[int]
    min_r: list[float]
    max_r: list[float]
    non_filter: list[float]
    best_class: list[str]
    best_family: list[str]
    best_axis: list[str]
    best_k: list
    gain: list[float]
    error: list[float]
    runner_up: list[str]
    difference: list[float]
    diff_low: list[float]
    diff_high: list[float]
    separated: list[bool]


@dataclass
class Spectral:
    """Each layer's spectral filter on its induced weights: one verdict per layer over both bin
    variables ("gd", "precond_gd", "ridge", "least_squares", "... not separable from ...",
    "ambiguous: ...", "converged", "no response"), the exponent in the best family's own variable,
    each variable's fits, and the references' own exponents (the estimator's bias)."""

    layer: list[int]
    verdict: list[str]
    p: list[float]
    p_low: list[float]
    p_high: list[float]
    variable: list[str]
    by_variable: dict[str, SpectralFit]
    references: dict[str, dict[str, Any]]
    counts: dict[str, int]
    classes: dict[str, str]
    identities: str = (
        "Newton from alpha I is GD with 2^k steps of size alpha; the seeds' Newton (M_0 = alpha S) is "
        "S-preconditioned GD with 2^k steps: behaviour identifies the filter class and its rate, not which "
        "equivalent procedure computes it"
    )


@dataclass
class EvidenceRow:
    """One instrument's evidence on one question (probe/reporting/evidence.py): `favours` is a, b or
    None (undecided); the difference is oriented a - b where the instrument has one; `validated_on`
    names the known-answer models (and tests) on which it names each candidate, empty when none."""

    instrument: str
    favours: str | None
    effect: str
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    resolution: float | None = None
    validated_on: str = ""
    cannot_tell_apart: str = ""


@dataclass
class EvidenceQuestion:
    """The evidence on "a or b?", and the consolidated answer: the side the validated instruments
    that decide agree on (None: none decides, or they disagree), the equivalence class it leaves,
    and every decided row that points the other way, named as a contradiction."""

    a: str
    b: str
    rows: list[EvidenceRow]
    answer: str | None
    answer_words: str
    equivalence: str = ""
    contradictions: list[str] = field(default_factory=list)


@dataclass
class Summary:
    """summary.json: provenance, then one block per analysis (None: the recipe left the stage out)."""

    schema_version: int
    checkpoint: CheckpointInfo
    recipe: dict[str, Any]
    versions: dict[str, str]
    git_commit: str | None
    created: str
    seed: int
    timings: dict[str, float]
    cached_stages: list[str]
    icl_error: IclError
    readout: Readout
    best_match: dict[str, dict[str, Match]]
    trend: dict[str, Trend]
    table1: Table1
    verdicts: list[Verdict] | None = field(default=None, metadata=OMIT)
    evidence: list[EvidenceQuestion] | None = field(default=None, metadata=OMIT)
    nulls: Nulls | None = field(default=None, metadata=OMIT)
    icl_r2: dict[str, list] | None = field(default=None, metadata=OMIT)
    span: Span | None = field(default=None, metadata=OMIT)
    spectral: Spectral | None = field(default=None, metadata=OMIT)
    compare: dict[str, Any] | None = field(default=None, metadata=OMIT)
    stages: dict[str, Any] = field(default_factory=dict, metadata=MERGED)  # registered analyses' blocks

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    def __getattr__(self, name: str) -> Any:
        """A registered analysis's block as an attribute, as a built-in one: `summary.probes` (None
        when that analysis did not run)."""
        stages = self.__dict__.get("stages")
        if stages is not None and name in by_block_key():
            return stages.get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """Read a summary.json back, after checking it against the JSON Schema (`check_summary`);
        the blocks of registered analyses (probe/core/stages.py) as their dataclasses."""
        check_summary(data)
        summary = from_json(cls, data)
        summary.stages = {
            key: from_json(stage.block, data[key]) for key, stage in by_block_key().items() if key in data
        }
        return summary


RESERVED.update(f.name for f in fields(Summary) if not f.metadata.get("merged"))
DEFINITIONS.update(dataclasses_in(Summary))


SCHEMA_FILE = Path(__file__).with_name("summary.schema.json")


def check_summary(data: Any) -> None:
    """Refuse a summary.json that does not satisfy the shipped JSON Schema, naming the first
    offending field (its path) and what is wrong with it."""
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    added = {key: stage for key, stage in by_block_key().items() if key not in schema["properties"]}
    if added:  # analyses registered beside the shipped ones: their blocks' schemas from their dataclasses
        defs: dict[str, Any] = {}
        schema["properties"].update({name: schema_of(stage.block, defs) for name, stage in added.items()})
        schema["$defs"] = {**defs, **schema["$defs"]}
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ConfigError(f"summary.json does not match its schema at {where}: {error.message}")
