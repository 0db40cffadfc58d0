"""Every concrete `icl-probe ...` command line written in the README's and the docs' code blocks and in
the recipes' and analysis recipes' comments still parses with the command line as it is, and what it names exists: its
checkpoint directories, recipe and study recipe names, and --recipe files. (Running them all would
take hours: training, studies; the README's own commands run in CI and in tests/test_readme*.)
Lines with placeholders (CKPT, DIR, [options], ...) are usage patterns, not commands, and are left out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO

SOURCES = ["README.md", "docs/*.md", "docs/guide/*.md", "analyses/*.toml", "recipes/*.toml"]
COMMAND = re.compile(r"icl-probe ((?:[a-z][a-z-]*)(?: [^`|\"<>()#\n]*)?)")
PLACEHOLDER = re.compile(r"\[|\]|\.\.\.|\b[A-Z][A-Z0-9_]*\b|\\$|path/to|=$")


def written_commands(path: Path) -> str:
    """The text where a file writes whole commands: a Markdown file's fenced code blocks, a TOML
    file's comment lines (inline `icl-probe --flag` in prose is a hint, not a command)."""
    text = path.read_text()
    if path.suffix == ".md":
        return "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL))
    return "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))


def doc_commands() -> list[tuple[str, str]]:
    from probe.cli import build_parser

    known = set(build_parser().parse_args(["inspect"]).commands)
    found = {}
    for pattern in SOURCES:
        for path in sorted(REPO.glob(pattern)):
            for match in COMMAND.finditer(written_commands(path)):
                line = " ".join(match.group(1).split())
                words = line.split()
                if len(words) < 2 or words[0] not in known or PLACEHOLDER.search(line) or " or " in line:
                    continue  # prose, a bare command name, or a usage pattern
                found.setdefault(line, str(path.relative_to(REPO)))
    return sorted((where, line) for line, where in found.items())


COMMANDS = doc_commands()


def test_the_docs_hold_enough_commands_to_check():
    assert len(COMMANDS) >= 25
    assert any(line.startswith("study seeds-d8 ") for _, line in COMMANDS)


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[line[:60] for _, line in COMMANDS])
def test_a_command_in_the_docs_parses_and_names_what_exists(where, line):
    from probe.cli import build_parser
    from probe.reporting.recipe import resolve_recipe
    from probe.study.recipe import resolve_study

    argv = shlex.split(line)
    args, extra = build_parser().parse_known_args(argv)
    assert not extra, f"{where}: `icl-probe {line}`: unknown arguments {extra}"
    for name in ("checkpoint", "checkpoints", "ckpt", "compare"):
        value = getattr(args, name, None)
        for path in [value] if isinstance(value, str) else (value or []):
            if path.endswith(".toml") or not path.startswith(("checkpoints/", "reports/")):
                continue
            assert (REPO / path).exists(), f"{where}: `icl-probe {line}` names {path}, which is not in the repository"
    recipe = getattr(args, "recipe", None)
    if isinstance(recipe, str) and argv[0] != "train":
        if recipe.endswith(".toml"):
            assert (REPO / recipe).is_file(), f"{where}: `icl-probe {line}`: no recipe file {recipe}"
        else:
            resolve_recipe(recipe)
    if argv[0] == "train" and isinstance(recipe, str):
        assert (REPO / recipe).is_file(), f"{where}: `icl-probe {line}`: no training recipe {recipe}"
    if argv[0] == "study" and not args.study[0].startswith("checkpoints/"):
        resolve_study(args.study[0])
