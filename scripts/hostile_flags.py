"""Every numeric flag of every command, and every key of a report recipe, given values a user
should be refused for (numbers: 0, -1, 10^12, nan, inf, 1e300; names: "bogus", ""; lists: empty;
switches: 2), each in this process with a time limit. Lists each case whose exit was a traceback
rather than one error line (the project's rule: bad input gets one clear message and exit 2). A case
that runs past the limit is listed as "ran" (the value was accepted: look at whether it should have
been refused up front).

    .venv/bin/python scripts/hostile_flags.py                      # every command, then report --set keys
    .venv/bin/python scripts/hostile_flags.py spectral patch       # some commands
    .venv/bin/python scripts/hostile_flags.py --report-only --checkpoint checkpoints/lsa-L1-d4

Exits 1 when any case ended in a traceback. Minutes on a 2-core CPU (most cases are refused at once).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from probe.cli import build_parser, main

INTEGER_VALUES = ("0", "-1", "1000000000000")
FLOAT_VALUES = ("nan", "inf", "-1", "1e300")
SKIPPED = {"train", "study", "export", "planted", "capture", "inspect"}  # inputs other than a checkpoint's


class TimeUp(BaseException):
    """The case ran past its limit: its value was accepted."""


def _raise_time_up(*_) -> None:
    raise TimeUp


def run_case(argv: list[str], seconds: int) -> tuple[str, str]:
    """(outcome, last stderr line): "rc=N", "ran" (past the limit) or "TRACEBACK <type>: <text>"."""
    err = io.StringIO()
    signal.alarm(seconds)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            outcome = f"rc={main(argv)}"
    except TimeUp:
        outcome = "ran"
    except SystemExit as exit_:
        outcome = f"rc={exit_.code}"
    except Exception as error:  # noqa: BLE001 - any escaping exception is what this script reports
        outcome = f"TRACEBACK {type(error).__name__}: {' '.join(str(error).split())[:150]}"
    finally:
        signal.alarm(0)
    lines = err.getvalue().strip().splitlines()
    if any("TimeUp" in line for line in lines):  # the limit struck inside a finalizer, which Python reports
        outcome = "ran"  # and carries on from: the case ran past its limit
    elif any("Traceback" in line for line in lines):
        outcome = "TRACEBACK " + outcome
    return outcome, lines[-1][:160] if lines else ""


def flag_kind(action: argparse.Action) -> tuple[str, ...]:
    """The hostile values for a flag, by its type (integers, floats), or () for other flags."""
    name = getattr(action.type, "__name__", "")
    if action.type is int or name in ("positive_int", "seed", "count"):
        return INTEGER_VALUES
    if action.type is float or "float" in name or "number" in name:
        return FLOAT_VALUES
    return ()


def command_cases(commands: list[str], checkpoint: str, out: Path):
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in commands or sorted(sub.choices):
        if name in SKIPPED or name not in sub.choices:
            continue
        command = sub.choices[name]
        positional = [a for a in command._actions if not a.option_strings and a.dest != "help"]
        for action in command._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            for value in flag_kind(action):
                where = [checkpoint] if positional else []
                yield [name, *where, action.option_strings[-1], value, "--out", str(out / name)]


def recipe_values(default) -> tuple[str, ...]:
    """The hostile values of a recipe key, as --set writes them, by its default's type."""
    if isinstance(default, bool):
        return ("2",)
    if isinstance(default, float):
        return FLOAT_VALUES
    if isinstance(default, int) or default is None:
        return INTEGER_VALUES
    if isinstance(default, str):
        return ('"bogus"', '""')
    if isinstance(default, list) and default and all(isinstance(v, str) for v in default):
        return ('["bogus"]', "[]", '[""]')
    if isinstance(default, list) and default and all(isinstance(v, (int, float)) for v in default):
        values = FLOAT_VALUES if isinstance(default[0], float) else INTEGER_VALUES
        return ("[]", *(f"[{v}]" for v in values))
    return ()


def report_cases(checkpoint: str, out: Path):
    from probe.reporting.recipe import resolve_recipe

    for section, body in resolve_recipe("quick").to_dict().items():
        if not isinstance(body, dict):
            continue
        for key, default in body.items():
            for value in recipe_values(default):
                setting = f"{section}.{key}={value}"
                yield ["report", checkpoint, "--no-cache", "--set", setting, "--out", str(out / "report")]


def main_script() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commands", nargs="*", help="commands to try (default: every one)")
    parser.add_argument("--checkpoint", default="checkpoints/planted/gd")
    parser.add_argument("--seconds", type=int, default=20, help="limit per case")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _raise_time_up)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="icl-probe-hostile-") as tmp:
        out = Path(tmp)
        cases = [] if args.report_only else list(command_cases(args.commands, args.checkpoint, out))
        if args.report_only or not args.commands:
            cases += list(report_cases(args.checkpoint, out))
        for argv in cases:
            for path in out.iterdir():
                shutil.rmtree(path, ignore_errors=True)
            outcome, line = run_case(["-q", *argv], args.seconds)
            failures += outcome.startswith("TRACEBACK")
            mark = "!!" if outcome.startswith("TRACEBACK") else "  "
            shown = [a for a in argv if not a.startswith(tmp)]
            print(mark, " ".join(shown[:-1] if shown[-1] == "--out" else shown), outcome, line, flush=True)
    print(f"{failures} of {len(cases)} cases ended in a traceback")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_script())
