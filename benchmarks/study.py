"""Cost of a study: the same small study with --jobs 1 and --jobs 2 (local process pool).

Prints wall times, the speed-up ratio, and whether both runs wrote identical study.csv files.
Run from the repository root:  python benchmarks/study.py [--models 4]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)

# isort: split
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

RECIPE = '''
description = "benchmark"
checkpoints = ["m/*"]
analyses = ["evaluate", "heatmap", "spd_ilw"]
prompts = 64
evaluate_prompts = 256
[set]
"prompts.train" = 256
"prompts.val" = 64
"prompts.test" = 128
"prompts.induced" = 16
"similarity.bootstrap" = 100
[[compare]]
label = "least_squares"
learner = "least_squares"
[[compare]]
label = "gd_best"
learner = "gd"
grid = {steps = [1, 4, 16, 64]}
pick = "best"
'''


def main() -> None:
    import os

    from conftest import build_cfg

    from probe.cli import main as cli
    from probe.io.checkpoint import save_model
    from probe.models import build_model

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.models):
            torch.manual_seed(i)
            cfg = build_cfg(d=4, points=12, width=32, layers=2 + i % 3)
            save_model(build_model(cfg.model).eval(), cfg, root / "m" / f"model{i}")
        (root / "s.toml").write_text(RECIPE)
        os.chdir(root)
        times, digests = {}, {}
        for jobs in (1, 2):
            start = time.perf_counter()
            assert cli(["-q", "study", "s.toml", "--out", f"out{jobs}", "--jobs", str(jobs)]) == 0
            times[jobs] = time.perf_counter() - start
            digests[jobs] = hashlib.sha256((root / f"out{jobs}" / "study.csv").read_bytes()).hexdigest()
        print(f"models={args.models} jobs1={times[1]:.1f}s jobs2={times[2]:.1f}s speedup={times[1] / times[2]:.2f} "
              f"identical_study_csv={digests[1] == digests[2]}")


if __name__ == "__main__":
    main()
