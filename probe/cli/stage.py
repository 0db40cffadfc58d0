"""The commands derived from the registered analyses (probe/core/stages.py `Command`): `icl-probe
readout`, `heatmap`, `span`, `spectral`, `probes`, `order`, `steer`, ... Each runs its stage with
the stages it needs, as a report runs them: the checkpoint and the report's recipe (`--recipe`,
`--set`, then the command's flags) in; out (with --out; without it the command only prints), in one
layout, the stage's own tables (<table>.csv), the data entries its `files` names (<entry>.json),
<stage>_summary.json (its summary.json block under its key, the command's options, the recipe run
and provenance) and its figures, published only when all of it is written."""

from __future__ import annotations

import argparse
import json
import typing
from dataclasses import fields

from ..core.resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, writing
from .layers import add_recipe_args, recipe_from_args


def section_class(section: str) -> type:
    """The settings class of recipe section `section` (a built-in one's or a registered stage's)."""
    from ..core.config import type_hints
    from ..core.stages import registered
    from ..reporting.recipe import Recipe

    hints = type_hints(Recipe)
    found = hints[section] if section in hints else registered()[section].settings
    assert isinstance(found, type), section  # a stage with commands' flags of its section has settings
    return found


def command_flags(declared, command) -> tuple[tuple[str, typing.Any], ...]:
    """The command's flags: its own, or every field of the stage's section but `enabled` (`flags`
    spells some differently), [prompts] seed and the stage's `prompt_flags`."""
    if command.flags is not None:
        return command.flags
    own = () if declared.settings is None else (
        (declared.name, {
            f.name: dict(declared.flags).get(f.name, f.name.replace("_", "-"))
            for f in fields(declared.settings)
            if f.name not in ("enabled", "learners")
        }),
    )  # fmt: skip
    return (*own, ("prompts", {"seed": "seed", **dict(declared.prompt_flags)}))


def writes(declared) -> tuple[str, ...]:
    """The names a derived command writes into --out (the output policy's, probe/io/outputs.py)."""
    return ("*.csv", f"{declared.name}_summary.json", *(f"{name}.json" for name in declared.files), "*.png", "*.svg")


def add_registered_parsers(sub, only: str | None = None) -> None:
    """One subcommand per command derived from a registered analysis, its flags from its settings
    (only command `only`'s flags where one is named; the others listed by name and help)."""
    from ..core.settings import add_flags
    from ..core.stages import registered

    for name, declared in registered().items():
        for command in declared.derived_commands:
            if command.name in sub.choices:
                continue  # a second build of the parser
            p = sub.add_parser(
                command.name,
                help=command.help or declared.title,
                description=command.doc or declared.description,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            p.set_defaults(registered_stage=name, stage_command=command.name)
            if only not in (None, command.name):
                continue
            p.add_argument(
                "checkpoint",
                nargs="?",
                default=str(DEFAULT_CHECKPOINT),
                help="run directory (default: shipped default)",
            )
            add_out(p, f"directory for its tables (CSV), figures and {name}_summary.json (none: print only)", False)
            for section, names in command_flags(declared, command):
                add_flags(p, section, section_class(section), names)
            if command.arguments is not None:
                command.arguments(p)
            add_recipe_args(p)
            add_device(p)


def run(args: argparse.Namespace) -> int:
    """A derived command: the stage (and those it needs) on the recipe its flags give, written in the
    one layout (module docstring); the lines its `show` gives (default: the stage's findings)
    printed after."""
    from ..core import budget
    from ..core.errors import ConfigError
    from ..core.stages import StageTables, registered
    from ..io.formats import load_checkpoint
    from ..io.outputs import WRITES
    from ..reporting.build import Context, run_stages
    from ..reporting.cache import StageCache
    from ..reporting.summary import provenance

    declared = registered()[args.registered_stage]
    command = next(c for c in declared.derived_commands if c.name == args.stage_command)
    WRITES[command.name] = writes(declared)  # the output policy's names of this command
    target = output_target(args, command.name, (args.checkpoint, *(getattr(args, name) for name in command.inputs)))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)
    if command.adjust is not None:
        recipe = command.adjust(recipe, args, ckpt)
    refusal = declared.refusal(ckpt)
    if refusal:  # why it cannot run on this checkpoint, before any work
        raise ConfigError(refusal)
    exact, running = _stages_to_run(declared, command, args)
    stages = registered()
    budget.check([e for name in running for e in stages[name].estimates(recipe, ckpt)], ckpt.name)
    own, seen = [], set()  # its own tables (those of the stages it needs are not written)

    def note(stage, tables) -> None:
        new = [name for name in tables if name not in seen]
        seen.update(new)
        if stage.name == declared.name:
            own.extend(new)

    device, progress = check_device(args.device), not args.quiet
    only = {declared.name} if exact is None else running
    options = dict(command.options(args) if callable(command.options) else command.options)
    built = run_stages(
        ckpt, recipe, device, StageCache(None), progress, only=only, on_done=note, given=exact, options=options
    )
    tables = StageTables(built.tables, built.data, ckpt, recipe)
    block = declared.summarise(tables, recipe)
    summary = provenance(ckpt, recipe)  # what its findings read: its own block, the checkpoint and the recipe
    summary.stages = {declared.block_key: block}
    lines = command.show(tables, block) if command.show is not None else declared.findings(block, summary)
    if target is not None:
        with writing(target) as out:
            _write(out, declared, command, built, own, block, ckpt, recipe, options)
            declared.figures(built.tables, out, Context(ckpt, recipe, device, progress, earlier=built, options=options))
    for line in lines if isinstance(lines, list) else [lines]:
        if line:
            print(line)
    if target is not None:
        print(f"wrote {target.path}")
    return 0


def _write(out, declared, command, built, own: list[str], block, ckpt, recipe, options: dict) -> None:
    """The layout's files but the figures: the stage's own tables, its `files` entries and
    <stage>_summary.json (its block, the command's options where it has any, the recipe, provenance)."""
    from ..core.provenance import display_path, stamp
    from ..reporting.schema import strict, to_json

    for name in own:
        built.tables[name].to_csv(out / f"{name}.csv", index=False)
    for name in (name for name in declared.files if name in built.data):
        (out / f"{name}.json").write_text(json.dumps(built.data[name], indent=2) + "\n")
    written = {
        "command": command.name,
        "checkpoint": display_path(ckpt.path),
        declared.block_key: to_json(block),
        **({"options": options} if options else {}),
        "recipe": recipe.to_dict(),
        **stamp(),
    }
    (out / f"{declared.name}_summary.json").write_text(json.dumps(strict(written), indent=2, default=str) + "\n")


def _stages_to_run(declared, command, args):
    """(the Built a command starts from, or None: the stage runs with the stages it needs; the names
    of every stage that runs). With tables given (patch --map-from) the stage runs alone on them;
    with its own `needs`, after those."""
    from ..core.stages import with_needs
    from ..reporting.build import Built

    given = command.given(args) if command.given is not None else None
    if given is None and command.needs is None:
        return None, with_needs({declared.name}) or set()
    first = set() if given is not None else with_needs(set(command.needs or ())) or set()
    return Built(tables=dict(given or {})), first | {declared.name}
