"""Saving and loading models: the toolkit's own run directories and Garg et al.'s layout.

Own layout (what `icl-probe train` writes):
    config.json        the resolved RunConfig plus provenance
    model.safetensors  the model's state dict
    train_state.pt     optimizer state and step, for --resume (tensors and plain containers only)

Garg et al.'s layout (REFERENCE.md §1): config.yaml with `model:` / `training:` blocks and
state.pt {model_state_dict, optimizer_state_dict, train_step} or bare model_<step>.pt.

Nothing here unpickles arbitrary objects: safetensors, or torch.load(weights_only=True).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from ..core.errors import CheckpointError, ConfigError
from ..core.parsing import load_json, load_yaml
from ..core.validate import check_memory
from ..data.config import TaskConfig
from ..models import build_model, family_class
from ..models.config import ModelConfig
from ..models.sizes import model_bytes
from .outputs import fix_mode
from .run_config import RunConfig

GARG_VOCAB = 50257  # GPT-2's vocabulary: Garg's state dicts carry an unused wte of this size
IGNORED_LEGACY = re.compile(r"^_backbone\.(wte\.weight|h\.\d+\.attn\.(bias|masked_bias))$")


@dataclass
class LoadedCheckpoint:
    model: nn.Module
    config: RunConfig
    format: str  # "native" or "garg"
    path: Path
    weights_file: Path
    meta: dict[str, Any]
    variant: str = ""  # a view of these weights as another model (curriculum_stage.py): part of the fingerprint

    @property
    def sha256(self) -> str:

        digest = hashlib.sha256()
        with self.weights_file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return digest.hexdigest()

    @property
    def fingerprint(self) -> str:
        """What defines this checkpoint's numbers: the weights' sha256 and every weight or config
        file beside them (a Hugging Face read-out head, a config.json edited by hand), byte for
        byte. Logs, evaluations and optimizer state do not count; nor does how this version of
        icl-probe represents the run config (a field added in a later version, with its default,
        changed every fingerprint and refused every --force over a report made before)."""

        digest = hashlib.sha256(self.sha256.encode())
        digest.update(self.variant.encode())
        folder = self.path if self.path.is_dir() else self.path.parent
        for path in sorted(folder.iterdir()):
            if path.is_file() and path.suffix in DEFINING_SUFFIXES and path.name not in NOT_DEFINING:
                digest.update(path.name.encode())
                digest.update(hashlib.sha256(path.read_bytes()).hexdigest().encode())
        return digest.hexdigest()

    @property
    def name(self) -> str:
        return self.path.name


DEFINING_SUFFIXES = {".safetensors", ".bin", ".pt", ".json", ".yaml", ".yml"}
NOT_DEFINING = {"train_state.pt", ".icl-probe-output.json"}  # resume state, output markers


# ---------------------------------------------------------------------------- file helpers


def atomic_write(path: Path, write) -> None:
    """Write through a temporary file in the same directory, then rename: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))

        fix_mode(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def safe_torch_load(path: Path) -> Any:
    """torch.load restricted to tensors and plain containers; refuses pickled code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{path}: refused to load: the file holds pickled Python objects other than tensors "
            f"({first}). Only plain state dicts are accepted; re-save it with "
            f"torch.save(model.state_dict(), ...)."
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"{path}: not a readable PyTorch file (corrupt or truncated?): {first}") from None


def read_safetensors(path: Path) -> dict[str, Tensor]:

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file (corrupt or truncated?): {err}") from None


def strip_prefixes(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove DataParallel `module.` and torch.compile `_orig_mod.` prefixes."""
    out = {}
    for key, value in state.items():
        while key.startswith(("module.", "_orig_mod.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def load_weights(model: nn.Module, state: dict[str, Tensor], source: Path) -> None:
    """Load `state` into `model`, failing with one message listing every key problem."""
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{source}: expected a state dict of tensors")
    for key, value in state.items():
        if IGNORED_LEGACY.match(key) or key.endswith(("attn.bias", "attn.masked_bias")):
            continue
        if not value.is_floating_point():
            raise CheckpointError(
                f"{source}: weight {key} holds {value.dtype}, not floating point; "
                "the file is not a trained model's state dict"
            )
        if not bool(torch.isfinite(value).all()):
            raise CheckpointError(
                f"{source}: weight {key} contains NaN or infinite values; the model diverged "
                "or the file is corrupt; use an earlier checkpoint"
            )
    state = {k: v for k, v in strip_prefixes(state).items() if not IGNORED_LEGACY.match(k)}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: file {tuple(state[k].shape)} vs config {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_short(unexpected)}")
        if wrong:
            parts.append(f"shape mismatches {_short(wrong)}")
        raise CheckpointError(
            f"{source}: weights do not match the model its config describes: "
            + "; ".join(parts)
            + ". Check that the config file belongs to these weights."
        )
    model.load_state_dict(state)


def _short(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return f"[{shown}{', ...' if len(items) > limit else ''}] ({len(items)})"


# ---------------------------------------------------------------------------- own layout


SIGNATURE_SEED = 20261125  # the fixed prompts whose predictions a checkpoint records
SIGNATURE_PROMPTS = 2


def signature(model: nn.Module, config: RunConfig) -> list[float]:
    """The model's predictions on SIGNATURE_PROMPTS fixed standard-normal prompts of its input size
    (every position, float32 on CPU; the task's settings play no part): recorded at save, recomputed
    at load, so that a config that no longer describes the weights it came with (a changed n_head
    keeps every shape) is caught. Runs on the model's device and leaves its train / eval mode as it was."""
    g = torch.Generator().manual_seed(SIGNATURE_SEED)
    m = config.model
    xs = torch.randn(SIGNATURE_PROMPTS, m.n_positions, m.n_dims, generator=g)
    ys = torch.randn(SIGNATURE_PROMPTS, m.n_positions, generator=g)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            preds = model(xs.to(device), ys.to(device))
    finally:
        model.train(training)
    return [float(v) for v in preds.float().cpu().flatten()]


def check_signature(model: nn.Module, config: RunConfig, recorded: Any, where: Path) -> None:
    """Refuse weights that do not reproduce the predictions recorded when they were saved."""
    if recorded is None:
        return  # saved before signatures were recorded
    now = torch.tensor(signature(model, config))
    then = torch.as_tensor(recorded, dtype=torch.float32) if isinstance(recorded, list) else None
    if then is None or then.shape != now.shape:
        raise CheckpointError(f"{where}: meta.signature must be a list of {now.numel()} numbers; save the model again")
    gap = float((now - then).abs().max())
    if not gap <= 1e-5 + 1e-4 * float(then.abs().max()):  # float32 round-off across machines is ~1e-6
        raise CheckpointError(
            f"{where}: the weights do not reproduce the predictions recorded when they were saved (largest difference "
            f"{gap:.3g}): the config no longer describes the model they were trained as (check n_head, encoding and "
            "the task)"
        )


def save_model(model: nn.Module, config: RunConfig, directory: Path, meta: dict[str, Any] | None = None) -> None:
    """Write config.json (with the model's `signature` in its meta) and model.safetensors atomically."""

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write(directory / "model.safetensors", lambda p: save_file(state, str(p)))
    meta = {**(meta or {}), "signature": signature(model, config)}
    payload = {"format": "icl-probe", "config": config.to_dict(), "meta": meta}
    atomic_write(directory / "config.json", lambda p: p.write_text(json.dumps(payload, indent=2) + "\n"))


def check_size(config: RunConfig, weights: Path) -> None:
    """Refuse a config whose model is far larger than its weights file (before allocating it)."""

    expected = model_bytes(config.model)
    actual = weights.stat().st_size
    if family_class(config.model.family).sized_by_config and expected > 2 * actual + (1 << 20):
        raise CheckpointError(
            f"{weights}: the config describes a model of about {expected / 1e6:.1f} MB of weights but the file "
            f"holds {actual / 1e6:.3f} MB; the config does not belong to these weights (check n_embd, n_layer)"
        )
    check_memory(expected, f"the model in {weights.parent}", "check the config's sizes")


def load_native(directory: Path) -> LoadedCheckpoint:
    config_file = directory / "config.json"
    payload = load_json(config_file, CheckpointError, "config.json")
    if not isinstance(payload, dict) or not isinstance(payload.get("config"), dict):
        raise CheckpointError(f'{config_file}: needs a "config" object (the run config)')
    if not isinstance(payload.get("meta", {}), dict):
        raise CheckpointError(f'{config_file}: "meta" must be an object, got {type(payload["meta"]).__name__}')
    try:
        config = RunConfig.from_dict(payload["config"])
    except ConfigError as err:
        raise CheckpointError(f"{config_file}: invalid config: {err}") from None
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{directory}: config.json found but model.safetensors is missing")
    check_size(config, weights)
    model = build_model(config.model)
    load_weights(model, read_safetensors(weights), weights)
    meta = payload.get("meta", {})
    check_signature(model, config, meta.get("signature"), config_file)
    return LoadedCheckpoint(model.eval(), config, "icl-probe", directory, weights, meta)


# ---------------------------------------------------------------------------- Garg et al.'s layout


GARG_FAMILY = "gpt2"  # the one model.family of Garg et al.'s config.yaml that their train.py builds


def garg_config_to_run(raw: dict[str, Any], source: Path) -> RunConfig:
    """Translate Garg et al.'s config.yaml (model + training blocks) into a RunConfig."""
    model = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(model, dict):
        raise CheckpointError(f"{source}: no `model:` block (expected Garg et al.'s config.yaml)")
    if model.get("family", GARG_FAMILY) != GARG_FAMILY:
        raise CheckpointError(
            f"{source}: model.family {model.get('family')!r} is not supported; only Garg et al.'s gpt2 family loads"
        )
    try:
        mc = ModelConfig(
            family="gpt2", **{k: model[k] for k in ("n_dims", "n_positions", "n_embd", "n_layer", "n_head")}
        )
    except KeyError as err:
        raise CheckpointError(f"{source}: model block lacks {err}") from None
    except ConfigError as err:
        raise CheckpointError(f"{source}: {err}") from None
    training = raw.get("training") or {}
    if not isinstance(training, dict):
        raise CheckpointError(f"{source}: `training:` must be a mapping, got {type(training).__name__}")
    task = _garg_task(training, mc, source)
    return RunConfig(model=mc, task=task)


# Garg et al.'s tasks (src/tasks.py) that icl-probe has, and the task_kwargs each takes -> our TaskConfig field.
GARG_TASKS: dict[str, tuple[str, dict[str, str]]] = {
    "linear_regression": ("linear_regression", {"scale": "w_scale"}),
    "sparse_linear_regression": ("sparse_linear_regression", {"scale": "w_scale", "sparsity": "sparsity"}),
    "noisy_linear_regression": ("linear_regression", {"scale": "w_scale", "noise_std": "noise_std"}),
}
GARG_REFUSED_TASKS = {
    "relu_2nn_regression": "their 2-layer network of width 100 with weights N(0, 1) scaled by sqrt(2/width) is not "
    "icl-probe's relu_network task (N layers, 1/sqrt(fan-in), Wu et al. 2024)",
    "decision_tree": "icl-probe has no decision-tree task or learners",
    "linear_classification": "icl-probe has no classification task (labels sign(x.w))",
    "quadratic_regression": "icl-probe has no quadratic-regression task",
}


def _garg_task(training: dict[str, Any], mc: ModelConfig, source: Path) -> TaskConfig:
    """The task of a Garg run: read from every field of their training block that changes the
    data (task, task_kwargs, data, curriculum.points.end), or refused by name."""
    name = training.get("task", "linear_regression")
    if not isinstance(name, str):
        raise CheckpointError(f"{source}: training.task must be a task name, got {name!r}")
    if name in GARG_REFUSED_TASKS:
        raise CheckpointError(f"{source}: training.task {name!r} is not supported: {GARG_REFUSED_TASKS[name]}")
    if name not in GARG_TASKS:
        raise CheckpointError(
            f"{source}: training.task {name!r} is not a task icl-probe knows (known: {', '.join(GARG_TASKS)})"
        )
    data = training.get("data", "gaussian")
    if data != "gaussian":
        raise CheckpointError(
            f"{source}: training.data {data!r} is not supported; only 'gaussian' inputs (x ~ N(0, I))"
        )
    kwargs = training.get("task_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"{source}: training.task_kwargs must be a mapping, got {kwargs!r}")
    ours, known = GARG_TASKS[name]
    fields: dict[str, Any] = {"sparsity": 3} if ours == "sparse_linear_regression" else {}  # their default
    for key, value in kwargs.items():
        if key == "renormalize_ys" and value is False:
            continue
        if key == "valid_coords" and value in (None, mc.n_dims):
            continue
        if key not in known:
            raise CheckpointError(
                f"{source}: training.task_kwargs.{key} = {value!r} changes the {name} task in a way icl-probe does not "
                f"implement (supported: {', '.join(known) or 'none'})"
            )
        fields[known[key]] = value
    points = training.get("curriculum", {}).get("points", {}) if isinstance(training.get("curriculum"), dict) else {}
    end = points.get("end", mc.n_positions) if isinstance(points, dict) else mc.n_positions
    if not isinstance(end, int) or isinstance(end, bool) or not 1 <= end <= mc.n_positions:
        raise CheckpointError(
            f"{source}: training.curriculum.points.end = {end!r} must be an integer in 1..model.n_positions "
            f"({mc.n_positions}); it is the prompt length their evaluation uses"
        )
    try:
        return TaskConfig(name=ours, n_dims=mc.n_dims, n_points=end, **fields)
    except (ConfigError, TypeError) as err:
        raise CheckpointError(f"{source}: training.task_kwargs {kwargs}: {err}") from None


def garg_weights_file(directory: Path) -> Path:
    if (directory / "state.pt").is_file():
        return directory / "state.pt"
    steps = sorted(
        (p for p in directory.glob("model_*.pt") if p.is_file()), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0)
    )
    if steps:
        return steps[-1]
    raise CheckpointError(f"{directory}: config.yaml found but neither state.pt nor model_<step>.pt")


def load_garg(directory: Path) -> LoadedCheckpoint:
    config_file = directory / "config.yaml"
    if not config_file.is_file():
        raise CheckpointError(
            f"{directory}: no config.yaml; a Garg et al. run directory holds config.yaml beside state.pt or "
            "model_<step>.pt (copy it from the run that made the weights)"
        )
    raw = load_yaml(config_file, CheckpointError, "config.yaml")
    config = garg_config_to_run(raw, config_file)
    weights = garg_weights_file(directory)
    check_size(config, weights)
    blob = safe_torch_load(weights)
    state = blob.get("model_state_dict", blob) if isinstance(blob, dict) else blob
    model = build_model(config.model)
    load_weights(model, state, weights)
    meta = {"train_step": int(blob["train_step"])} if isinstance(blob, dict) and "train_step" in blob else {}
    return LoadedCheckpoint(model.eval(), config, "garg", directory, weights, meta)


EXPORTED_TASKS = {"linear_regression": "linear_regression", "sparse_linear_regression": "sparse_linear_regression"}


def garg_training_block(config: RunConfig) -> dict[str, Any]:
    """The `training:` block of Garg et al.'s schema (src/schema.py) for a run of ours.

    Their curriculum has both stages always set; an unset stage of ours ("always full size") is
    written as a constant one. Tasks they cannot express (ill-conditioned inputs, ReLU networks)
    are refused by name.
    """
    task, train, cur = config.task, config.train, config.curriculum
    if task.name not in EXPORTED_TASKS or task.covariance != "isotropic":
        raise ConfigError(
            f"task {task.name!r} with {task.covariance} inputs has no equivalent in Garg et al.'s "
            f"code; only isotropic linear_regression and sparse_linear_regression export"
        )
    kwargs: dict[str, Any] = {}
    name = EXPORTED_TASKS[task.name]
    if task.w_scale != 1.0:
        kwargs["scale"] = task.w_scale  # their y = scale * x.w, i.e. w ~ N(0, scale^2 I)
    if task.name == "sparse_linear_regression":
        kwargs["sparsity"] = task.sparsity
    if task.noise_std > 0:
        name, kwargs["noise_std"] = "noisy_linear_regression", task.noise_std

    def stage(value: Any, full: int) -> dict[str, int]:
        if value is None:
            return {"start": full, "end": full, "inc": 0, "interval": train.steps}
        return {"start": value.start, "end": value.end, "inc": value.inc, "interval": value.interval}

    return {
        "task": name,
        "task_kwargs": kwargs,
        "num_tasks": None,
        "num_training_examples": None,
        "data": "gaussian",
        "batch_size": train.batch_size,
        "learning_rate": train.lr,
        "train_steps": train.steps,
        "save_every_steps": train.save_every,
        "keep_every_steps": -1,
        "resume_id": None,
        "curriculum": {"dims": stage(cur.dims, task.n_dims), "points": stage(cur.points, task.n_points)},
    }


def fresh_adam_state(n_params: int, lr: float) -> dict[str, Any]:
    """`torch.optim.Adam(params, lr).state_dict()` before its first step, for n_params tensors.

    Garg et al.'s train.py restores this with `optimizer.load_state_dict`, which checks the
    number of groups and parameters and takes the saved learning rate.
    """
    probe_params = [nn.Parameter(torch.zeros(1)) for _ in range(n_params)]
    return torch.optim.Adam(probe_params, lr=lr).state_dict()


def garg_adam_state(model: nn.Module, lr: float, ours: dict[str, Any] | None) -> dict[str, Any]:
    """The Adam state their train.py resumes: our run's moments and step moved to their parameter
    order (theirs is ours with the unused token embedding `wte` before `wpe`; our AdamW with
    weight decay 0 is Adam), at learning rate `lr` (where our schedule had arrived). `ours` is the
    run's train_state.pt optimizer, or `train.estimated_adam_state` for a run without it; None
    leaves the moments at zero (each weight then moves by about lr per step at first)."""
    names = [name for name, _ in model.named_parameters()]
    theirs = [*names[: names.index("_backbone.wpe.weight")], "_backbone.wte.weight"]
    theirs += names[names.index("_backbone.wpe.weight") :]
    state = fresh_adam_state(len(theirs), lr)
    if ours is not None:
        saved = ours.get("state", {})
        if len(ours["param_groups"][0]["params"]) != len(names) or ours["param_groups"][0].get("weight_decay", 0):
            raise CheckpointError("train_state.pt's optimizer does not match this model (or uses weight decay)")
        for i, name in enumerate(names):
            if i in saved:
                state["state"][theirs.index(name)] = {k: v.clone() for k, v in saved[i].items()}
    return state


def export_garg(
    model: nn.Module,
    config: RunConfig,
    directory: Path,
    train_step: int = 0,
    run_name: str | None = None,
    out_dir: str | None = None,
    lr: float | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> None:
    """Write a run directory that Garg et al.'s code (and the Iterative Newton paper's fork) loads,
    evaluates (`eval.get_run_metrics`) and continues training (`train.py` resumes from state.pt).

    config.yaml carries every block of their schema (out_dir, model, training with curriculum,
    wandb, test_run); state.pt holds their key names (the unused token embedding
    `_backbone.wte.weight`, 50257 x D, added as zeros), an Adam state for as many
    parameters as their model has (their state dict holds no buffers), and train_step. `lr` is
    the learning rate their resumed training continues at (default: ours at `train_step`'s end of
    schedule is the caller's to give; else the peak), `optimizer_state` our run's optimizer state
    (train_state.pt), whose moments are carried over (see garg_adam_state).
    """

    if not family_class(config.model.family).garg_format or config.model.encoding != "garg":
        raise ConfigError("Only GPT-2 models with Garg's token encoding can be exported to their layout")
    if config.model.attn_activation != "softmax":
        raise ConfigError(
            f"this model's attention is {config.model.attn_activation!r}; Garg et al.'s code has softmax "
            "attention only, so it cannot be exported to their layout"
        )
    directory = Path(directory)
    state = {}
    for key, value in model.state_dict().items():
        state[key] = value.detach().cpu().clone()
        if key == "_backbone.wpe.weight":
            state["_backbone.wte.weight"] = torch.zeros(GARG_VOCAB, value.shape[1])
    m = config.model
    raw = {
        "out_dir": out_dir or str(directory.name),
        "model": {
            "family": "gpt2",
            "n_dims": m.n_dims,
            "n_embd": m.n_embd,
            "n_head": m.n_head,
            "n_layer": m.n_layer,
            "n_positions": m.n_positions,
        },
        "training": {**garg_training_block(config), "learning_rate": lr or config.train.lr},
        "wandb": {
            "project": "in-context-training",
            "entity": "in-context",
            "notes": "exported by icl-probe"
            + (
                f" at step {train_step}; training.learning_rate is the rate its schedule had reached there "
                f"(peak {config.train.lr:g}), where their train.py continues"
                if lr is not None and lr != config.train.lr
                else ""
            ),
            "name": run_name or directory.name,
            "log_every_steps": 10,
        },
        "test_run": False,
    }
    blob = {
        "model_state_dict": state,
        "optimizer_state_dict": garg_adam_state(model, lr or config.train.lr, optimizer_state),
        "train_step": train_step,
    }
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / "config.yaml", lambda p: p.write_text(yaml.safe_dump(raw, sort_keys=False)))
    atomic_write(directory / "state.pt", lambda p: torch.save(blob, p))
