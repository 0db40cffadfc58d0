"""Attention-pooled probes (seed 002 §5, App. C.8) for X^T y and w_OLS at every layer and
prefix, linear and MLP heads, with controls: the same probes on a random-weights model of the
same architecture and on shuffled targets (selectivity = score - control score).

examples:
  icl-probe probes checkpoints/gpt2-default --out reports/probes
  icl-probe probes checkpoints/gpt2-default --out /tmp/p --kinds mlp --max-iter 1000 --prompts 2048
"""

from __future__ import annotations

import argparse

from ..core.config import to_dict
from .stage import add_stage_parser, run_stage


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.settings import ProbeSettings

    files = "probes.csv, probes_summary.json and probes.png"
    add_stage_parser(p, "probes", ProbeSettings, files, {"test": "test-prompts", "seed": "seed"})


def run(args: argparse.Namespace) -> int:
    from ..reporting.schema import to_json
    from ..reporting.summary import probe_summary

    def show(table) -> None:
        for target, kinds in probe_summary(table).items():
            for kind, entry in kinds.items():
                print(
                    f"{target:6s} {kind:6s} best layer {entry.best_layer}: R^2 by layer "
                    + " ".join(f"{v:.2f}" for v in entry.r2)
                    + "; random-model control "
                    + " ".join(f"{v:.2f}" for v in entry.control_r2)
                )

    return run_stage(
        args,
        "probes",
        "probes",
        summary=lambda table, data: {"probes": to_json(probe_summary(table, data.get("probe_intervals")))},
        record=lambda ckpt, r: {**to_dict(r.probes), "test_prompts": r.prompts.test, "seed": r.prompts.seed},
        show=show,
    )
