"""Validity domains: the observable conditions an instrument's known answers cover, and the one
vocabulary for a block that gives no answer (`STATUSES`, with a reason and the knob that would
change it). The model's own conditions and the precondition that it learns in context are read
from a report's summary (probe/reporting/validity.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATUSES = ("answered", "no answer", "not measured", "unvalidated here")


@dataclass(frozen=True)
class Domain:
    """Conditions covered by an instrument's known answers. Numeric conditions are closed ranges
    (low, high); `readout` the read-out paths the induced weights came through ("model": the model's
    own output head; "ridge": the per-layer ridge read-out the report fits on trained models);
    `tested_against` the alternatives the known answers were told apart from."""

    d: tuple[float, float] = (4, 4)
    kappa: tuple[float, float] = (1, 1)
    noise_std: tuple[float, float] = (0, 0)
    readout: tuple[str, ...] = ("model",)
    tested_against: str = ""
    tests: str = ""

    def outside(self, conditions: dict[str, Any]) -> list[str]:
        """The model's conditions this domain does not cover, in words ("kappa = 100"); a condition
        the model does not state is not held against it."""
        out = []
        for name in ("d", "kappa", "noise_std"):
            value = conditions.get(name)
            low, high = getattr(self, name)
            if value is not None and not low - 1e-9 <= value <= high + 1e-9:
                out.append(f"{name} = {value:g}")
        readout = conditions.get("readout")
        if self.readout and readout is not None and readout not in self.readout:
            out.append(f"read-out {readout}")
        return out

    def words(self) -> str:
        span = lambda lo, hi: f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        readout = f", read-out {' or '.join(self.readout)}" if self.readout else ""
        return f"d {span(*self.d)}, kappa {span(*self.kappa)}, label noise {span(*self.noise_std)}{readout}"
