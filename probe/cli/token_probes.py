"""Probes for the state a learner keeps in the tokens (probe/analysis/token_probes.py, issue 60):
per example token, (S/t) x, (S/t)^3 x and Newton's M_k x (seed 003 eq. 8, Thm. 1), and with
--targets w_newton w_gd w_ols the weight iterates over the examples the token sees, read by one
ridge map per layer boundary and token kind; R^2 on held-out prompts with 90% intervals, and each
layer's gain over the same probe of the example's x alone (at large t, S/t is near I, so x alone
already gives part of S x) with a paired interval. A planted Newton model's column tokens (column j
of M_k in token j) are probed too (token kind "column"). Writes token_probes.csv, token_probes.png and run.json.

examples:
  icl-probe token-probes checkpoints/planted/newton --targets newton_mx --iterations 0 1 2 --tokens column --out /tmp/tp
  icl-probe token-probes checkpoints/planted/newton-relu --alpha 0.0030864 --out /tmp/tp
  icl-probe token-probes checkpoints/gpt2-default --targets sx newton_mx --iterations 0 1 2 3 4 --out /tmp/tp
"""

from __future__ import annotations

import argparse

from .common import add_device, add_out, check_device, output_target, positive_int, seed, writing


def add_parser(p: argparse.ArgumentParser) -> None:
    from ..core.resources import DEFAULT_CHECKPOINT
    from ..core.settings import TOKEN_KINDS, TOKEN_TARGETS, TokenProbeSettings

    defaults = TokenProbeSettings()  # the report's [token_probes] defaults
    p.add_argument(
        "checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT), help="run directory (default: shipped default)"
    )
    add_out(p, "directory for token_probes.csv, token_probes.png and run.json")
    p.add_argument("--targets", nargs="+", choices=TOKEN_TARGETS, default=list(defaults.targets), help="targets")
    p.add_argument(
        "--tokens",
        nargs="+",
        choices=TOKEN_KINDS,
        default=None,
        help="token kinds (default: x y, and column where the model keeps column tokens: a planted Newton model)",
    )
    p.add_argument(
        "--iterations", nargs="+", type=int, default=list(defaults.iterations), help="Newton iteration counts k"
    )
    p.add_argument(
        "--alpha",
        default=defaults.alpha,
        help="newton_mx's M_0 = alpha S/t: auto (a planted Newton model's own alpha, else spectral), spectral, "
        "or a positive number",
    )
    p.add_argument("--gd-steps", nargs="+", type=int, default=list(defaults.gd_steps), help="GD step counts k of w_gd")
    p.add_argument(
        "--eta", default=defaults.eta, help="w_gd's step: auto (a planted GD model's own, else 1 / lambda_max(S/t))"
    )
    p.add_argument("--prompts", type=positive_int, default=defaults.prompts, help="training prompts")
    p.add_argument("--test-prompts", type=positive_int, default=defaults.test, help="held-out prompts")
    p.add_argument("--bootstrap", type=positive_int, default=1000, help="resamples of the test prompts")
    p.add_argument("--seed", type=seed, default=0)
    add_device(p)


def run(args: argparse.Namespace) -> int:
    from ..analysis.token_probes import probed_tokens, settings_targets, token_probe_study
    from ..core.provenance import display_path
    from ..core.settings import TokenProbeSettings
    from ..io.formats import load_checkpoint
    from ..reporting import figures
    from .layers import write_tables

    settings = TokenProbeSettings(
        targets=args.targets,
        tokens=args.tokens or TokenProbeSettings().tokens,
        iterations=args.iterations,
        alpha=args.alpha,
        gd_steps=args.gd_steps,
        eta=args.eta,
        prompts=args.prompts,
        test=args.test_prompts,
    )
    target = output_target(args, "token-probes", (args.checkpoint,))
    device = check_device(args.device)
    ckpt = load_checkpoint(args.checkpoint)
    targets = settings_targets(settings, ckpt.config.model)
    tokens = args.tokens or probed_tokens(ckpt.model, settings.tokens)
    table = token_probe_study(
        ckpt.model,
        ckpt.config.task,
        targets,
        settings.prompts,
        settings.test,
        args.seed,
        device,
        tokens,
        args.bootstrap,
    )
    record = {
        "command": "token-probes",
        "checkpoint": display_path(ckpt.path),
        "targets": args.targets,
        "tokens": list(tokens),
        "iterations": args.iterations,
        "alpha": settings.alpha_for(ckpt.config.model),
        "gd_steps": args.gd_steps,
        "eta": settings.eta_for(ckpt.config.model),
        "prompts": args.prompts,
        "test_prompts": args.test_prompts,
        "bootstrap": args.bootstrap,
        "seed": args.seed,
    }
    with writing(target) as out:
        write_tables(out, {"token_probes": table}, record)
        figures.token_probes(table, out / "token_probes")
    view = table.pivot_table(index="layer", columns=["token", "target"], values="r2")
    print(view.to_string(float_format=lambda v: f"{v:.3f}"))
    print(f"wrote {target.path}")
    return 0
