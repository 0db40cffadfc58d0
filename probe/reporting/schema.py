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

from ..analysis.labels import sweep_titles
from ..core.errors import ConfigError
from ..core.stages import DEFINITIONS, OMIT, RESERVED, SUMMARY_KEYS, by_block_key, dataclasses_in
from .dataclass_schema import STAGE_BLOCKS, block_properties

SCHEMA_VERSION = 9  # 3: `verdicts`; 4: `spectral`, `evidence`, verdicts' `winner`; 5: trend and probe intervals, map checks' `confirmed`; 6: evidence status, reason, knob and validity domains, the error curve's margin over trivial predictors; 7: evidence rows' `closest` (favours "neither"), the spectral fits' non_filter_uncorrected, best_non_filter and two-class blends; 8: `not_measured` (stages switched on that cannot run on the checkpoint); 9: the spectral verdicts as data (`kind`, `best_class`, `other_class`) and each bin variable's own `verdict`


def to_json(value: Any) -> Any:
    """Dataclasses -> dicts (in field order, optional Nones left out), recursively."""
    if hasattr(value, "to_json_value"):  # a block written in its own layout, of values converted here
        return to_json(value.to_json_value())
    if is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("stage_blocks"):  # registered analyses' blocks: each as its stage's entries
                for key, block in item.items():
                    out.update({name: to_json(v) for name, v in by_block_key()[key].entries(block).items()})
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
class EvidenceRow:
    """One instrument's evidence on one question (probe/reporting/evidence.py): `favours` is a, b,
    "neither" (far from both: `closest` says what it reads instead) or None (undecided); the difference is oriented a - b where the instrument has one; `validated_on`
    names the known-answer models (and tests) on which it names each candidate, empty when none."""

    instrument: str
    favours: str | None  # a, b, "neither" (closest: `closest`) or None (undecided)
    effect: str
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    resolution: float | None = None
    validated_on: str = ""
    cannot_tell_apart: str = ""
    # core/validity.py STATUSES: "answered" (the instrument gave its reading, a side or undecided),
    # "unvalidated here" (outside its validity domain: shown, never counted), "not measured"
    status: str = "answered"
    outside: str = ""  # the model's conditions its known answers do not cover ("kappa = 100")
    domain: dict[str, Any] | None = None  # validity.Domain: the conditions its known answers cover
    closest: str = ""  # where it favours "neither": what it reads instead (schema 7)


@dataclass
class EvidenceQuestion:
    """The evidence on "a or b?", and the consolidated answer: the side the validated instruments
    that decide agree on ("neither" where they agree the model is far from both; None: none
    decides, or they disagree), the equivalence class it leaves,
    and every decided row that points the other way, named as a contradiction."""

    a: str
    b: str
    rows: list[EvidenceRow]
    answer: str | None
    answer_words: str
    equivalence: str = ""
    contradictions: list[str] = field(default_factory=list)
    status: str = "answered"  # validity.STATUSES: "no answer" where the model does not learn in context
    reason: str = ""
    knob: str = ""


@dataclass
class NotMeasured:
    """A stage the recipe switches on that cannot run on this checkpoint (its `refuses`,
    probe/core/stages.py): written instead of its block, in the status vocabulary of core/validity.py."""

    stage: str
    reason: str
    knob: str  # the recipe switch that drops this line (the stage's own `enabled`)
    status: str = "not measured"


@dataclass
class Summary:
    """summary.json: provenance, then one block per analysis (the registered stages' blocks,
    probe/core/stages.py: the error curve's and the layer analyses' fields at the top level, the
    others each under its key; absent when the stage did not run), then the paired verdicts, the
    evidence table and the compared checkpoint."""

    schema_version: int
    checkpoint: CheckpointInfo
    recipe: dict[str, Any]
    versions: dict[str, str]
    git_commit: str | None
    created: str
    seed: int
    timings: dict[str, float]
    cached_stages: list[str]
    stages: dict[str, Any] = field(default_factory=dict, metadata=STAGE_BLOCKS)  # registered analyses' blocks
    not_measured: list[NotMeasured] | None = field(default=None, metadata=OMIT)  # switched on, cannot run here
    verdicts: list[Verdict] | None = field(default=None, metadata=OMIT)
    evidence: list[EvidenceQuestion] | None = field(default=None, metadata=OMIT)
    compare: dict[str, Any] | None = field(default=None, metadata=OMIT)

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @property
    def titles(self) -> dict[str, str]:
        """Sweep label -> the title its recipe gives it (the sweeps' and the forgetting learners')."""
        recipe = self.recipe or {}
        forgetting = (recipe.get("forgetting") or {}).get("learners", [])
        return sweep_titles([*recipe.get("sweeps", []), *forgetting])

    def __getattr__(self, name: str) -> Any:
        """A registered analysis's summary.json entry as an attribute, as a built-in one:
        `summary.probes`, `summary.best_match` (None when that analysis did not run)."""
        stages = self.__dict__.get("stages")
        if stages is not None:
            for key, stage in by_block_key().items():
                if name in stage.keys:
                    block = stages.get(key)
                    return None if block is None else stage.entries(block).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        """Read a summary.json back, after checking it against the JSON Schema (`check_summary`);
        the blocks of registered analyses (probe/core/stages.py) as their dataclasses."""
        check_summary(data)
        summary = from_json(cls, data)
        summary.stages = {}
        for key, stage in by_block_key().items():
            values = {name: from_json(kind, data[name]) for name, kind in stage.entry_types().items() if name in data}
            if values:
                summary.stages[key] = stage.from_entries(values)
        return summary


SUMMARY_KEYS.update(f.name for f in fields(Summary) if not f.metadata.get("stage_blocks"))
RESERVED.update(SUMMARY_KEYS)
DEFINITIONS.update(dataclasses_in(Summary))


SCHEMA_FILE = Path(__file__).with_name("summary.schema.json")


def check_summary(data: Any) -> None:
    """Refuse a summary.json that does not satisfy the shipped JSON Schema, naming the first
    offending field (its path) and what is wrong with it."""
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    added = {key: stage for key, stage in by_block_key().items() if stage.keys[0] not in schema["properties"]}
    if added:  # analyses registered beside the shipped ones: their blocks' schemas from their dataclasses
        defs: dict[str, Any] = {}
        for stage in added.values():
            schema["properties"].update(block_properties(stage, defs))
        schema["$defs"] = {**defs, **schema["$defs"]}
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ConfigError(f"summary.json does not match its schema at {where}: {error.message}")
