"""Run one study recipe over a family of checkpoints (globs, or the snapshots of one run):
per-model analyses through an executor, then one tidy table (study.csv: model x analysis x
metric, with each model's config fields as columns), figures across models, summary.json and a
index.html (figures/*.png beside it). Finished models are kept as they finish; re-running resumes.

examples:
  icl-probe study depth-phases --out reports/study-depth-phases --jobs 2
  icl-probe study training-dynamics --out reports/study-training-dynamics
  icl-probe study analyses/relu-depth.toml --out /tmp/relu --executor slurm --slurm-cluster local
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_device, add_out, check_device, positive_int


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="study recipe: a name in analyses/ or a .toml path")
    add_out(p, "study directory (resumable: finished models are kept)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a study recipe value")
    p.add_argument("--executor", default="local", help="local (process pool, default) or slurm (submitit)")
    p.add_argument("--jobs", type=positive_int, default=1, help="models analysed at once (default 1)")
    p.add_argument("--slurm-cluster", default="auto", help="submitit cluster: auto (Slurm if present), local, debug")
    add_device(p)


def run(args: argparse.Namespace) -> int:
    import time

    from ..checkpoint import atomic_write
    from ..config import parse_override
    from ..outputs import OutputTarget, mark_run_directory
    from ..study.present import write_presentation
    from ..study.recipe import resolve_models, resolve_study
    from ..study.run import check_models, check_study_size, run_study

    recipe = resolve_study(args.recipe, [parse_override(s) for s in args.set])
    device = check_device(args.device)
    models = resolve_models(recipe)  # every checkpoint is an input the output may not hold or replace
    target = OutputTarget(Path(args.out), "study", force=args.force, inputs=tuple(models))
    out = target.path
    check_models(models)  # unknown globs, empty sets, mixed tasks: before any work
    check_study_size(recipe, models)  # every size a study sets, against memory: before any work
    recipe.report_recipe()
    mark_run_directory(out, "study")
    start = time.perf_counter()
    table = run_study(
        recipe,
        out,
        executor=args.executor,
        jobs=args.jobs,
        device=device,
        cluster=args.slurm_cluster,
        progress=not args.quiet,
    )
    atomic_write(out / "study.csv", lambda p: table.to_csv(p, index=False))
    summary = write_presentation(table, recipe, out, {"total": round(time.perf_counter() - start, 1)})
    mark_run_directory(out, "study")
    for model, entry in summary["closest_learner"].items():
        if "spd" in entry:
            print(f"{model}: closest by SPD {entry['spd']['closest']}, by ILW {entry.get('ilw', {}).get('closest')}")
    print(f"study written to {out}/index.html (study.csv, summary.json, figures/)")
    return 0
