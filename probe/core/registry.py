"""Name -> object registries with close-match suggestions (learners, tasks, formats, ...)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def unknown_name_message(kind: str, name: str, known: list[str], renamed: dict[str, str] | None = None) -> str:
    """'Unknown learner 'newtn'. Did you mean: newton? Known: ...'; a name close to an old name
    of `renamed` (old -> new) suggests the new one ('Did you mean: curve (formerly evaluate)?')."""
    renamed = renamed or {}
    close = difflib.get_close_matches(name, [*known, *renamed], n=1, cutoff=0.5)
    hint = ""
    if close:
        hint = (
            f" Did you mean: {renamed[close[0]]} (formerly {close[0]})?"
            if close[0] in renamed
            else f" Did you mean: {close[0]}?"
        )
    return f"Unknown {kind} '{name}'.{hint} Known: {', '.join(sorted(known))}."


class Registry(Generic[T]):
    """A named collection; registering a name twice is an error, a typo gets a suggestion."""

    def __init__(self, kind: str, plugins: str = ""):
        self.kind = kind
        self._items: dict[str, T] = {}
        self.plugins = plugins  # an entry-point group whose modules register more entries when imported
        self._loaded = not plugins

    def _load_plugins(self) -> None:
        """Import the modules of the `plugins` entry-point group once (each registers itself at import),
        the first time a name is not found or the names are listed."""
        if self._loaded:
            return
        self._loaded = True
        from importlib.metadata import entry_points

        for point in entry_points(group=self.plugins):
            try:
                point.load()
            except Exception as err:  # noqa: BLE001  (a broken plugin is named, never a traceback from inside it)
                raise ConfigError(
                    f"the {self.kind} plugin '{point.name}' ({point.value}, entry-point group {self.plugins}) "
                    f"failed to load: {type(err).__name__}: {err}"
                ) from None

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._items:
            self._load_plugins()
        if name not in self._items:
            raise ConfigError(unknown_name_message(self.kind, name, list(self._items)))
        return self._items[name]

    def unregister(self, name: str) -> None:
        """Take `name` out again (tests, notebooks that registered their own)."""
        self._items.pop(name, None)

    def names(self) -> list[str]:
        self._load_plugins()
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        if name not in self._items:
            self._load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
