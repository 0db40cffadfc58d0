"""Build a probe report: one command from a checkpoint to an HTML report (index.html with its
figures/*.png beside it), the tables behind them (CSV) and summary.json.

With no arguments it runs the quick recipe on the shipped default checkpoint and writes
runs/<checkpoint>-<recipe>/ (runs/ is ignored by git, so in a checkout the committed example
reports under reports/ stay as they are). Recipes are TOML files in analyses/ (smoke: seconds, every
stage; quick: the default; full: paper scale; relu, ...) or a path.

examples:
  icl-probe report
  icl-probe report --recipe smoke --out runs/smoke
  icl-probe report checkpoints/gpt2-default --recipe full --device cuda
  icl-probe report checkpoints/gpt2-default --compare checkpoints/lstm-default --out reports/vs-lstm
  icl-probe report path/to/garg/run --set prompts.test=256 --set probes.enabled=false
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.resources import DEFAULT_CHECKPOINT, cache_dir
from .common import add_device, add_out

REPORTS = Path("runs")  # relative to the working directory, as every --out is; git-ignored in a checkout


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)"
    )
    from ..core.resources import RECIPE_DIR

    shipped = sorted(f.stem for f in RECIPE_DIR.glob("*.toml") if "[[sweeps]]" in f.read_text())
    p.add_argument(
        "--recipe",
        default="quick",
        help=f"report recipe: one of {', '.join(shipped)} (analyses/), or a .toml path (default: quick)",
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value, e.g. prompts.test=256"
    )
    add_out(p, "report directory (default: runs/<checkpoint>-<recipe>)", required=False)
    p.add_argument("--compare", help="a second checkpoint (e.g. the LSTM) whose Table 1 is shown beside")
    p.add_argument("--no-cache", action="store_true", help="recompute every stage")
    p.add_argument("--cache-dir", help="stage cache directory (default: $ICL_PROBE_CACHE, else ~/.cache/icl-probe)")
    p.add_argument(
        "--max-memory",
        help="memory budget of the whole process, e.g. 2G (default: half the available memory); "
        "capture and the probes' streams go to disk and query states work in smaller chunks as "
        "what the process already holds approaches it",
    )
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..api import run_report
    from ..core.config import parse_override
    from ..io.outputs import safe_name
    from ..reporting.recipe import resolve_recipe

    overrides = [parse_override(s) for s in args.set]
    name = resolve_recipe(args.recipe, overrides).name
    out = args.out or REPORTS / f"{safe_name(Path(args.checkpoint).resolve().name)}-{safe_name(name)}"
    cache = None if args.no_cache else (Path(args.cache_dir) if args.cache_dir else cache_dir())
    path = run_report(
        args.checkpoint,
        args.recipe,
        overrides,
        out,
        compare=args.compare,
        device=args.device,
        cache_dir=cache,
        max_memory=args.max_memory,
        force=args.force,
        progress=not args.quiet,
    )
    print(f"report written to {path}/index.html (summary.json, figures/, data/)")
    return 0
