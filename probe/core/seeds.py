"""The one table of random streams.

Every random draw of an analysis comes from `generator_for(seed, stream)` (below) with
the run's seed and one of the streams below, or from the seed plus one of the offsets, so that
two analyses never share draws by accident and a number can be traced to its stream. Training
draws its prompts from `generator_for(train.seed, step, rank)` (resumable per step); learners and
probe trainers take their own `seed` argument for their minibatches and initial values.
"""

from __future__ import annotations

from enum import IntEnum

import torch


class Stream(IntEnum):
    """Prompt and query streams: `stream_generator(seed, Stream.X)`."""

    READOUT_TRAIN = 101  # [prompts] train: read-out fitting prompts
    READOUT_VAL = 102  # [prompts] val: read-out penalty choice
    TEST = 103  # [prompts] test: held-out prompts of the similarities, SimW and the span test
    QUERIES = 104  # fresh queries per prefix (SimW, span test; seed 003 eq. 11)
    PROBE_TRAIN = 201  # [probes] training prompts
    PROBE_TEST = 202  # [probes] test prompts
    FORGETTING = 301  # [forgetting] prompts
    ORDER = 302  # [order] prompts (the permutations come from a generator seeded with the run's seed)
    STUDY_PROMPTS = 401  # a study's spd_ilw prompts
    STUDY_QUERIES = 402  # a study's spd_ilw queries
    STEER_TRAIN = 601  # `icl-probe steer` / [steering]: prompts the steered probes are fitted on
    STEER_TEST = 602  # the prompts that are steered
    ADAM_ESTIMATE = 501  # `icl-probe export`: batches that estimate Adam's moments of a run without them
    EVALUATION = 7_777_777  # `icl-probe evaluate` and the report's error curve (apart from training's stream)
    CORRUPTED = 9_191_919  # the corrupted functions of the patching checks (same x, fresh w)
    STATE_SOURCE = 9_191_920  # the fresh x's whose Newton state the state check writes (interventions/state.py)


class Offset(IntEnum):
    """Streams taken as seed + offset (torch's global generator or a second prompt set)."""

    HELD_OUT = 1  # mean-ablation means come from prompts of seed + 1
    SHUFFLE = 7  # the probes' shuffled-targets control permutation
    RANDOM_WEIGHTS = 99  # the random-weights control model (probes and the null baselines)


def generator_for(seed: int, *stream: int) -> torch.Generator:
    """A CPU generator for (seed, stream...), e.g. (seed, step, rank): resumable data streams."""
    mixed = seed
    for s in stream:
        mixed = (mixed * 1_000_003 + s + 1) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def stream_generator(seed: int, stream: Stream) -> torch.Generator:
    """The generator of `stream` for run seed `seed`."""
    return generator_for(seed, int(stream))
