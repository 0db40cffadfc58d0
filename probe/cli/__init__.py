"""`icl-probe`: a thin command line; each subcommand lives in its own module.

Heavy libraries (torch, transformer_lens) are imported inside the commands, so `--help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import warnings

from ..core.errors import ProbeError, RenamedSetting
from ..core.stages import RESERVED

COMMANDS = {
    "train": "Train an in-context regression model from a recipe",
    "inspect": "Format, shape and a quick error of a checkpoint",
    "capture": "Save predictions and activations for prompts in an .npz",
    "report": "Every analysis as one HTML report with summary.json",
    "planted": "Write a transformer whose layers run GD, Newton, SGD or a random generator by construction",
    "study": "Analyses over a family of checkpoints, one tidy table and figures",
    "resolution": "How far apart two reference learners can put a similarity: the ceiling of each comparison",
    "export": "Write a checkpoint in Garg et al.'s run-directory layout",
}
RESERVED.update(name.replace("-", "_") for name in COMMANDS)  # a registered stage cannot take a command's name


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one `icl-probe <command>: error: ...` line and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def chosen_command(argv: list[str] | None) -> str | None:
    """The command an argument list names (its first word after the global options), or None where
    it names none (`icl-probe --help`, a typo: then every command is built, for the listing or the
    close-match error)."""
    words = iter(sys.argv[1:] if argv is None else argv)
    for word in words:
        if word == "--max-work":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def build_parser(argv: list[str] | None = None, *, every: bool = True) -> argparse.ArgumentParser:
    """The whole command line's parser; with `every=False`, only the command `argv` names gets its
    flags (the others are listed, with their help, but empty): what one run of `icl-probe` parses,
    a fraction of the cost of building a few hundred flags for every command."""
    only = None if every else chosen_command(argv)
    parser = OneLineParser(
        prog="icl-probe",
        description="Mechanistic interpretability for transformers that learn in context.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  icl-probe train --recipe recipes/tiny.toml --out runs/tiny\n"
        "  icl-probe evaluate checkpoints/gpt2-default --out reports/eval",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or info logs")
    parser.add_argument(
        "--max-work",
        type=float,
        default=None,
        metavar="FLOP",
        help="refuse commands estimated to need more floating-point operations than this "
        "(default 3e15, hours here; probe/core/budget.py)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f".{name.replace('-', '_')}", __name__)
        command = sub.add_parser(
            name, help=help_text, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        # -q also after the command; SUPPRESS keeps a -q given before it
        command.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if only in (None, name):
            module.add_parser(command)
    from .stage import add_registered_parsers

    add_registered_parsers(sub, only)  # the registered analyses' commands (probe/core/stages.py)
    parser.set_defaults(commands=sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    with warnings.catch_warnings():
        show, shown = warnings.showwarning, set()

        def one_line(message, category, *where, **kwargs) -> None:
            """Warnings meant for the user (renamed settings) as one `icl-probe: warning:` line,
            each once per command however often the recipe is resolved."""
            if not issubclass(category, RenamedSetting):
                show(message, category, *where, **kwargs)
            elif str(message) not in shown:
                shown.add(str(message))
                print(f"icl-probe: warning: {message}", file=sys.stderr)

        warnings.showwarning = one_line
        warnings.simplefilter("always", RenamedSetting)
        return _main(argv)


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is when a record is emitted, not the stream of the first call
    (a later call in the same process, e.g. under pytest's capture, may have replaced and closed it)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _log_to_stderr(level: int) -> None:
    root = logging.getLogger()
    if not any(isinstance(handler, _CurrentStderr) for handler in root.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv, every=False)
    args, extra = parser.parse_known_args(argv)
    if extra:  # the command's own parser words the error (its name, its --help)
        args.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    _log_to_stderr(logging.WARNING if args.quiet else logging.INFO)
    registered = getattr(args, "registered_stage", None)
    module = importlib.import_module(".stage" if registered else f".{args.command.replace('-', '_')}", __name__)
    try:
        from ..core.budget import max_work, work_limit

        with work_limit(max_work() if args.max_work is None else args.max_work):  # this command only
            return module.run(args) or 0
    except ProbeError as err:
        message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"icl-probe {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
