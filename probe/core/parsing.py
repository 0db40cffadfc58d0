"""Bounded reading of the text files a user hands icl-probe: recipes (TOML), run configs (JSON)
and Garg et al.'s config.yaml. A config is a few kilobytes of shallow tables, so anything far
larger or deeper is refused with one message instead of exhausting memory or the stack, and YAML
anchors and aliases (which can expand a small file into an enormous document) are refused."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .errors import ProbeError

MAX_BYTES = 4 << 20  # 4 MiB: a recipe or config is a few KB
MAX_DEPTH = 32  # tables nested this deep are no config icl-probe reads


def read_config_text(path: Path, error: type[ProbeError], what: str) -> str:
    """The file's text, refused if larger than MAX_BYTES or not UTF-8."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise error(f"{path}: {what} is {size / 2**20:.1f} MiB; a {what} is a few KB (limit {MAX_BYTES >> 20} MiB)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: {what} is not UTF-8 text; save it as UTF-8") from None


def check_depth(value: Any, path: Path, error: type[ProbeError], what: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise error(f"{path}: {what} is nested more than {MAX_DEPTH} levels deep; a {what} is a few flat tables")
    if isinstance(value, dict):
        for item in value.values():
            check_depth(item, path, error, what, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_depth(item, path, error, what, depth + 1)
    return value


def load_toml(path: Path, error: type[ProbeError], what: str = "recipe") -> dict[str, Any]:
    return _parse(path, error, what, tomllib.loads, tomllib.TOMLDecodeError, "is not valid TOML: {err}")


def load_json(path: Path, error: type[ProbeError], what: str = "config") -> Any:
    hint = "is not valid JSON ({err}); restore it from the run"
    return _parse(path, error, what, json.loads, json.JSONDecodeError, hint)


def load_yaml(path: Path, error: type[ProbeError], what: str = "config") -> Any:

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):  # type: ignore[override]
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "anchors and aliases are not accepted in a config", event.start_mark
                )
            return super().compose_node(parent, index)

    decode = lambda text: yaml.load(text, Loader=NoAliasLoader)
    return _parse(path, error, what, decode, yaml.YAMLError, "is not valid YAML for icl-probe: {err}")


def _parse(
    path: Path,
    error: type[ProbeError],
    what: str,
    decode: Callable[[str], Any],
    invalid: type[Exception],
    explain: str,
) -> Any:
    """The file's text (read_config_text) decoded and depth-checked; the format's own error
    (`invalid`, folded onto one line of at most 300 characters as `explain`'s {err}) and a too-deep
    document each become one message naming the file."""
    text = read_config_text(path, error, what)
    try:
        return check_depth(decode(text), path, error, what)
    except invalid as err:
        raise error(f"{path}: {what} " + explain.format(err=" ".join(str(err).split())[:300])) from None
    except RecursionError:
        raise error(f"{path}: {what} is nested too deeply to read") from None
