"""A registered analysis run alone (`icl-probe probes`, `order`, `steer`, ...; probe/core/stages.py),
with the stages it needs (the order stage: the read-outs), as a report runs them:
the checkpoint and the report's recipe (then the command's flags) in; the stage's tables
(<table>.csv), its summary.json block with the settings and provenance (<stage>_summary.json) and
its figures out, published only when all of it is written."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from ..core.resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, writing
from .layers import add_recipe_args, recipe_from_args


def add_stage_parser(
    p: argparse.ArgumentParser,
    section: str,
    settings: type,
    files: str,
    prompt_flags: dict[str, str],
    note: str = "",
    flags: dict[str, str] | None = None,
) -> None:
    """The checkpoint, --out/--force, one flag per field of the stage's settings class (but
    `enabled`; `flags` spells some differently), the [prompts] flags named, the recipe arguments
    and --device."""
    from ..core.settings import PromptSettings, add_flags

    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help=f"run directory{note}")
    add_out(p, f"directory for {files}")
    names = [f.name for f in fields(settings) if f.name not in ("enabled", "learners")]
    add_flags(p, section, settings, {name: (flags or {}).get(name, name.replace("_", "-")) for name in names})
    add_flags(p, "prompts", PromptSettings, prompt_flags)
    add_recipe_args(p)
    add_device(p)


def add_registered_parsers(sub) -> None:
    """One subcommand per registered analysis (probe/core/stages.py), `icl-probe <stage name>`,
    its flags from its settings class as a built-in stage's."""
    from ..core.stages import registered

    for name, declared in registered().items():
        if declared.command in sub.choices or declared.commands or declared.settings is None:
            continue  # register_stage refuses the built-in commands' names; a second build of the parser
        p = sub.add_parser(
            declared.command,
            help=declared.title,
            description=declared.description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        files = f"its tables (CSV), figures and {name}_summary.json"
        prompt_flags = {"seed": "seed", **dict(declared.prompt_flags)}
        add_stage_parser(p, name, declared.settings, files, prompt_flags, flags=dict(declared.flags))
        p.set_defaults(registered_stage=name)


def run(args: argparse.Namespace) -> int:
    """`icl-probe <stage name>` of a registered analysis: its tables as <table>.csv (the data entries
    its `files` names as <entry>.json), its summary.json block with its settings and provenance as
    <stage>_summary.json and its figures, published only when all of it is written; its findings
    line printed."""
    from ..core.config import to_dict
    from ..core.errors import ConfigError
    from ..core.provenance import stamp
    from ..core.stages import StageTables, registered
    from ..io.formats import load_checkpoint
    from ..reporting.build import Context, run_stages
    from ..reporting.cache import StageCache
    from ..reporting.schema import strict, to_json
    from ..reporting.summary import provenance

    declared = registered()[args.registered_stage]
    target = output_target(args, declared.command, (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)
    own: set[str] = set()  # its own tables (those of the stages it needs are not written)
    seen: set[str] = set()

    def note(stage, tables) -> None:
        new = set(tables) - seen
        seen.update(new)
        if stage.name == declared.name:
            own.update(new)

    device, progress = check_device(args.device), not args.quiet
    if declared.refusal(ckpt):  # why it cannot run on this checkpoint, before any work
        raise ConfigError(declared.refusal(ckpt))
    built = run_stages(ckpt, recipe, device, StageCache(None), progress, only={declared.name}, on_done=note)
    context = Context(ckpt, recipe, device, progress, earlier=built)
    tables = StageTables(built.tables, built.data, ckpt)
    block = declared.summarise(tables, recipe)
    with writing(target) as out:
        for name in sorted(own, key=list(built.tables).index):
            built.tables[name].to_csv(out / f"{name}.csv", index=False)
        for name in (name for name in declared.files if name in tables.data):
            (out / f"{name}.json").write_text(json.dumps(tables.data[name], indent=2) + "\n")
        prompts = {key: getattr(recipe.prompts, key) for key in ("seed", *dict(declared.prompt_flags))}
        settings = {**to_dict(getattr(recipe, declared.name)), **prompts}
        written = {declared.block_key: to_json(block), "settings": settings, **stamp()}
        (out / f"{declared.name}_summary.json").write_text(json.dumps(strict(written), indent=2, default=str) + "\n")
        declared.figures({name: built.tables[name] for name in own}, out, context)
    summary = provenance(ckpt, recipe)  # what its findings read: its own block, the checkpoint and the recipe
    summary.stages = {declared.block_key: block}
    lines = declared.findings(block, summary)
    for line in lines if isinstance(lines, list) else [lines]:
        if line:
            print(line)
    print(f"wrote {target.path}")
    return 0
