"""Validation at the edges: counts, finite numbers, hyper-parameter grids, prompts, devices and
memory estimates, each failing with a `ConfigError` that names the value and the fix.

Every public entry (CLI flags, `--set`, recipes, checkpoint configs, prompts files,
`run_learner`, `capture`, `load_checkpoint`) goes through these checks before heavy work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

import re
import weakref

from .errors import ConfigError
from .memory import available_memory

NEWTON_ALPHAS = ("spectral", "frobenius", "paper")  # Newton's named alpha rules (learners.iterative.newton_alpha)
MEMORY_FRACTION = 0.8  # refuse work whose estimate exceeds this share of available memory


def whole_number(value: Any, name: str) -> int:
    """An integer; a float with an integral value (1000.0, as TOML and JSON may write it) is taken as
    one, 2.5 and booleans are not: the one rule for every integer setting, however it is given."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()))
    ):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    return int(value)


def positive_int(value: Any, name: str, minimum: int = 1) -> int:
    """An integer >= minimum (`whole_number`'s rule: floats with an integral value are accepted, 2.5 is not)."""
    try:
        number = whole_number(value, name)
    except ConfigError:
        number = minimum - 1  # one message for both faults
    if number < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


SEED_LIMIT = 2**63  # seeds are mixed modulo 2^63 - 1 (probe/data/tasks.py generator_for) and fed to torch's generators


MIN_BOOTSTRAP = 20  # resamples: the 5th and 95th percentiles of fewer are the extremes


def check_bootstrap(value: Any, name: str = "bootstrap") -> int:
    """A number of bootstrap resamples: an integer >= MIN_BOOTSTRAP (the same bound everywhere)."""
    n = positive_int(value, name)
    if n < MIN_BOOTSTRAP:
        raise ConfigError(
            f"{name} must be at least {MIN_BOOTSTRAP}, got {n}: a 90% interval from fewer resamples is made of the "
            "extreme resamples alone (e.g. 500)"
        )
    return n


def check_seed(value: Any, name: str = "seed") -> int:
    """A seed: an integer in 0 .. 2^63 - 1."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise ConfigError(f"{name} must be an integer in 0..2^63-1, got {value!r}")
    return value


def finite_float(value: Any, name: str, *, low: float | None = None, strict: bool = True) -> float:
    """A finite number, optionally > low (strict) or >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if low is not None and (value <= low if strict else value < low):
        raise ConfigError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")
    return value


@dataclass(frozen=True)
class Rule:
    """What one value may be: the one constraint vocabulary of the settings fields
    (probe/core/config.py `setting`) and of the learners' hyper-parameters (GRID_RULES, and a
    learner's own rules where its words differ: probe/learners/registry.py).

    kind: "count" (an integer >= `minimum`; 2.0 is 2, 2.5 fails), "integer" (any integer), "seed"
        (an integer in 0..2^63-1), "number" (finite, > `low`, or >= `low` where not `strict`;
        <= `high`, or < `high` where `high_strict`; None: unbounded), "choice" (one of `names`),
        "any" (anything; a number must be finite).
    names: the words a count, number or seed also accepts ("auto"), or a choice's values.
    optional: None is accepted as it is.
    iterations: a count of sequential steps (the budget counts its largest value's work).
    """

    kind: str = "any"
    minimum: int = 0
    low: float | None = 0.0
    strict: bool = True
    high: float | None = None
    high_strict: bool = False
    names: tuple[Any, ...] = ()
    optional: bool = False
    iterations: bool = False

    def check(self, value: Any, name: str) -> Any:
        """`value` if it keeps the rule (normalised: 2.0 -> 2 for a count, 1 -> 1.0 for a number),
        else a ConfigError naming `name`."""
        if value is None and self.optional:
            return None
        if self.kind == "choice":
            if value not in self.names:
                raise ConfigError(f"{name}={value!r} must be one of {list(self.names)}")
            return value
        if isinstance(value, str) and (self.kind == "any" or value in self.names):
            return value
        if isinstance(value, str) and self.names:
            raise ConfigError(f"{name}={value!r} is not a number or one of {list(self.names)}")
        if self.kind == "count":
            return positive_int(value, name, self.minimum)
        if self.kind == "integer":
            return whole_number(value, name)
        if self.kind == "seed":
            return check_seed(whole_number(value, name), name)
        if self.kind == "number":
            number = finite_float(value, name, low=self.low, strict=self.strict)
            if self.high is not None and (number >= self.high if self.high_strict else number > self.high):
                raise ConfigError(f"{name} must be {'<' if self.high_strict else '<='} {self.high:g}, got {value!r}")
            return number
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}={value!r} must be finite")
        return value


COUNT1, POSITIVE, ITERATIONS = Rule("count", minimum=1), Rule("number"), Rule("count", minimum=0, iterations=True)
# hyper-parameter -> its Rule, wherever a learner's grid names it; a learner whose words differ
# declares its own (probe/learners/registry.py `register(rules=...)`)
GRID_RULES: dict[str, Rule] = {
    "steps": ITERATIONS,
    "iterations": ITERATIONS,
    "epochs": ITERATIONS,
    "memory": COUNT1,
    "k": COUNT1,
    "batch_size": COUNT1,
    "width": COUNT1,
    "depth": COUNT1,
    "n_train": COUNT1,
    "seed": Rule("seed"),
    "masks_seed": Rule("seed", optional=True),
    "lam": POSITIVE,
    "eta": Rule("number", names=("auto", "normalized")),
    "alpha": Rule("number", names=NEWTON_ALPHAS),
    "lr": POSITIVE,
    "eps": POSITIVE,
    "input_var": POSITIVE,
    "beta1": Rule("number", strict=False, high=1.0, high_strict=True),
    "beta2": Rule("number", strict=False, high=1.0, high_strict=True),
    "noise": Rule("number", strict=False),
    "line_search": Rule("choice", names=("exact", "wolfe")),
    "convention": Rule("choice", names=("paper", "code")),
    "weighting": Rule("choice", names=("uniform", "distance")),
    "optimizer": Rule("choice", names=("adam", "sgd")),
    "eps_placement": Rule("choice", names=("paper", "torch")),
}
ITERATION_KEYS = tuple(key for key, rule in GRID_RULES.items() if rule.iterations)  # what the budget counts


def _grid_values(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple, range)):
        return list(value)
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        listed = value.tolist()
        return listed if isinstance(listed, list) else [listed]
    return [value]


def check_grid(
    learner: str, grid: dict[str, Any], where: str = "", rules: Mapping[str, Rule] | None = None
) -> dict[str, Any]:
    """Check every hyper-parameter value of a learner grid against its Rule (`rules`, the learner's
    own, else GRID_RULES); returns the grid normalised (2.0 steps -> 2). Empty grids, 2.5 steps,
    negative penalties and k <= 0 fail, naming `where` (default: the learner)."""
    where = where or f"learner '{learner}'"
    rules = GRID_RULES if rules is None else rules
    out: dict[str, Any] = {}
    for key, value in grid.items():
        values = _grid_values(value)
        if not values:
            raise ConfigError(f"{where}: grid '{key}' is empty; give at least one value")
        rule = rules.get(key, Rule())
        checked = [rule.check(v, f"{where}: {key}") for v in values]
        if isinstance(value, (list, tuple, range)) or hasattr(value, "tolist"):
            out[key] = type(value)(checked) if isinstance(value, (list, tuple)) else checked
        else:
            out[key] = checked[0]
    return out


def as_prompt_tensors(xs: Any, ys: Any, queries: Any = None, what: str = "prompts"):
    """Torch float tensors from tensors or numpy arrays; checks shape, size and finiteness."""
    import numpy as np
    import torch

    def convert(a, name):
        if a is None:
            return None
        if isinstance(a, np.ndarray):
            if a.dtype.kind != "f":
                raise ConfigError(f"{what}: {name} must hold floats, got dtype {a.dtype}")
            a = torch.as_tensor(a, dtype=torch.float64 if a.dtype == np.float64 else torch.float32)
        if not isinstance(a, torch.Tensor):
            raise ConfigError(f"{what}: {name} must be a torch tensor or numpy array, got {type(a).__name__}")
        if not a.is_floating_point():
            raise ConfigError(f"{what}: {name} must hold floats, got {a.dtype}")
        if a.device.type == "meta":  # shapes without values: nothing can be computed from them
            raise ConfigError(
                f"{what}: {name} is on the meta device, which holds shapes but no values; create it on the cpu "
                "or a GPU (e.g. torch.zeros(..., device='cpu'))"
            )
        return a

    xs, ys, queries = convert(xs, "xs"), convert(ys, "ys"), convert(queries, "queries")
    if xs.ndim != 3:
        raise ConfigError(f"{what}: xs must have shape (batch, points, d), got {tuple(xs.shape)}")
    if min(xs.shape) < 1:
        raise ConfigError(f"{what}: xs has an empty axis {tuple(xs.shape)}; need batch, points and d >= 1")
    if ys.shape != xs.shape[:2]:
        raise ConfigError(f"{what}: ys must have shape {tuple(xs.shape[:2])} to match xs, got {tuple(ys.shape)}")
    for name, t in (("xs", xs), ("ys", ys), ("queries", queries)):
        if t is not None and not bool(torch.isfinite(t).all()):
            raise ConfigError(f"{what}: {name} contains NaN or infinite values; drop or fix those prompts")
    return xs, ys, queries


def check_device(device: Any) -> str:
    """A torch device string that exists here."""
    import torch

    if not isinstance(device, str):
        raise ConfigError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"device {device!r} is not a torch device ({err}); use cpu or cuda") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device}: torch sees no GPU here; use --device cpu")
    return device


def parse_bytes(text: str) -> int:
    """'4G', '512M', '2.5GB' or a plain number of bytes -> bytes."""

    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ConfigError(f"--max-memory must look like 4G, 512M or a number of bytes, got {text!r}")
    value = float(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_")
    if value < 64 << 20:
        raise ConfigError(f"--max-memory {text} is below 64 MB; give at least 64M")
    return int(value)


def check_memory(nbytes: float, what: str, fix: str) -> None:
    """Refuse work whose memory estimate exceeds the available memory, naming the culprit."""
    limit = MEMORY_FRACTION * available_memory()  # probe/core/memory.py
    if nbytes > limit:
        raise ConfigError(
            f"{what} would need about {_human(nbytes)} of memory, more than the {_human(limit)} available; {fix}"
        )


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"


MODEL_PROTOCOL = ("n_dims", "n_layers", "d_model", "n_points", "run")  # README, "Bring your own model"


def check_model(model) -> None:
    """A clear error for something passed where a model is expected (a loaded checkpoint, a path,
    an object without the model protocol, weights on the meta device)."""
    from pathlib import Path

    if type(model).__name__ == "LoadedCheckpoint":
        raise ConfigError("got a LoadedCheckpoint where a model is expected: pass its .model (ckpt.model)")
    if isinstance(model, (str, Path)):
        raise ConfigError(
            f"got the path {str(model)!r} where a model is expected: pass probe.load_checkpoint(path).model"
        )
    missing = [name for name in MODEL_PROTOCOL if not hasattr(model, name)]
    if missing:
        raise ConfigError(
            f"a {type(model).__name__} is not a model icl-probe can run: it lacks {', '.join(missing)} (a model "
            f"provides {', '.join(MODEL_PROTOCOL)}; see the README, 'Bring your own model')"
        )
    parameters = getattr(model, "parameters", None)
    if callable(parameters) and any(p.is_meta for p in parameters()):
        raise ConfigError(
            "the model's weights are on the meta device (never loaded): load them, e.g. with to_empty + load_state_dict"
        )
    if model not in _CHECKED:
        check_protocol(model)
        _CHECKED.add(model)


_CHECKED: weakref.WeakSet = weakref.WeakSet()  # models whose protocol was checked (their shapes do not change)


def check_protocol(model) -> None:
    """Run the model protocol once on two prompts of 3 points and check what comes back: integer
    sizes, `run` returning pred (B, n), resid (n_layers + 1 tensors (B, 2n, d_model)) and final
    (B, 2n, d_model), `readout(final)` and, where present, `lens(resid)` (B, 2n). An error names the
    member, what was expected and what came (README, "Bring your own model")."""
    import torch

    name = type(model).__name__
    for size in MODEL_PROTOCOL[:4]:
        value = getattr(model, size)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}.{size} must be a positive integer, got {value!r}")
    b, n = 2, min(3, model.n_points)
    parameters = list(model.parameters()) if callable(getattr(model, "parameters", None)) else []
    device = parameters[0].device if parameters else torch.device("cpu")
    dtype = parameters[0].dtype if parameters and parameters[0].is_floating_point() else torch.float32
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(b, n, model.n_dims, generator=g).to(device, dtype)
    ys = torch.randn(b, n, generator=g).to(device, dtype)
    with torch.no_grad():
        out = model.run(xs, ys)  # an error inside the user's run is theirs to read, traceback and all
        expected = {"pred": (b, n), "final": (b, 2 * n, model.d_model)}
        for member, shape in expected.items():
            value = getattr(out, member, None)
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(
                    f"{name}.run(...).{member} must be a tensor of shape {shape} (B, n = {n} prompts' points), got {got}"
                )
        resid = getattr(out, "resid", None)
        if not isinstance(resid, (list, tuple)) or len(resid) != model.n_layers + 1:
            got = f"{len(resid)} tensors" if isinstance(resid, (list, tuple)) else type(resid).__name__
            raise ConfigError(
                f"{name}.run(...).resid must hold n_layers + 1 = {model.n_layers + 1} tensors (the embedding output, then "
                f"each layer's output), got {got}"
            )
        for layer, value in enumerate(resid):
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (b, 2 * n, model.d_model):
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(
                    f"{name}.run(...).resid[{layer}] must have shape {(b, 2 * n, model.d_model)} (B, 2n, d_model), got {got}"
                )
        for member, arg in (("readout", out.final), ("lens", resid[0])):
            if member == "lens" and not hasattr(model, "lens"):
                continue
            value = getattr(model, member)(arg)
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (b, 2 * n):
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ConfigError(f"{name}.{member}(h) must map (B, 2n, d_model) to (B, 2n) = {(b, 2 * n)}, got {got}")


def check_prompts_for(model, xs, ys) -> tuple[Tensor, Tensor]:
    """Clear errors for a model that is not one (check_model) and for prompts the model cannot take;
    numpy arrays become float32 tensors."""
    check_model(model)
    xs, ys, _ = as_prompt_tensors(xs, ys, what="capture")
    xs, ys = xs.float(), ys.float()
    if xs.shape[2] != model.n_dims:
        raise ConfigError(f"prompts have d={xs.shape[2]} but the model takes d={model.n_dims}")
    if xs.shape[1] > model.n_points:
        raise ConfigError(f"prompts have {xs.shape[1]} points but the model has positions for {model.n_points}")
    return xs, ys
