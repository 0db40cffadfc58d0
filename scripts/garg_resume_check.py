"""Resume Garg et al.'s own `train.py` from an `icl-probe export` for a few steps, on CPU, and
compare the model's in-context error before and after (the export must be a run their
code continues, not one it breaks).

    python scripts/garg_resume_check.py GARG_SRC CHECKPOINT [--steps 50] [--work DIR]

GARG_SRC is the `src/` folder of github.com/dtsip/in-context-learning. Their train.py imports
wandb, quinine (with funcy), xgboost and munch at the top and calls .cuda(); this script stands in for those
(no logging, no argument parser, tensors stay on the CPU) and runs their `train()` unchanged.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch
import yaml


class _Munch(dict):
    """Attribute access over a nested dict, as their code reads its config."""

    def __getattr__(self, name):
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(name) from None
        if isinstance(value, dict) and not isinstance(value, _Munch):
            value = self[name] = _Munch(value)  # in place, so that nested settings can be changed
        return value

    def __setattr__(self, name, value):
        self[name] = value


def _stub_modules() -> None:
    import importlib.machinery

    for name in ("wandb", "quinine", "xgboost", "munch", "funcy"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # libraries probe find_spec
        sys.modules.setdefault(name, module)
    sys.modules["quinine"].__getattr__ = lambda name: (lambda *a, **k: {})  # type: ignore[attr-defined]  # schema.py
    sys.modules["munch"].Munch = _Munch  # type: ignore[attr-defined]
    sys.modules["funcy"].merge = lambda *ds: {k: v for d in ds if isinstance(d, dict) for k, v in d.items()}  # type: ignore[attr-defined]
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]


def _error_at(model, task_cfg, n_prompts: int = 2048) -> float:
    from probe.analysis.evaluate import error_curve

    curve = error_curve(model.eval(), task_cfg, n_prompts=n_prompts, seed=0)
    return float(curve.loc[curve.n_examples == 2 * task_cfg.n_dims + 1, "model"].iloc[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("garg_src")
    parser.add_argument("checkpoint")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--work", default="/tmp/garg-resume")
    args = parser.parse_args(argv)

    from probe.cli import main as cli
    from probe.io.formats import load_checkpoint

    work = Path(args.work)
    if cli(["-q", "export", args.checkpoint, "--out", str(work), "--force"]) != 0:
        return 2
    before = load_checkpoint(str(work))
    start = int(before.meta.get("train_step", 0))
    error_before = _error_at(before.model, before.config.task)

    _stub_modules()
    sys.path.insert(0, str(Path(args.garg_src).resolve()))
    import train as garg_train  # their src/train.py
    from models import build_model as garg_build_model

    conf = _Munch(yaml.safe_load((work / "config.yaml").read_text()))
    conf["out_dir"] = str(work)
    conf["test_run"] = True  # their flag for "no wandb, no saving"; we save once at the end ourselves
    conf.training["train_steps"] = start + args.steps
    torch.manual_seed(0)
    model = garg_build_model(conf.model)
    model.train()
    garg_train.train(model, conf)  # loads state.pt (weights, Adam state, step), runs their loop
    torch.save(
        {"model_state_dict": model.state_dict(), "optimizer_state_dict": {}, "train_step": start + args.steps},
        work / "state.pt",
    )
    after = load_checkpoint(str(work))
    error_after = _error_at(after.model, after.config.task)
    print(
        f"Garg train.py resumed at step {start} for {args.steps} steps: error/d at 2d+1 "
        f"{error_before:.5f} -> {error_after:.5f} (ratio {error_after / error_before:.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
