"""icl-probe: which learning algorithm do the layers of an in-context learner run?"""

from .core.omp import passive_waits

passive_waits()  # before torch loads OpenMP: see probe/core/omp.py

from .core.allocator import tune_allocator
from .core.provenance import VERSION as __version__  # noqa: F401  (the package version)

tune_allocator()  # before any large tensor: see probe/core/allocator.py


def to_bridge(source, device: str = "cpu"):
    """A TransformerLens TransformerBridge of a GPT-2 family checkpoint that takes `(xs, ys)` prompts
    (see probe/capture/handle.py). Imported lazily: TransformerLens takes seconds to load."""
    from .capture.handle import to_bridge as build

    return build(source, device)


def prompt(xs, ys):
    """An in-context prompt (xs, ys) as a TransformerLens input, for TransformerLens's own
    utilities (`transformer_lens.patching`, ...) on a bridge from `to_bridge`."""
    from .capture.handle import prompt as wrap

    return wrap(xs, ys)


def default_checkpoint():
    """The path of the shipped default checkpoint (the repository's in a checkout, the wheel's
    copy when installed): what `icl-probe report` analyses when given no checkpoint."""
    from .core.resources import default_checkpoint as path

    return path()


def load_checkpoint(path, format: str | None = None):
    """Load a model from a run directory in any known format (probe.io.formats.FORMATS): a
    LoadedCheckpoint with `.model`, `.config`, `.format`, `.path`."""
    from .io.formats import load_checkpoint as load

    return load(path, format)


API = (
    "report",
    "recipe",
    "analyse",
    "spectral",
    "activations",
    "prompts",
    "probe_data",
    "run_learner",
    "run_study",
    "ReportResult",
)  # probe/api.py


def __getattr__(name: str):
    """The main jobs (probe/api.py), imported on first use so that `import probe` stays light."""
    if name in API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
