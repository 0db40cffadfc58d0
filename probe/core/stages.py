"""Report analyses written once: an `AnalysisStage` subclass (the toolkit's in probe/stages/) names
its recipe section (its settings class), the stages it needs, how it runs, what it costs, its
summary.json block (a dataclass: the JSON Schema is generated from it), its figures, its section of
the report page, its findings line, evidence rows, comparison and study rows and, from the same
settings, its `icl-probe <name>` command. Registered here, the stage is in the recipe, the report,
summary.json, the budget, studies and the CLI with no other file changed.

A package outside probe/ registers its stages at import (`register_stage`) and names that module
in the entry-point group `icl_probe.stages` of its own packaging, so that the command line and
the API find it (`load_plugins`); a script may also import it and call `register_stage` itself.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

from .config import Section
from .errors import ConfigError

NAME = re.compile(r"[a-z][a-z0-9_]*")
OMIT = {"omit_if_none": True}  # a block field's metadata: summary.json leaves the field out when it is None
ENTRY_POINTS = "icl_probe.stages"
# the toolkit's own registered analyses, in report order
BUILTIN = tuple(
    f"probe.stages.{name}"
    for name in (
        "evaluate",
        "readout",
        "induced",
        "layers",
        "spectral",
        "interventions",
        "probes",
        "order",
        "forgetting",
        "ood",
        "token_probes",
        "steering",
    )
)


# the methods a stage may override (or give as functions to AnalysisStage(...))
HOOKS = (
    "run",
    "summarise",
    "figures",
    "estimates",
    "findings",
    "caveats",
    "tables",
    "page",
    "compare",
    "compare_figures",
    "evidence",
    "verdicts",
    "check",
    "refuses",
    "probe_stream_sets",
    "study_rows",
    "entry_types",
    "entries",
    "from_entries",
)
DERIVED = (
    "command",
    "derived_commands",
    "command_names",
    "block_key",
    "keys",
    "required_keys",
    "enabled",
    "draw",
    "refusal",
    "overrides",
    "replace",
    "generator",
)  # read, never declared


@dataclasses.dataclass(frozen=True)
class Command:
    """A command derived from a stage, `icl-probe <name>` (probe/cli/stage.py): the stage and those it
    needs run as a report runs them, on the report recipe (`--recipe`, `--set`) with the command's
    flags applied, and written in the one layout of a stage's command: its own tables as
    <table>.csv, the data entries its `files` names as <entry>.json, <stage>_summary.json (its
    block, the recipe run and provenance) and its figures.

    name: the command.
    help, doc: its line in `icl-probe --help` and its --help text (defaults: the stage's title and
        description).
    flags: (recipe section, its fields as flags) pairs: field names (flag: the name with dashes) or
        {field: flag} ({"test": ("test-prompts", "eval-prompts")}: later names are old spellings,
        still accepted); default: every field of the stage's own section but `enabled`, [prompts]
        seed and the stage's `prompt_flags`.
    arguments: (parser) -> None, arguments besides the flags (heatmap's --learners).
    adjust: (recipe, parsed arguments, checkpoint) -> the recipe the command runs, after its flags
        are applied; it may raise ConfigError for a value the checkpoint cannot take.
    options: what the stage's run reads of the command beside the recipe (`Context.options`: the
        causal checks' parts, `icl-probe ablate` runs only the ablations), as pairs or a function of
        the parsed arguments (`icl-probe evaluate`'s shift); written to <stage>_summary.json.
    needs: the stages it runs first, where not the stage's `needs` (ablations read no best match).
    given: (parsed arguments) -> tables read from files in place of the stages that make them (patch's
        --map-from best_match.csv), or None; with tables given, the stages it needs are not run.
    inputs: its arguments that name input files (the output policy never writes over them).
    show: (StageTables, block) -> the lines it prints (default: the stage's findings); it may raise
        ConfigError to refuse a result (nothing is written then)."""

    name: str
    help: str = ""
    doc: str = ""
    flags: tuple[tuple[str, Any], ...] | None = None
    arguments: Any = None
    adjust: Any = None
    options: tuple[tuple[str, Any], ...] | Any = ()
    needs: tuple[str, ...] | None = None
    given: Any = None
    inputs: tuple[str, ...] = ()
    show: Any = None


class AnalysisStage:
    """One analysis of the report: subclass it (the toolkit's own, probe/stages/) setting the class
    attributes and overriding the methods below, or build one from functions,
    `AnalysisStage(name=..., run=..., block=..., summarise=..., ...)` (each keyword an attribute or a
    method of the same name, called without `self`).

    Attributes:
    name: its recipe section [name], its summary.json key (unless `key` says otherwise) and its
        command `icl-probe <name>` (underscores as dashes).
    settings: its recipe section, a `Section` dataclass with SECTION = name and an `enabled` field;
        None for a stage with no section of its own that runs in every report (the report's spine:
        the error curve and the layer analyses, which read the built-in sections named in `reads`).
    block: the dataclass of its summary.json block (`summarise` builds it); None for a provider, a
        stage with no block, page or command whose data other stages read (the induced weights).
    title, description: its section of the report page (plain text) and the command's help.
    reads: other recipe sections it reads (its cache key, with [prompts] and its own).
    needs: the stages whose outputs it reads (`Context.before`); each runs first (also when the stage
        is asked for alone, `with_needs`), and its cache key is part of this stage's (the spectral
        stage needs the induced weights of the induced stage).
    flags: (settings field, flag name) of its command where not the field's own (e.g. "test-prompts").
    prompt_flags: ([prompts] field, flag name) its command takes besides --seed (e.g. the probes'
        ("test", "test-prompts")).
    captions: (figure name, caption) under its figures on the page.
    key: its summary.json key where that is not its name (order: "order_sensitivity").
    cli: its command where that is not its name (steering: "steer").
    commands: its commands, each a `Command` derived from it (probe/cli/stage.py: the error curve's
        `icl-probe evaluate`, the read-outs' `readout`, the layers' `heatmap` and `span`, the causal
        checks' `ablate` and `patch`); none: a stage with its own section gets `icl-probe <command>`
        with a flag per field.
    files: entries of its `data` the report writes as data/<entry>.json (the layers' `trends`; a
        compared checkpoint's as data/compare_<entry>.json).
    papers: the papers whose methods it runs, cited by author and year with the paper's section
        ("Fu et al. 2024, App. A.4, eq. 16: forgetting"); the report's methods list them
        (full citations: docs/references.md).

    Methods (`run`, `summarise` required; the others' defaults add nothing): see each.
    """

    name: str = ""
    settings: type | None = None
    block: Any = None  # a dataclass (register_stage refuses anything else)
    title: str = ""
    description: str = ""
    reads: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    flags: tuple[tuple[str, str], ...] = ()
    prompt_flags: tuple[tuple[str, str], ...] = ()
    captions: tuple[tuple[str, str], ...] = ()
    key: str = ""
    cli: str = ""
    commands: tuple[Command, ...] = ()
    files: tuple[str, ...] = ()
    papers: tuple[str, ...] = ()

    def __init__(self, **declared: Any):
        known = {name for name in dir(AnalysisStage) if not name.startswith("_")} - set(DERIVED)
        for field_name, value in declared.items():
            if field_name not in known:
                raise ConfigError(
                    f"analysis stage: unknown declaration {field_name!r} (one of {', '.join(sorted(known))})"
                )
            if value is None and field_name in HOOKS:  # a hook given as None: the class's own
                vars(self).pop(field_name, None)
            else:
                setattr(self, field_name, value)

    def replace(self, **changes: Any) -> AnalysisStage:
        """A copy with `changes` (declarations, as AnalysisStage(...) takes them)."""
        import copy

        other = copy.copy(self)
        AnalysisStage.__init__(other, **changes)
        return other

    def generator(self, seed: int, *parts: str) -> Any:
        """A torch generator of its own random stream `parts` for run seed `seed` (probe/core/seeds.py
        `named_stream`: keyed by its name, no entry in the central table)."""
        from .seeds import generator_for, named_stream

        return generator_for(seed, named_stream(self.name, *parts))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def run(self, context: Any) -> dict[str, Any]:
        """(report Context: checkpoint, recipe adapted to it, device, earlier stages' tables) -> its
        tables, name -> DataFrame (written to data/<table>.csv); a `StageTables` also carries what it
        keeps beside them (`data`: JSON-able, cached with the tables; written only where `files` names it)."""
        raise NotImplementedError(f"analysis stage {self.name!r} has no run")

    def summarise(self, tables: dict[str, Any], recipe: Any) -> Any:
        """Its summary.json block (`tables`: a StageTables of every table of the report so far, the
        data of the stages that ran, and the checkpoint); None: nothing to write, the block is left out
        (a provider's, always)."""
        if self.block is None:
            return None
        raise NotImplementedError(f"analysis stage {self.name!r} has no summarise")

    def figures(self, tables: dict[str, Any], fig_dir: Path, context: Any) -> dict[str, Path]:
        """(tables, figure directory, the report Context: .recipe, .ckpt) -> name -> PNG path."""
        return {}

    def estimates(self, recipe: Any, ckpt: Any) -> list[Any]:
        """Budget Estimates (probe/core/budget.py) of its own knobs on this checkpoint, the report's
        up-front check."""
        return []

    def probe_stream_sets(self, recipe: Any, ckpt: Any) -> tuple[tuple[int, int], ...]:
        """The prompt sets (probe/core/seeds.py stream, count) over which it reads the model's float64
        streams a block of layers at a time through `Context.streams.reader(name)`
        (probe/capture/stream_store.py): where a later stage of the report reads the same set, it
        reads what this one made instead of running the model again. None by default."""
        return ()

    def findings(self, block: Any, summary: Any) -> str | list[str | None] | None:
        """Its findings line (None: none; a list: several); `summary` is the report's Summary (the
        other blocks; `summary.titles`: sweep label -> title)."""
        return None

    def caveats(self, block: Any, summary: Any) -> list[str]:
        """The report's caveats it adds (lines under the findings)."""
        return []

    def tables(self, block: Any, summary: Any, tables: Any) -> dict[str, Any]:
        """Caption -> DataFrame shown on the page (where it writes its own `page`: name -> HTML table
        that its template's macros read)."""
        return {}

    def page(
        self, block: Any, summary: Any, figs: dict[str, Path], tables: dict[str, Any], context: dict[str, Any]
    ) -> list[tuple[str, str]] | None:
        """Its page sections, (title, HTML) each, where it writes its own (the spine's, from macros of
        probe/stages/templates/); None: one section of its description, `tables` and figures.
        `figs`: figure name -> PNG drawn; `tables`: the report's tables; `context`: the page template's."""
        return None

    def compare(self, mine: Any, theirs: Any, context: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """`report --compare`: its part of two checkpoints side by side, from each one's tables
        (`mine`, `theirs`: StageTables with `.ckpt`, called where it ran on both): (tables, written as
        data/<name>.csv and read by the page's comparison section; entries of summary.json's `compare`).
        `context`: `.recipe`, `.device`, `.same_task` (one task: the same prompts fit both models) and
        `.tables`, the comparison's tables from the stages before it."""
        return {}, {}

    def compare_figures(self, mine: Any, theirs: Any, fig_dir: Path) -> dict[str, Path]:
        """`report --compare`: its figures of the two checkpoints side by side (`mine`, `theirs`:
        StageTables with `.ckpt`, the compared one's None where unknown), name -> PNG path."""
        return {}

    def evidence(self, block: Any, summary: Any, a: str, b: str) -> list[dict[str, Any]]:
        """Rows of the evidence table for the question a or b, each a dict of
        probe.reporting.schema.EvidenceRow's fields (probe/reporting/evidence.py)."""
        return []

    def verdicts(self, block: Any, tables: Any) -> list[dict[str, Any]]:
        """Paired verdicts it adds to summary.json's `verdicts`, each a dict of
        probe.reporting.schema.Verdict's fields (`tables`: as `summarise` is given)."""
        return []

    def check(self, recipe: Any) -> None:
        """Raise ConfigError where its section disagrees with another section (run when the recipe
        is resolved, before any work)."""

    def refuses(self, ckpt: Any) -> str:
        """Why it cannot run on this checkpoint, "" where it can; a report whose recipe switches it
        on writes it as "not measured here: <why>"."""
        return ""

    def study_rows(self, tables: Any) -> list[dict[str, Any]] | None:
        """Its rows of a study's table (study.csv), each a dict with `metric` and `value` and
        optionally `learner`, `layer`, `n_examples`, `shift`, `ci_low`, `ci_high` (`tables` as
        `summarise` is given them). A stage that overrides it is a per-model analysis a study
        recipe may name (`analyses = [..., "<name>"]`), and its rows are on the study page."""
        return None

    @property
    def command(self) -> str:
        return self.cli or self.name.replace("_", "-")

    @property
    def derived_commands(self) -> tuple[Command, ...]:
        """The commands derived from it (probe/cli/stage.py): its `Command`s, or with none declared and
        a section of its own, `icl-probe <command>` with a flag per field."""
        if self.commands:
            return tuple(self.commands)
        return (Command(self.command),) if self.settings is not None else ()

    @property
    def command_names(self) -> tuple[str, ...]:
        """Every command that runs it."""
        return tuple(c.name for c in self.derived_commands)

    @property
    def block_key(self) -> str:
        """Its block's key in a Summary's `stages` (and in summary.json, by `entry_types`)."""
        return self.key or self.name

    @property
    def keys(self) -> tuple[str, ...]:
        """The summary.json keys its block takes (none for a provider)."""
        return tuple(self.entry_types()) if self.block is not None else ()

    def entry_types(self) -> dict[str, Any]:
        """summary.json key -> the type of its value, for the keys its block takes (the schema's
        properties): the block under its key."""
        return {self.block_key: self.block}

    def entries(self, block: Any) -> dict[str, Any]:
        """Its block as summary.json entries, key -> value (left out: nothing to write)."""
        return {self.block_key: block}

    def from_entries(self, values: dict[str, Any]) -> Any:
        """Its block from the entries summary.json has of `entry_types` (each read as its type)."""
        return values.get(self.block_key)

    @property
    def required_keys(self) -> tuple[str, ...]:
        """Its keys summary.json must hold where it runs in every report (no section of its own)."""
        return self.keys

    def enabled(self, recipe: Any) -> bool:
        """Whether the recipe switches it on (a stage with no section of its own always runs)."""
        return self.settings is None or getattr(recipe, self.name).enabled

    def draw(self, tables: dict[str, Any], fig_dir: Path, context: Any) -> dict[str, Path]:
        """Its figures, keyed "<name>/<figure>" where its page section is the standard one (a stage
        that writes its own `page` reads them by their own names)."""
        drawn = self.figures(tables, fig_dir, context)
        return drawn if self.overrides("page") else {f"{self.name}/{k}": v for k, v in drawn.items()}

    def refusal(self, ckpt: Any) -> str:
        """Why it cannot run on this checkpoint ("" where it can)."""
        return self.refuses(ckpt)

    def overrides(self, hook: str) -> bool:
        """Whether it gives its own `hook` (a method of HOOKS) rather than the base's default."""
        return hook in vars(self) or getattr(type(self), hook) is not getattr(AnalysisStage, hook)


class FieldsAsKeys(AnalysisStage):
    """A stage whose block's fields are summary.json keys of their own rather than one key holding
    the block: the report's spine (the error curve's `icl_error`, the layer analyses' `best_match`,
    `trend`, `table1`, ...), as summary.json has always written them."""

    def entry_types(self) -> dict[str, Any]:
        hints = typing.get_type_hints(self.block)
        return {f.name: hints[f.name] for f in dataclasses.fields(self.block)}

    def entries(self, block: Any) -> dict[str, Any]:
        """Its block's fields, those with OMIT metadata left out when None."""
        return {
            f.name: getattr(block, f.name)
            for f in dataclasses.fields(block)
            if not (f.metadata.get("omit_if_none") and getattr(block, f.name) is None)
        }

    def from_entries(self, values: dict[str, Any]) -> Any:
        return self.block(**values)

    @property
    def required_keys(self) -> tuple[str, ...]:
        """Its block's fields without a default."""
        return tuple(required_fields(self.block))


class StageTables(dict):
    """Tables by name (DataFrames) and, in `data`, what a stage keeps beside them that is not a
    table (JSON-able values, e.g. the probes' resampled intervals): what `run` may return and what
    `summarise` is given."""

    def __init__(self, tables: Any = (), data: dict[str, Any] | None = None, ckpt: Any = None, recipe: Any = None):
        super().__init__(tables)
        self.data = dict(data or {})
        self.ckpt = ckpt  # the checkpoint they were made on, where `summarise` is given them
        self.recipe = recipe  # the recipe they were made with, where a command's `show` is given them


STAGES: dict[str, AnalysisStage] = {}
RESERVED: set[str] = (
    set()
)  # the built-in recipe sections, commands and summary.json keys (probe/reporting, cli add them)
SUMMARY_KEYS: set[str] = set()  # summary.json's own top-level keys (probe/reporting/schema.py adds them)
DEFINITIONS: dict[str, type] = {}  # dataclass name -> class of every summary.json block (its schema definition's name)


def dataclasses_in(kind: Any, found: dict[str, type] | None = None) -> dict[str, type]:
    """The dataclasses a block type is made of (itself, its fields' types, their arguments), by name."""
    found = {} if found is None else found
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if kind.__name__ in found:
            return found
        found[kind.__name__] = kind
        for hint in typing.get_type_hints(kind).values():
            dataclasses_in(hint, found)
    for arg in typing.get_args(kind):
        dataclasses_in(arg, found)
    return found


def required_fields(kind: type, *names: str) -> list[str]:
    """The fields of dataclass `kind` (those named, or all) that have no default."""
    return [
        f.name
        for f in dataclasses.fields(kind)
        if (not names or f.name in names)
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]


def _check_settings_and_block(stage: AnalysisStage, what: str) -> None:
    """Refuse a settings class that is not its recipe section, a block that is not a dataclass, and
    a provider (no block) with anything of its own to show."""
    settings = stage.settings
    if settings is not None and not (
        isinstance(settings, type) and issubclass(settings, Section) and dataclasses.is_dataclass(settings)
    ):
        raise ConfigError(f"{what}: settings must be a Section dataclass (probe.core.config.Section) or None")
    if settings is not None and (
        getattr(settings, "SECTION", None) != stage.name
        or "enabled" not in {f.name for f in dataclasses.fields(settings)}
    ):
        raise ConfigError(f"{what}: its settings class needs SECTION = {stage.name!r} and an `enabled` field")
    if stage.block is None and (stage.settings is not None or stage.overrides("page") or stage.files):
        raise ConfigError(f"{what}: a stage without a block is a provider: no settings, page or files")
    if stage.block is not None and not (isinstance(stage.block, type) and dataclasses.is_dataclass(stage.block)):
        raise ConfigError(f"{what}: block must be a dataclass (summary.json's schema is generated from it)")


def register_stage(stage: AnalysisStage) -> AnalysisStage:
    """Add `stage` to the report (idempotent for the same declaration); a name that is taken, or a
    settings class or block that is not what the declaration needs, is refused naming the fix."""
    if not isinstance(stage, AnalysisStage):
        raise ConfigError(
            f"register_stage takes an AnalysisStage (an instance of a subclass, or AnalysisStage(name=..., ...)), "
            f"got {stage!r}"
        )
    what = f"analysis stage {stage.name!r}"
    required = ("run", "summarise") if stage.block is not None else ("run",)
    missing = [hook for hook in required if not stage.overrides(hook)]
    if missing:
        raise ConfigError(f"{what}: it needs its own {' and '.join(missing)} (a method or a keyword of AnalysisStage)")
    if not isinstance(stage.name, str) or not NAME.fullmatch(stage.name):
        raise ConfigError(f"{what}: a stage name is lower-case letters, digits and '_', starting with a letter")
    # its recipe section, command and summary.json key (with settings); its keys are checked below
    claimed = {stage.name, stage.command.replace("-", "_")} if stage.settings is not None else set()
    if claimed & RESERVED:
        raise ConfigError(f"{what}: the name is a built-in recipe section, command or summary.json key; choose another")
    if STAGES.get(stage.name, stage) is not stage:
        raise ConfigError(f"{what} is already registered by another declaration; choose another name")
    commands = {name for other in STAGES.values() if other.name != stage.name for name in other.command_names}
    if set(stage.command_names) & commands:
        raise ConfigError(
            f"{what}: its command {min(set(stage.command_names) & commands)!r} is another stage's; rename it"
        )
    if stage.name in stage.needs:
        raise ConfigError(f"{what} needs itself; `needs` names the stages whose outputs it reads")
    _check_settings_and_block(stage, what)
    if not all(isinstance(name, str) and NAME.fullmatch(name) for name in stage.files):
        raise ConfigError(f"{what}: files names entries of its data, each lower-case letters, digits and '_'")
    written = {name for other in STAGES.values() if other.name != stage.name for name in other.files}
    if set(stage.files) & written:
        raise ConfigError(f"{what}: data/{min(set(stage.files) & written)}.json is another stage's file")
    others = {key for other in STAGES.values() if other.name != stage.name for key in other.keys}
    clash = sorted(set(stage.keys) & (others | SUMMARY_KEYS))
    if clash:
        raise ConfigError(f"{what}: its summary.json key {clash[0]!r} is already taken; rename it")
    classes = dataclasses_in(stage.block) if stage.block is not None else {}
    taken = [name for name, kind in classes.items() if DEFINITIONS.get(name, kind) is not kind]
    if taken:
        raise ConfigError(
            f"{what}: its dataclass {taken[0]} has the name of another summary.json block's dataclass "
            "(the schema names definitions by class name); rename it"
        )
    DEFINITIONS.update(classes)
    STAGES[stage.name] = stage
    return stage


def by_block_key() -> dict[str, AnalysisStage]:
    """The registered stages with a block, by their summary.json key."""
    return {stage.block_key: stage for stage in registered().values() if stage.block is not None}


def unregister_stage(name: str) -> None:
    """Take a registered stage out again (tests, notebooks)."""
    STAGES.pop(name, None)


_loaded = False


def streams_made_before(name: str, recipe: Any, ckpt: Any) -> frozenset[tuple[int, int]]:
    """The prompt sets whose float64 streams a stage running before stage `name` in a report makes
    (its `probe_stream_sets`), so that `name` reads them instead of running the model (its estimates
    leave those forwards out)."""
    made: set[tuple[int, int]] = set()
    for other in registered().values():
        if other.name == name:
            break
        if other.enabled(recipe) and not other.refusal(ckpt):
            made |= set(other.probe_stream_sets(recipe, ckpt))
    return frozenset(made)


def registered() -> dict[str, AnalysisStage]:
    """Every registered stage, name -> declaration, in report order: the toolkit's own in BUILTIN's
    order (whichever was imported first), then the others as they were registered (plugins)."""
    load_plugins()
    rank = {module: i for i, module in enumerate(BUILTIN)}
    order = sorted(STAGES.values(), key=lambda stage: rank.get(stage.run.__module__, len(BUILTIN)))
    for i, stage in enumerate(order):
        missing = [name for name in stage.needs if name not in {s.name for s in order[:i]}]
        if missing:
            raise ConfigError(
                f"analysis stage {stage.name!r} needs {', '.join(map(repr, missing))}, which does not run before it: "
                "register the stages it reads (a plugin's stages run after the toolkit's, in registration order)"
            )
    return {stage.name: stage for stage in order}


def with_needs(names: set[str] | None) -> set[str] | None:
    """`names` (stages asked for by name: a command, a study) with every stage they need, and the
    stages those need (None stays None: the recipe decides); an unknown name is refused."""
    if names is None:
        return None
    stages = registered()
    unknown = sorted(set(names) - set(stages))
    if unknown:
        raise ConfigError(f"unknown analysis stage {unknown[0]!r}: the stages are {', '.join(stages)}")
    closed, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name not in closed:
            closed.add(name)
            pending += stages[name].needs
    return closed


def load_plugins() -> None:
    """Import the toolkit's own stage modules (BUILTIN) and the modules named in the
    `icl_probe.stages` entry-point group, once (each registers its stages at import); a plugin
    that fails to import is refused naming it."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from importlib import import_module
    from importlib.metadata import entry_points

    for module in BUILTIN:
        import_module(module)
    for point in entry_points(group=ENTRY_POINTS):
        try:
            point.load()
        except Exception as err:  # noqa: BLE001 - a broken plugin, whatever it raises, is named, not traced
            raise ConfigError(
                f"analysis stage plugin {point.value!r} ({ENTRY_POINTS}) failed to import: {err}"
            ) from None
