"""The one table of random streams.

Every random draw of an analysis comes from `stream_generator(seed, Stream.X)` (below): the run's
seed and a named stream, mixed into one generator's seed (`generator_for`), so that two analyses
never share draws by accident, no stream is another run's (no seed + k offsets), and a number can
be traced to its stream. Where an API takes an integer seed (torch's global generator for a model's
initialisation, a learner's masks_seed) it gets `stream_seed(seed, Stream.X)`. Training draws its
prompts from `generator_for(train.seed, step, rank)` (resumable per step) and initialises its model
from train.seed inside `torch.random.fork_rng`; learners take their own `seed` hyper-parameter for
their minibatches and initial values. Library code never leaves torch's global generator changed.
A stage registered from outside the toolkit (probe/core/stages.py) draws from `named_stream(its name,
part)`, through `AnalysisStage.generator(seed, part)`, and needs no entry here. One exception:
`icl-probe resolution` (probe/analysis/resolution.py) draws its prompts from
`generator_for(seed)` and its fresh queries from `generator_for(seed, 1)`, without a named stream.
"""

from __future__ import annotations

from enum import IntEnum

import torch


class Stream(IntEnum):
    """Prompt and query streams: `stream_generator(seed, Stream.X)`."""

    READOUT_TRAIN = 101  # [prompts] train: read-out fitting prompts
    READOUT_VAL = 102  # [prompts] val: read-out penalty choice
    READOUT_MINIBATCHES = 105  # [readout] method "adam": the fine-tuning minibatches
    TEST = 103  # [prompts] test: held-out prompts of the similarities, SimW and the span test
    QUERIES = 104  # fresh queries per prefix (SimW, span test; Fu et al. 2024, eq. 11)
    PROBE_TRAIN = 201  # [probes] training prompts
    PROBE_TEST = 202  # [probes] test prompts
    PROBE_FEATURES = 203  # the MLP probes' random GELU layer
    SHUFFLE = 204  # the probes' shuffled-targets control permutation
    PROBE_SPLIT = 205  # the MLP probes' validation share of the training prompts (analysis/mlp_head.py)
    PROBE_RESTARTS = 206  # the MLP probes' other starting hidden layers
    FORGETTING = 301  # [forgetting] prompts
    ORDER = 302  # [order] prompts
    ORDER_PERMUTATIONS = 303  # [order] the orderings of each prompt's examples
    STUDY_PROMPTS = 401  # a study's spd_ilw prompts
    STUDY_QUERIES = 402  # a study's spd_ilw queries
    STEER_TRAIN = 601  # `icl-probe steer` / [steering]: prompts the steered probes are fitted on
    STEER_TEST = 602  # the prompts that are steered
    STEER_DIRECTIONS = 603  # the random directions and noise steering is compared with
    BOOTSTRAP = 701  # every bootstrap resample (analysis/stats.py resamples)
    HELD_OUT = 801  # [interventions] the held-out prompts whose activations mean-ablation writes
    RANDOM_WEIGHTS = 901  # the random-weights control model's initialisation (probes and the null baselines)
    OTHER_MASKS = 902  # a planted SGD / Adam model's report: the learner with masks the model does not hold
    ADAM_ESTIMATE = 501  # `icl-probe export`: batches that estimate Adam's moments of a run without them
    EVALUATION = 7_777_777  # `icl-probe evaluate` and the report's error curve (apart from training's stream)
    CORRUPTED = 9_191_919  # the corrupted functions of the patching checks (same x, fresh w)
    STATE_SOURCE = 9_191_920  # the fresh x's whose Newton state the state check writes (interventions/state.py)


def mixed_seed(seed: int, *stream: int) -> int:
    """One integer seed for (seed, stream...), in 0 .. 2^63 - 2."""
    mixed = seed
    for s in stream:
        mixed = (mixed * 1_000_003 + s + 1) % (2**63 - 1)
    return mixed


def generator_for(seed: int, *stream: int) -> torch.Generator:
    """A CPU generator for (seed, stream...), e.g. (seed, step, rank): resumable data streams."""
    return torch.Generator().manual_seed(mixed_seed(seed, *stream))


def stream_seed(seed: int, stream: Stream) -> int:
    """The integer seed of `stream` for run seed `seed`, for APIs that take a seed, not a generator."""
    return mixed_seed(seed, int(stream))


def stream_generator(seed: int, stream: Stream) -> torch.Generator:
    """The generator of `stream` for run seed `seed`."""
    return generator_for(seed, int(stream))


NAMED_BASE = 2**32  # named streams lie in [2^32, 2^62): above every Stream value


def named_stream(name: str, *parts: str) -> int:
    """The stream number of an analysis stage's own draws, from its name and what they are for
    (`named_stream("ols_gap", "prompts")`): a stage outside the toolkit draws from streams of its own
    with no entry in `Stream` (the toolkit's stages keep theirs: renumbering would move every committed
    number). The words' SHA-256, in [2^32, 2^62)."""
    import hashlib

    digest = hashlib.sha256("/".join((name, *parts)).encode()).digest()
    return NAMED_BASE + int.from_bytes(digest[:8], "big") % (2**62 - NAMED_BASE)
