"""The report's probe stage against its layers stage, and where the probe stage's time goes (the
target: the probes at most 3x the layers stage with both controls kept; the floor says what is left without them).

Runs both stages of the quick recipe on a checkpoint (no cache), then the probe stage's parts on
the same prompts as `probe_study` runs them: the captures (training and test streams of the model
and of its random-weights control), the pooling fits (the model's probes and the shuffled-target
control as one grid on the model's streams, `fit_probe_grids`; the random-weights control) and the
scoring. The floor printed is what remains with the controls left out: one model's captures and one
fit of as many probes as the model's own (the random-weights control's), at the recipe's stopping
rule. Last line:
`probes_over_layers=<ratio> floor_over_layers=<ratio>`.

    python benchmarks/probe_cost.py [--checkpoint checkpoints/gpt2-default] [--threads N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import probe  # noqa: F401  (before torch: the report's OpenMP waits, probe/core/omp.py)

# isort: split
import torch

DEFAULT = Path(__file__).resolve().parents[1] / "checkpoints" / "gpt2-default"


def main() -> None:
    from probe.analysis.probe_study import default_prefixes
    from probe.analysis.probes import fit_probe_grids, probe_dtype, probe_targets
    from probe.capture.streams import by_position_streams
    from probe.core.seeds import Stream, stream_generator
    from probe.data.tasks import sample_prompts
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import resolve_recipe
    from probe.stages.probes import probe_control_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=str(DEFAULT))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ckpt, recipe = load_checkpoint(args.checkpoint), resolve_recipe("quick")
    built = run_stages(ckpt, recipe, "cpu", StageCache(None), False, only={"layers", "probes"})
    layers = sum(built.timings[name] for name in ("readout", "induced", "layers"))  # the layer analyses, whole
    probes = built.timings["probes"]

    settings, seed, task = recipe.probes, recipe.prompts.seed, ckpt.config.task
    prefixes = settings.prefixes or default_prefixes(task.n_dims, task.n_points)
    train = sample_prompts(task, settings.prompts, generator=stream_generator(seed, Stream.PROBE_TRAIN))
    test = sample_prompts(task, recipe.prompts.test, generator=stream_generator(seed, Stream.PROBE_TEST))
    targets = {k: probe_targets(train.xs, train.ys, k) for k in settings.targets}
    shuffled = {k: v[torch.randperm(len(v), generator=stream_generator(seed, Stream.SHUFFLE))] for k, v in targets.items()}
    combos = [(t, k) for t in prefixes for k in settings.targets]
    fit = {"alphas": settings.alphas, "hidden": settings.hidden, "max_iter": settings.max_iter, "gtol": settings.gtol,
           "ftol": settings.ftol, "seed": seed, "precision": settings.precision, "mlp_head": settings.mlp_head,
           "layout": "lpnd"}  # fmt: skip
    dtype = probe_dtype(settings.precision)
    parts: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - start
        return out

    for label, model in (("model", ckpt.model), ("control", probe_control_model(ckpt, seed))):
        states = timed("captures", lambda m=model: by_position_streams(m, train.xs, train.ys, dtype=dtype))
        sets = {"own": targets, "shuffled": shuffled} if label == "model" else {"own": targets}
        name = "fit model + shuffled" if label == "model" else "fit control"
        fits = timed(name, lambda s=states, t=sets: fit_probe_grids(s, t, combos, settings.kinds, **fit))
        grid = fits["own"]
        test_states = timed("captures", lambda m=model: by_position_streams(m, test.xs, test.ys, dtype=dtype))
        test_targets = {k: probe_targets(test.xs, test.ys, k) for k in settings.targets}
        timed("scoring", lambda g=grid, s=test_states, t=test_targets: g.score(s, t, recipe.similarity.bootstrap, seed))
    floor = parts["captures"] / 2 + parts["fit control"]  # one fit of as many probes as the model's own
    print(f"torch threads {torch.get_num_threads()}; stages: layers {layers:.1f} s, probes {probes:.1f} s")
    for name, seconds in parts.items():
        print(f"  {name:14s} {seconds:6.1f} s")
    print(f"floor (one model's captures and one fit, no controls) {floor:.1f} s")
    print(f"probes_over_layers={probes / layers:.2f} floor_over_layers={floor / layers:.2f}")


if __name__ == "__main__":
    main()
