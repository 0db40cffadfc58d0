"""Hook points on a model's own forward, named and called as TransformerLens names and calls them.

A `HookPoint` is an identity module at one activation site; functions attached to it see the
value and may return a replacement (TransformerLens's `fn(value, hook)` convention: None keeps
the value). A `Hooked` model names its hook points once (`blocks.{i}.hook_resid_post`, ...), and
`run_with_hooks` / `hooks(...)` attach functions for one call, so capture, interventions and
analyses run the model's one forward and read or edit it by TransformerLens's names. With no
function attached a hook point costs one attribute test: the model's fast paths stay.

TransformerLens is not imported here (it takes tens of seconds); `probe.to_bridge` builds a real
TransformerBridge where a user wants TransformerLens's own tools, and tests hold the two equal.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from torch import Tensor, nn

from ..core.errors import ConfigError

HookFn = Callable[..., Tensor | None]


class HookPoint(nn.Module):
    """An identity at one activation site that calls the functions attached to it in order."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # set by the model that owns it (`Hooked.name_hook_points`)
        self.fns: list[HookFn] = []

    @property
    def active(self) -> bool:
        return bool(self.fns)

    def forward(self, value: Tensor) -> Tensor:
        for fn in self.fns:
            out = fn(value, hook=self)
            if out is not None:
                value = out
        return value

    def __call__(self, value: Tensor) -> Tensor:  # a plain call: no nn.Module hook machinery per site
        return self.forward(value) if self.fns else value


class Hooked:
    """A model whose forward fires named `HookPoint`s (mixed into an nn.Module)."""

    hook_dict: dict[str, HookPoint]

    def name_hook_points(self, rename: Sequence[tuple[str, str]] = ()) -> None:
        """Name every HookPoint submodule by its module path with each (old, new) substring of
        `rename` replaced in turn (our attribute paths -> TransformerLens's names)."""
        self.hook_dict = {}
        for path, module in self.named_modules():  # type: ignore[attr-defined]
            if isinstance(module, HookPoint):
                for old, new in rename:
                    path = path.replace(old, new)
                module.name = path
                self.hook_dict[path] = module

    def hook_point(self, name: str) -> HookPoint:
        """The hook point called `name`; an unknown name gets the closest valid ones."""
        point = self.hook_dict.get(name)
        if point is None:
            close = difflib.get_close_matches(name, list(self.hook_dict), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"valid names: {self.hook_examples()}"
            raise ConfigError(f"unknown hook '{name}' for this {type(self).__name__}; {hint}")
        return point

    def hook_examples(self) -> str:
        """The valid names, one per site with the block index written {i}."""
        blocks = sorted({int(m.group(1)) for n in self.hook_dict if (m := re.match(r"blocks\.(\d+)\.", n))})
        sites = dict.fromkeys(re.sub(r"^blocks\.\d+\.", "blocks.{i}.", n) for n in self.hook_dict)
        where = f" (i in 0..{blocks[-1]})" if blocks else ""
        return ", ".join(sites) + where

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[None]:
        """Attach (name, fn) pairs for the duration of the block; they are removed afterwards,
        also when the forward raises."""
        attached = [(self.hook_point(name), fn) for name, fn in fwd_hooks]
        for point, fn in attached:
            point.fns.append(fn)
        try:
            yield
        finally:
            for point, fn in attached:
                point.fns.remove(fn)
