"""Validity domains: the observable conditions an instrument's known answers cover, and the one
vocabulary for a block that gives no answer (`STATUSES`, with a reason and the knob that would
change it). The model's own conditions and the precondition that it learns in context are read
from a report's summary (probe/reporting/validity.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

STATUSES = ("answered", "no answer", "not measured", "unvalidated here")
RANGES = ("d", "kappa", "noise_std", "prompts")
KNOBS = {"prompts": "prompts.induced"}  # the recipe key that moves a condition the user controls


@dataclass(frozen=True)
class Domain:
    """One box of conditions covered by an instrument's known answers. Numeric conditions are closed
    ranges (low, high): d, kappa (1: isotropic inputs), label noise, and `prompts`, the prompts the
    measurement ran on (its lower end: what the known answers needed). `readout` lists the read-out
    paths the induced weights came through ("model": the model's own output head; "ridge": the
    per-layer ridge read-out the report fits on trained models; empty: the instrument reads no
    layer through a read-out). `tests` names the tests that hold the box."""

    d: tuple[float, float] = (4, 4)
    kappa: tuple[float, float] = (1, 1)
    noise_std: tuple[float, float] = (0, 0)
    prompts: tuple[float, float] = (0, math.inf)
    readout: tuple[str, ...] = ("model",)
    tests: str = ""

    def outside(self, conditions: dict[str, Any]) -> list[str]:
        """The model's conditions this box does not cover, in words ("kappa = 100"); a condition
        the model does not state is not held against it."""
        out = []
        for name in RANGES:
            value = conditions.get(name)
            low, high = getattr(self, name)
            if value is not None and not low - 1e-9 <= value <= high + 1e-9:
                knob = f" (needs >= {low:g}: raise {KNOBS[name]})" if name in KNOBS and value < low else ""
                out.append(f"{name} = {value:g}{knob}")
        readout = conditions.get("readout")
        if self.readout and readout is not None and readout not in self.readout:
            out.append(f"read-out {readout}")
        return out

    def words(self) -> str:
        span = lambda lo, hi: f"{lo:g}" if lo == hi else (f">= {lo:g}" if hi == math.inf else f"{lo:g}-{hi:g}")
        readout = f", read-out {' or '.join(self.readout)}" if self.readout else ""
        prompts = f", prompts {span(*self.prompts)}" if self.prompts != (0, math.inf) else ""
        noise = span(*self.noise_std)
        return f"d {span(*self.d)}, kappa {span(*self.kappa)}, label noise {noise}{prompts}{readout}"


@dataclass(frozen=True)
class Validity:
    """Where an instrument's row is validated: a union of `Domain` boxes, and the alternatives its
    known answers were told apart from."""

    boxes: Sequence[Domain]
    tested_against: str = ""

    def outside(self, conditions: dict[str, Any]) -> list[str]:
        """Nothing when some box covers the model; else each box's uncovered conditions, the
        nearest box first ("kappa = 100 / d = 8": outside the first box by its kappa, the second by d)."""
        misses = [box.outside(conditions) for box in self.boxes]
        if not misses or any(not m for m in misses):
            return []
        ranked = sorted(dict.fromkeys(", ".join(m) for m in misses), key=lambda words: words.count(",") + 1)
        return [" / ".join(ranked)]

    def to_json(self) -> dict[str, Any]:
        return {
            "boxes": [{**asdict(box), "words": box.words()} for box in self.boxes],
            "tested_against": self.tested_against,
        }
