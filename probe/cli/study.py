"""Run one study recipe over a family of checkpoints (globs, or the snapshots of one run):
per-model analyses through an executor, then one tidy table (study.csv: model x analysis x
metric, with each model's config fields as columns), figures across models, summary.json and a
index.html (figures/*.png beside it). Finished models are kept as they finish; re-running resumes.

Either a study recipe (a name in analyses/ or a .toml path), or checkpoints named on the command
line: then each gets evaluate, heatmap, spectral and evidence with the report recipe --recipe, on
the axis the models vary along (n_dims where d varies, else the first differing model field;
--set x=... chooses another). --set overrides any key below (--set evaluate_prompts=256).

examples:
  icl-probe study depth-phases --out reports/study-depth-phases --jobs 2
  icl-probe study checkpoints/gpt2-default checkpoints/lstm-default --recipe quick --out runs/gpt2-vs-lstm
  icl-probe study checkpoints/gpt2-default checkpoints/gpt2-d8 --out runs/d4-vs-d8
  icl-probe study analyses/relu-depth.toml --out /tmp/relu --executor slurm --slurm-cluster local
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_device, add_out, positive_int


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..study.recipe import recipe_keys_help

    p.epilog = "study recipe keys (TOML, or --set KEY=VALUE):\n" + recipe_keys_help()
    p.add_argument(
        "study", nargs="+", metavar="RECIPE_OR_CHECKPOINT", help="a study recipe, or two or more checkpoint directories"
    )
    p.add_argument(
        "--recipe", default=None, help="with checkpoints: the report recipe their analyses use (default quick)"
    )
    add_out(p, "study directory (resumable: finished models are kept)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a study recipe value")
    p.add_argument(
        "--executor",
        default="local",
        help="local (default: this machine; a process pool with --jobs > 1) or slurm (submitit)",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="models analysed at once (default 1: in this process; more: worker processes, "
        "which load the toolkit's and entry-point plugins' stages)",
    )
    p.add_argument("--slurm-cluster", default="auto", help="submitit cluster: auto (Slurm if present), local, debug")
    add_device(p)


def run(args: argparse.Namespace) -> int:
    import json

    from ..api import run_study_command
    from ..core.config import parse_override
    from ..core.errors import ConfigError

    named = args.study
    if len(named) == 1 and not Path(named[0]).is_dir():
        if args.recipe is not None:
            raise ConfigError(
                "study: --recipe is the report recipe of a study of checkpoints; in a study recipe set `report = ...`"
            )
        recipe, checkpoints = named[0], None
    else:
        recipe, checkpoints = args.recipe or "quick", named
    run_study_command(
        recipe,
        [parse_override(s) for s in args.set],
        args.out,
        executor=args.executor,
        jobs=args.jobs,
        device=args.device,
        cluster=args.slurm_cluster,
        force=args.force,
        progress=not args.quiet,
        checkpoints=checkpoints,
    )
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    for model, entry in summary["closest_learner"].items():
        if "spd" in entry:
            print(f"{model}: closest by SPD {entry['spd']['closest']}, by ILW {entry.get('ilw', {}).get('closest')}")
    print(f"study written to {args.out}/index.html (study.csv, summary.json, figures/)")
    return 0
