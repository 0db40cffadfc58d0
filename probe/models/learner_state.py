"""Where a planted construction keeps its learner's matrix iterate, for the causal map check that
writes a state there (probe/interventions/state.py); each construction declares its own
(probe/models/constructions/), read through `PlantedICL.learner_state`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LearnerState:
    """Where a construction keeps its learner's iterate, a d x d matrix M (Fu et al. 2024, eq. 8's M_k):
    each (held, source) slot pair of a token holds M times the token's `source` slot (M e_j = m_j in
    Newton's column tokens, T x_i in the ReLU construction's tx). The state is whole at boundaries
    first, first + every, ... (the linear construction is mid-step at the others) and the prediction
    read out `lag` boundaries later is the first to use it (probe/interventions/state.py)."""

    learner: str
    slots: tuple[tuple[str, str], ...]
    first: int
    every: int
    lag: int

    def boundaries(self, n_layers: int) -> list[int]:
        """The boundaries where the state is whole and a later prediction reads it."""
        return list(range(self.first, n_layers - self.lag + 1, self.every))
