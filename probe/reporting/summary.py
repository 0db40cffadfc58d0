"""summary.json from the report's tables: a `Summary` (probe/reporting/schema.py, README "summary.json")."""

from __future__ import annotations

from typing import Any

from ..core.provenance import display_path, stamp
from ..core.stages import StageTables, registered
from ..io.checkpoint import LoadedCheckpoint
from .evidence import evidence
from .recipe import Recipe
from .schema import SCHEMA_VERSION, CheckpointInfo, NotMeasured, Summary, Verdict


def build_summary(built, ckpt: LoadedCheckpoint, recipe: Recipe, compare: LoadedCheckpoint | None) -> Summary:
    """summary.json: provenance, then the block of each registered analysis that ran, the paired
    verdicts they add, the evidence table and the compared checkpoint (README, "summary.json"; what
    the stages compare is added by the report, probe/reporting/compare.py)."""
    t = StageTables(built.tables, built.data, ckpt)
    ran = {name: declared for name, declared in registered().items() if name in built.timings}
    summary = provenance(ckpt, recipe, built.timings, [name for name, hit in built.cached.items() if hit])
    blocks = {declared.block_key: declared.summarise(t, recipe) for declared in ran.values()}
    summary.stages = {key: block for key, block in blocks.items() if block is not None}
    summary.not_measured = [
        NotMeasured(name, reason, f"{name}.enabled")
        for name, reason in built.not_measured.items()
        if not name.startswith("compare_")
    ] or None
    verdicts = [
        Verdict(**row)
        for declared in ran.values()
        if declared.block_key in summary.stages
        for row in declared.verdicts(summary.stages[declared.block_key], t)
    ]
    summary.verdicts = verdicts or None
    summary.evidence = evidence(summary) or None  # last: it reads every block above
    if compare is not None:  # the stages' parts (their `compare` hooks) are added by the report
        summary.compare = {
            "checkpoint": {"path": display_path(compare.path), "format": compare.format, "sha256": compare.sha256}
        }
    return summary


def provenance(
    ckpt: LoadedCheckpoint, recipe: Recipe, timings: dict[str, float] | None = None, cached: list[str] | None = None
) -> Summary:
    """A Summary with its provenance (checkpoint, recipe, versions, git commit, seed) and no blocks yet."""
    return Summary(
        schema_version=SCHEMA_VERSION,
        checkpoint=checkpoint_block(ckpt),
        recipe=recipe.to_dict(),
        **stamp(),
        seed=recipe.prompts.seed,
        timings=timings or {},
        cached_stages=cached or [],
    )


def checkpoint_block(ckpt: LoadedCheckpoint) -> CheckpointInfo:
    task = {**ckpt.config.task.__dict__, "mixture_weights": list(ckpt.config.task.mixture_weights)}
    info: dict[str, Any] = {key: value for key, value in ckpt.meta.items() if key in ("train_step", "train_seconds")}
    return CheckpointInfo(
        path=display_path(ckpt.path),
        format=ckpt.format,
        sha256=ckpt.sha256,
        name=ckpt.name,
        model=ckpt.config.model.__dict__,
        task=task,
        parameters=int(sum(p.numel() for p in ckpt.model.parameters())),
        **info,
    )
