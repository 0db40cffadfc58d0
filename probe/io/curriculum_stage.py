"""A training snapshot seen at its own curriculum stage.

Garg et al. 2022's curriculum trains on prompts whose x has only the first k coordinates non-zero
and p points, both growing with the step. A snapshot saved at step s was trained on (k, p) =
`RunConfig.stage_at(s)`, so asking it questions at the run's final d and n tests it on prompts it
has never seen. The view here is the same network as a d = k model on p points: in both token
encodings the coordinates past k of every token are zero for such prompts (x tokens carry x,
y tokens [y, 0, ..., 0]), so dropping the read-in's columns for them leaves every prediction and
every activation as it was (`tests/test_curriculum_stage.py` checks this on the model itself).
"""

from __future__ import annotations

import dataclasses
import hashlib

from ..core.config import CurriculumConfig
from ..core.errors import ConfigError
from ..models import build_model
from .checkpoint import LoadedCheckpoint

READ_IN = "_read_in.weight"


def at_curriculum_stage(ckpt: LoadedCheckpoint) -> LoadedCheckpoint:
    """`ckpt` as a model of the active dimension and prompt length its curriculum had reached at
    its `train_step`; the checkpoint itself when that stage is the run's final one."""

    step = ckpt.meta.get("train_step") if isinstance(ckpt.meta, dict) else None
    if not isinstance(step, int):
        raise ConfigError(
            f"{ckpt.path}: its config.json records no meta.train_step, so its curriculum stage is unknown; "
            "analyse a snapshot that `icl-probe train --keep-at` wrote, or leave curriculum_stage off"
        )
    config = ckpt.config
    dims, points = config.stage_at(step)
    if (dims, points) == (config.task.n_dims, config.task.n_points):
        return ckpt
    state = ckpt.model.state_dict()
    if READ_IN not in state:
        raise ConfigError(
            f"{ckpt.path}: model family {config.model.family!r} has no read-in of the tokens' coordinates, so it "
            "cannot be restricted to the curriculum's active dimensions; leave curriculum_stage off"
        )
    model_config = dataclasses.replace(config.model, n_dims=dims)
    staged = dataclasses.replace(
        config,
        model=model_config,
        task=dataclasses.replace(config.task, n_dims=dims, n_points=points),
        curriculum=CurriculumConfig(),
    )
    model = build_model(model_config)
    state[READ_IN] = state[READ_IN][:, : model_config.token_dim].clone()
    model.load_state_dict(state)
    stage = {"train_step": step, "dims": dims, "points": points, "of_dims": config.task.n_dims}
    variant = hashlib.sha256(repr(sorted(stage.items())).encode()).hexdigest()
    meta = {**ckpt.meta, "curriculum_stage": stage}
    return dataclasses.replace(ckpt, model=model.eval(), config=staged, meta=meta, variant=variant)
