"""Paper scale: the quick report of a Garg et al. "standard"-shaped model (GPT-2, 12 layers,
width 256, 8 heads, d = 20, 41 points; random init) against the shipped default checkpoint's.

Each report runs in its own process (`icl-probe report --no-cache`, probes on); the benchmark
prints every stage's seconds and share, the ratio of total times, and each run's peak resident
memory; then the paper-scale report's cost in forward-pass units (FPE: its wall time over one bare
forward of the model over the recipe's curve prompts) beside the recipe's floor in the same units
(the forwards it cannot avoid, counted from its settings), and the forward work its stages do as
built, counted in token-blocks (`work_fpe`), and the FPE range the unit's spread allows (the bare
forward timed three times before the reports and three after; the unit is the best of the three
after). Last line: `fpe=<x> floor=<y> peak_gb=<z>`. It also times SimW query states on the same inputs by the key/value-cache path and by
one sequence per prefix and query (the old path), and checks they agree.
Run from the repository root:  python benchmarks/paper_scale.py [--skip-reports | --skip-query-states]
[--set KEY=VALUE ...] (recipe overrides for both reports, e.g. --set probes.precision=float32)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)

# isort: split
import torch

REPO = Path(__file__).resolve().parents[1]
ICL = [sys.executable, "-m", "probe"]


def paper_model(directory: Path) -> Path:
    from probe.data.config import TaskConfig
    from probe.io.checkpoint import save_model
    from probe.io.run_config import RunConfig
    from probe.models import build_model
    from probe.models.config import ModelConfig

    torch.manual_seed(0)
    cfg = RunConfig(model=ModelConfig(family="gpt2", n_dims=20, n_positions=41, n_embd=256, n_layer=12, n_head=8),
                    task=TaskConfig(n_dims=20, n_points=41))
    save_model(build_model(cfg.model).eval(), cfg, directory)
    return directory


def timed_report(ckpt: Path, out: Path, overrides: tuple[str, ...] = ()) -> tuple[dict, float, float, float, float]:
    """(stage timings, wall seconds, peak RSS in GB, user and system seconds) of one report in a
    child process (the children's rusage before and after); `overrides`: its --set KEY=VALUE."""
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sets = [arg for kv in overrides for arg in ("--set", kv)]
    subprocess.run([*ICL, "-q", "report", str(ckpt), "--out", str(out), "--no-cache", *sets], check=True, cwd=REPO)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = max(after.ru_maxrss, before.ru_maxrss) / 2**20
    summary = json.loads((out / "summary.json").read_text())
    return summary["timings"], wall, peak, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def bare_forwards(ckpt: Path) -> list[float]:
    """Seconds of three forwards of the model over the quick recipe's curve prompts (the FPE unit is
    the best of three taken after the reports)."""
    from probe.data.tasks import generator_for, sample_prompts
    from probe.io.formats import load_checkpoint
    from probe.reporting.recipe import resolve_recipe

    loaded = load_checkpoint(ckpt)
    p = sample_prompts(loaded.config.task, resolve_recipe("quick").prompts.curve, generator=generator_for(0))
    times = []
    with torch.no_grad():
        for _ in range(3):
            start = time.perf_counter()
            for lo in range(0, p.xs.shape[0], 256):
                loaded.model(p.xs[lo : lo + 256], p.ys[lo : lo + 256])
            times.append(time.perf_counter() - start)
    return times


def quick_recipe(loaded, overrides: tuple[str, ...] = ()):
    """The quick recipe as the report runs it on `loaded`: --set overrides applied, then adapted."""
    from probe.core.config import parse_override
    from probe.reporting.recipe import adapt_recipe, resolve_recipe

    return adapt_recipe(resolve_recipe("quick", [parse_override(kv) for kv in overrides]), loaded.config)


def floor_fpe(ckpt: Path, overrides: tuple[str, ...] = ()) -> float:
    """A floor for the quick recipe in curve-forward units, counted from its settings: every prompt
    set it needs through the model once (curve; read-out train, val and test; probe training and
    test prompts, twice with the random-weights control; forgetting; order prompts x permutations;
    ablation prompts and their held-out twins; patching's clean and corrupted prompts; the shifted
    prompts of every [ood] shift and the unshifted prompts its learners are matched on; the token
    probes' prompts where they are not the probes') plus SimW's fresh queries and the replaced
    queries of the shifts that replace them as the tokens they add (single tokens over 2n tokens a
    prompt). The ablations' and patches' partial re-runs are not counted: this is a floor."""
    from probe.io.formats import load_checkpoint

    loaded = load_checkpoint(ckpt)
    r = quick_recipe(loaded, overrides)
    n, d = loaded.config.task.n_points, loaded.config.task.n_dims
    p = r.prompts
    prompts = p.curve + p.train + p.val + p.test
    prompts += min(p.induced, p.test) * (p.queries or 4 * d) * (n - 1) / (2 * n)
    if r.probes.enabled:
        prompts += (r.probes.prompts + p.test) * (2 if r.probes.controls else 1)
    prompts += r.forgetting.prompts if r.forgetting.enabled else 0
    prompts += r.order.prompts * r.order.permutations if r.order.enabled else 0
    if r.interventions.enabled:
        prompts += 2 * r.interventions.prompts + 2 * r.interventions.patch_prompts
    ood, replacing = ood_prompts(loaded, r)
    prompts += ood + replacing * r.ood.prompts * (n - 1) / (2 * n)
    prompts += sum(token_prompts(r).values())
    return prompts / p.curve


def ood_prompts(loaded, r) -> tuple[int, int]:
    """The [ood] stage's prompts through the model (each shift's, and the unshifted prompts the
    learners are matched on) and how many of its shifts replace the queries (one query token per
    prefix after a cached forward); (0, 0) where the stage is off or refuses the checkpoint."""
    from probe.analysis.shift_tracking import MATCH_PROMPTS
    from probe.data.shifts import SHIFTS, parse_shift
    from probe.stages.ood import shifts_refusal

    if not r.ood.enabled or shifts_refusal(loaded):
        return 0, 0
    replacing = sum(SHIFTS[parse_shift(s)[0]].replaces_query for s in r.ood.shifts)
    return r.ood.prompts * len(r.ood.shifts) + MATCH_PROMPTS, replacing


def token_prompts(r) -> dict[str, int]:
    """The token probes' training and test prompts that no earlier stage's streams give them (the
    probe study's float64 streams of the same prompt sets are read from the report's stream store)."""
    if not r.token_probes.enabled:
        return {}
    shared = r.probes.enabled and r.probes.precision == "float64"
    own = {"train": (r.token_probes.prompts, r.probes.prompts), "test": (r.token_probes.test, r.prompts.test)}
    return {k: n for k, (n, probes) in own.items() if not (shared and n == probes)}


def work_fpe(ckpt: Path, float64_cost: float, overrides: tuple[str, ...] = ()) -> dict[str, float]:
    """The forward work the quick recipe's stages do as they are built, in curve-forward units,
    counted in token-blocks (one token through one block) from its settings and the model's depth:
    what `floor_fpe` counts plus the float64 cost of float64 probe streams (`float64_cost`: a float64
    forward's time over a float32 one's, measured), the order prompts' real lengths (2t + 1 tokens),
    the prompt runs behind the SimW queries and forgetting's queries, the ablations' re-runs from
    the ablated block (skip, and zero and mean of each MLP), the patching heatmap's windows
    (tokens p..query from each boundary), the random-weights null model's predictions on the
    held-out prompts, and the layer-map check (its clean and source runs, each twice: predictions,
    then streams and keys, and each pooled query token resumed from every boundary), the [ood]
    stage's shifted and matching prompts with one query token per prefix for a shift that replaces
    the queries, and the token probes' float64 streams not read from the probe study's. Attention's
    own cost, the learners, fits, bootstraps and figures are not counted: the rest of a report's FPE
    is those."""
    from probe.io.formats import load_checkpoint

    loaded = load_checkpoint(ckpt)
    r = quick_recipe(loaded, overrides)
    n, d, layers = loaded.config.task.n_points, loaded.config.task.n_dims, loaded.config.model.n_layer
    p, full = r.prompts, 2 * n * layers  # token-blocks of one whole prompt
    work = {"evaluate": p.curve * full, "read-outs": (p.train + p.val + p.test) * full}
    induced = min(p.induced, p.test)
    work["SimW queries"] = induced * full + induced * (p.queries or 4 * d) * n * layers
    work["null model"] = p.test * full
    if r.probes.enabled:
        cost = float64_cost if r.probes.precision == "float64" else 1.0
        work["probe streams"] = (r.probes.prompts + p.test) * (2 if r.probes.controls else 1) * full * cost
    if r.forgetting.enabled:
        work["forgetting"] = r.forgetting.prompts * (full + (n - 1) * layers)
    if r.order.enabled:
        ts = r.order.prefixes_for(d, n)
        work["order"] = r.order.prompts * r.order.permutations * sum(2 * t + 1 for t in ts) * layers
    if r.interventions.enabled:
        s = r.interventions
        reruns = 3 * layers * (layers + 1) / 2  # skip, zero-MLP, mean-MLP of each block, from that block on
        work["ablation"] = 2 * s.prompts * full + s.prompts * 2 * n * reruns
        q = n - 1 if s.query is None else s.query
        positions = range(2 * q + 1)[-s.max_positions :] if s.max_positions > 0 else range(2 * q + 1)
        windows = sum(2 * q + 1 - pos for pos in positions)
        work["patching"] = 2 * s.patch_prompts * (2 * q + 1) * layers + s.patch_prompts * windows * sum(
            layers - b for b in range(layers + 1)
        )
        if s.learner_labels(r.sweeps):
            from probe.interventions.patch import spread_examples

            queries = len(spread_examples(n, s.max_queries))
            work["map check"] = 4 * s.patch_prompts * full + s.patch_prompts * queries * sum(
                layers - b for b in range(layers)
            )
    ood, replacing = ood_prompts(loaded, r)
    if ood:
        work["ood"] = ood * full + replacing * r.ood.prompts * n * layers
    tokens = token_prompts(r)
    if tokens:
        work["token streams"] = sum(tokens.values()) * full * float64_cost
    return {k: v / (p.curve * full) for k, v in work.items()}


def float64_cost(ckpt: Path, prompts: int = 256) -> float:
    """A float64 forward's time over a float32 one's on the same prompts (best of three each)."""
    import copy

    from probe.data.tasks import generator_for, sample_prompts
    from probe.io.formats import load_checkpoint

    loaded = load_checkpoint(ckpt)
    p = sample_prompts(loaded.config.task, prompts, generator=generator_for(0))
    double = copy.deepcopy(loaded.model).double()
    best = {}
    with torch.no_grad():
        for name, model, xs, ys in (("32", loaded.model, p.xs, p.ys), ("64", double, p.xs.double(), p.ys.double())):
            best[name] = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for lo in range(0, prompts, 64):
                    model(xs[lo : lo + 64], ys[lo : lo + 64])
                best[name] = min(best[name], time.perf_counter() - start)
    return best["64"] / best["32"]


def query_state_speedup(ckpt: Path, prompts: int, queries: int) -> tuple[float, float, float]:
    from probe.analysis.states import cached_query_states, sequence_query_states
    from probe.io.formats import load_checkpoint

    model = load_checkpoint(ckpt).model
    g = torch.Generator().manual_seed(0)
    d, n = 20, 41
    xs, ys, qs = torch.randn(prompts, n, d, generator=g), torch.randn(prompts, n, generator=g), torch.randn(prompts, queries, d, generator=g)
    t0 = time.perf_counter()
    new = cached_query_states(model, xs, ys, qs)
    t1 = time.perf_counter()
    old = sequence_query_states(model, xs, ys, qs)
    t2 = time.perf_counter()
    return t2 - t1, t1 - t0, float(np.abs(new - old).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--skip-reports", action="store_true", help="only the query-state comparison")
    parser.add_argument("--skip-query-states", action="store_true", help="only the two reports")
    parser.add_argument("--qs-prompts", type=int, default=4)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override for both reports"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paper = paper_model(Path(tmp) / "paper")
        before = bare_forwards(paper) if not args.skip_reports else []
        if not args.skip_query_states:
            old, new, diff = query_state_speedup(paper, args.qs_prompts, 80)
            print(f"query states ({args.qs_prompts} prompts x 41 prefixes x 80 queries): sequences {old:.1f}s, "
                  f"kv cache {new:.2f}s, speedup={old / new:.1f}, max |difference| {diff:.1e}")
        if args.skip_reports:
            return
        runs = {}
        for name, ckpt in (("default", REPO / "checkpoints" / "gpt2-default"), ("paper", paper)):
            runs[name] = timed_report(ckpt, Path(tmp) / f"report-{name}", tuple(args.set))
        for name, (timings, wall, peak, user, system) in runs.items():
            stages = {k: v for k, v in timings.items() if isinstance(v, (int, float))}
            total = sum(stages.values())
            shares = ", ".join(f"{k} {v:.1f}s ({100 * v / total:.0f}%)" for k, v in stages.items())
            print(f"{name}: wall {wall:.0f}s, user {user:.0f}s, system {system:.1f}s "
                  f"(sys/user {system / max(user, 1e-9):.3f}), peak RSS {peak:.2f} GB; {shares}")
        print(f"ratio paper/default wall = {runs['paper'][1] / runs['default'][1]:.1f}")
        after = bare_forwards(paper)
        forward = min(after)
        fpe, floor = runs["paper"][1] / forward, floor_fpe(paper, tuple(args.set))
        print(f"paper: one bare forward over the curve prompts {forward:.2f}s; report {fpe:.1f} FPE, floor {floor:.1f} FPE")
        work = work_fpe(paper, float64_cost(paper), tuple(args.set))
        print("forward work as built, FPE: " + ", ".join(f"{k} {v:.2f}" for k, v in work.items())
              + f"; total {sum(work.values()):.1f} (the rest of the report: {fpe - sum(work.values()):.1f})")
        # the machine's speed swings between minutes (REFERENCE.md section 5): the unit's spread over
        # the forwards timed before and after the reports bounds what one FPE figure can resolve
        every = before + after
        print(
            f"unit spread: bare forward {min(every):.2f}-{max(every):.2f} s over {len(every)} runs (3 before, 3 after "
            f"the reports): report {runs['paper'][1] / max(every):.1f}-{runs['paper'][1] / min(every):.1f} FPE"
        )
        print(f"fpe={fpe:.1f} floor={floor:.1f} peak_gb={runs['paper'][2]:.2f}")


if __name__ == "__main__":
    main()
