"""A run's configuration: the model, its task, the training schedule and curriculum; what
`icl-probe train` reads from a recipe and every checkpoint records (config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.config import CurriculumConfig, TrainConfig, from_dict, to_dict
from ..core.errors import ConfigError
from ..data.config import TaskConfig
from ..models.config import ModelConfig


@dataclass
class RunConfig:
    """Recipe tables [model], [task], [train], [curriculum]; each section checks its own values,
    this class the rules between them."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def __post_init__(self) -> None:
        if self.model.n_dims != self.task.n_dims:
            raise ConfigError(f"model.n_dims ({self.model.n_dims}) must equal task.n_dims ({self.task.n_dims})")
        if self.task.n_points > self.model.n_positions:
            raise ConfigError(
                f"task.n_points ({self.task.n_points}) exceeds model.n_positions ({self.model.n_positions})"
            )
        c = self.curriculum
        if c.dims is not None and c.dims.end > self.task.n_dims:
            raise ConfigError(f"curriculum.dims.end must be <= task.n_dims ({self.task.n_dims})")
        if c.points is not None and c.points.end > self.model.n_positions:
            raise ConfigError(f"curriculum.points.end must be <= model.n_positions ({self.model.n_positions})")

    def stage_at(self, step: int) -> tuple[int, int]:
        """(active dims, points per prompt) Garg et al. 2022's curriculum trains on at `step`."""
        c = self.curriculum
        dims = c.dims.at(step) if c.dims else self.task.n_dims
        points = c.points.at(step) if c.points else self.task.n_points
        return dims, points

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return from_dict(cls, data)
