"""One report stage run alone (`icl-probe probes`, `order`, `steer`): the checkpoint and the
report's recipe (then the command's flags) in; the stage's table (<stage>.csv), its summary with
the settings and provenance (<stage>_summary.json) and its figure out, published only when all of
it is written. A command supplies what differs: a check before any work, the summary block, the
settings recorded, and what it prints."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..core.resources import DEFAULT_CHECKPOINT
from .common import add_device, add_out, check_device, output_target, writing
from .layers import add_recipe_args, recipe_from_args


def add_stage_parser(
    p: argparse.ArgumentParser, section: str, settings: type, files: str, prompt_flags: dict[str, str], note: str = ""
) -> None:
    """The checkpoint, --out/--force, one flag per field of the stage's settings class (but
    `enabled`), the [prompts] flags named, the recipe arguments and --device."""
    from ..core.settings import PromptSettings, add_flags

    p.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help=f"run directory{note}")
    add_out(p, f"directory for {files}")
    add_flags(p, section, settings, [f.name for f in fields(settings) if f.name not in ("enabled", "learners")])
    add_flags(p, "prompts", PromptSettings, prompt_flags)
    add_recipe_args(p)
    add_device(p)


def run_stage(
    args: argparse.Namespace,
    command: str,
    stage: str,
    summary: Callable[[Any, dict[str, Any]], dict[str, Any]],
    record: Callable[[Any, Any], dict[str, Any]],
    show: Callable[[Any], None],
    check: Callable[[Any, Any], None] = lambda ckpt, recipe: None,
) -> int:
    """Run report stage `stage` on args.checkpoint into args.out: `check(ckpt, recipe)` before any
    work, then the table, {**summary(table, the stage's data), "settings": record(ckpt, recipe), provenance} and the
    stage's figure; `show(table)` prints."""
    from ..core.provenance import stamp
    from ..io.formats import load_checkpoint
    from ..reporting.build import STAGES, Context

    target = output_target(args, command, (args.checkpoint,))
    ckpt = load_checkpoint(args.checkpoint)
    recipe = recipe_from_args(args, ckpt)  # the report's settings, then the flags
    check(ckpt, recipe)
    context = Context(ckpt, recipe, check_device(args.device), progress=not args.quiet)
    tables, data = STAGES[stage].run(context)
    table = tables[stage]
    with writing(target) as out:
        table.to_csv(out / f"{stage}.csv", index=False)
        written = {**summary(table, data), "settings": record(ckpt, recipe), **stamp()}
        (out / f"{stage}_summary.json").write_text(json.dumps(written, indent=2, default=str) + "\n")
        STAGES[stage].figures(tables, out, context)
    show(table)
    print(f"wrote {target.path}")
    return 0
