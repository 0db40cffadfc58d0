"""Checkpoint formats behind one registry: each knows how to recognise a path and load it.

    icl-probe  config.json ("format": "icl-probe") + model.safetensors   (what `icl-probe train` writes)
    garg       config.yaml + state.pt or model_<step>.pt                  (Garg et al. 2022 run directories)
    hf-gpt2    config.json (model_type gpt2) + model.safetensors or pytorch_model.bin, with
               icl_head.safetensors beside them holding read_in.{weight,bias}, read_out.{weight,bias}

A path that matches none gets one message listing each format and why it did not match.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core.config import from_dict
from ..core.errors import CheckpointError, ConfigError
from ..core.parsing import load_json
from ..core.registry import Registry
from ..data.config import TaskConfig
from ..models import build_model
from ..models.config import ModelConfig
from .checkpoint import (
    LoadedCheckpoint,
    check_size,
    load_garg,
    load_native,
    load_weights,
    read_safetensors,
    safe_torch_load,
    strip_prefixes,
)
from .run_config import RunConfig

HF_HEAD = "icl_head.safetensors"


@dataclass(frozen=True)
class CheckpointFormat:
    name: str
    detect: Callable[[Path], str | None]  # None when the directory is in this format, else why not
    load: Callable[[Path], LoadedCheckpoint]


FORMATS: Registry[CheckpointFormat] = Registry("checkpoint format")


def _json(path: Path) -> dict | None:
    try:
        data = load_json(path, CheckpointError, "config.json")
    except (OSError, CheckpointError):
        return None
    return data if isinstance(data, dict) else None


def _detect_native(d: Path) -> str | None:
    if not (d / "config.json").is_file():
        return "no config.json"
    data = _json(d / "config.json")
    if data is None:
        if not isinstance(load_json(d / "config.json", CheckpointError, "config.json"), dict):
            raise CheckpointError(f"{d / 'config.json'}: must hold a JSON object")
        raise CheckpointError(f"{d / 'config.json'}: could not be read")
    if data.get("format") != "icl-probe":
        return 'config.json lacks "format": "icl-probe"'
    return None


def _detect_garg(d: Path) -> str | None:
    if not (d / "config.yaml").is_file():
        return "no config.yaml"
    if not (d / "state.pt").is_file() and not any(p.is_file() for p in d.glob("model_*.pt")):
        return "config.yaml but neither state.pt nor model_<step>.pt"
    return None


def _detect_hf(d: Path) -> str | None:
    data = _json(d / "config.json") if (d / "config.json").is_file() else None
    if data is None or data.get("model_type") != "gpt2":
        return 'no config.json with "model_type": "gpt2"'
    if not ((d / "model.safetensors").is_file() or (d / "pytorch_model.bin").is_file()):
        return "config.json but neither model.safetensors nor pytorch_model.bin"
    if not (d / HF_HEAD).is_file():
        return f"GPT-2 weights but no {HF_HEAD} (the read-in and read-out) beside them"
    return None


def _strict_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")  # noqa: TRY004 (callers catch ValueError)
    return value


# GPT-2 config options that change the forward pass, and the values icl-probe's GPT-2 computes.
# Options absent here either do not touch the eval-mode forward (dropouts, initializer_range,
# summary_*, token ids, use_cache) or are mathematically the same computation
# (reorder_and_upcast_attn only reorders the scaling and upcasts to float32).
HF_GPT2_FORWARD = {
    "activation_function": ("gelu_new",),
    "layer_norm_epsilon": (1e-5,),
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
}


def check_hf_options(hf: dict, path: Path) -> None:
    """Refuse, naming it, every GPT-2 config option whose value icl-probe's forward does not implement."""
    for key, allowed in HF_GPT2_FORWARD.items():
        if key not in hf:
            continue
        value = hf[key]
        ok = any(
            value is a
            or (type(value) is type(a) and value == a)
            or (
                isinstance(a, float)
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
                and abs(value - a) <= 1e-12
            )
            for a in allowed
        )
        if not ok:
            raise CheckpointError(
                f"{path}: {key}={json.dumps(value)} is not implemented by icl-probe's GPT-2 (it changes "
                f"the forward pass); supported: {', '.join(json.dumps(a) for a in allowed)}"
            )
    n_inner, n_embd = hf.get("n_inner"), hf.get("n_embd")
    if n_inner is not None and n_inner != (4 * n_embd if isinstance(n_embd, int) else None):
        raise CheckpointError(
            f"{path}: n_inner={json.dumps(n_inner)} is not implemented by icl-probe's GPT-2 (its MLP "
            "width is 4 n_embd); supported: null or 4 * n_embd"
        )


def load_hf_gpt2(d: Path) -> LoadedCheckpoint:
    """A Hugging Face GPT-2 backbone plus a read-in/read-out head supplied beside it."""
    hf = _json(d / "config.json")
    if hf is None:
        raise CheckpointError(f"{d / 'config.json'}: not a JSON object; it should be a Hugging Face GPT-2 config")
    check_hf_options(hf, d / "config.json")
    head = read_safetensors(d / HF_HEAD)
    missing = {"read_in.weight", "read_in.bias", "read_out.weight", "read_out.bias"} - set(head)
    if missing:
        raise CheckpointError(f"{d / HF_HEAD}: missing {sorted(missing)}")
    token_dim = head["read_in.weight"].shape[1] if head["read_in.weight"].ndim == 2 else 0
    encoding = hf.get("icl_encoding", "garg")
    try:
        n_ctx = _strict_int(hf.get("n_positions", hf.get("n_ctx", 1024)))
        mc = ModelConfig(
            family="gpt2",
            n_dims=token_dim - (encoding == "akyurek"),
            n_positions=n_ctx // 2,
            n_embd=_strict_int(hf["n_embd"]),
            n_layer=_strict_int(hf["n_layer"]),
            n_head=_strict_int(hf["n_head"]),
            encoding=encoding,
        )
    except (KeyError, ConfigError, ValueError, TypeError) as err:
        raise CheckpointError(
            f"{d / 'config.json'}: invalid GPT-2 config value ({err}); n_embd, n_layer, n_head and "
            "n_positions must be positive integers"
        ) from None
    task = _hf_task(hf, mc, d / "config.json")
    weights = d / "model.safetensors" if (d / "model.safetensors").is_file() else d / "pytorch_model.bin"
    check_size(RunConfig(model=mc, task=task), weights)
    expected = {
        "read_in.weight": (mc.n_embd, mc.token_dim),
        "read_in.bias": (mc.n_embd,),
        "read_out.weight": (1, mc.n_embd),
        "read_out.bias": (1,),
    }
    for key, shape in expected.items():
        if tuple(head[key].shape) != shape:
            raise CheckpointError(
                f"{d / HF_HEAD}: {key} has shape {tuple(head[key].shape)}, but config.json's n_embd = {mc.n_embd} "
                f"needs {shape}; the read-in/read-out head does not belong to this backbone"
            )
    state = read_safetensors(weights) if weights.suffix == ".safetensors" else safe_torch_load(weights)
    backbone = {}
    for key, value in strip_prefixes(state).items():
        if key.startswith("lm_head."):
            continue
        key = key.removeprefix("transformer.")
        backbone["_backbone." + key] = value
    for part in ("read_in", "read_out"):
        for p in ("weight", "bias"):
            backbone[f"_{part}.{p}"] = head[f"{part}.{p}"]
    model = build_model(mc)
    load_weights(model, backbone, weights)
    return LoadedCheckpoint(model.eval(), RunConfig(model=mc, task=task), "hf-gpt2", d, weights, {})


def _hf_task(hf: dict, mc: ModelConfig, path: Path) -> TaskConfig:
    """The task a Hugging Face checkpoint declares in config.json's `icl_task` block (TaskConfig
    fields, validated like an icl-probe run's [task]); without one, linear regression on the
    model's d and context."""
    declared = hf.get("icl_task")
    if declared is None:
        return TaskConfig(n_dims=mc.n_dims, n_points=mc.n_positions)
    try:
        task = from_dict(TaskConfig, {"n_dims": mc.n_dims, "n_points": mc.n_positions, **declared}, "icl_task")
    except ConfigError as err:
        raise CheckpointError(f"{path}: {err}") from None
    if task.n_dims != mc.n_dims or task.n_points > mc.n_positions:
        raise CheckpointError(
            f"{path}: icl_task has n_dims = {task.n_dims} and n_points = {task.n_points}, but the model reads "
            f"d = {mc.n_dims} with room for {mc.n_positions} points"
        )
    return task


FORMATS.register("icl-probe")(CheckpointFormat("icl-probe", _detect_native, load_native))
FORMATS.register("garg")(CheckpointFormat("garg", _detect_garg, load_garg))
FORMATS.register("hf-gpt2")(CheckpointFormat("hf-gpt2", _detect_hf, load_hf_gpt2))


def detect_and_load(path: Path, format: str | None = None) -> LoadedCheckpoint:
    if not path.exists():
        raise CheckpointError(
            f"Checkpoint not found: {path}. Pass a run directory (formats: "
            f"{', '.join(FORMATS.names())}; see docs/guide/reference.md, 'Checkpoint formats')."
        )
    directory = path if path.is_dir() else path.parent
    if format is not None:
        why_not = FORMATS.get(format).detect(directory)
        other = next((name for name in FORMATS if FORMATS.get(name).detect(directory) is None), None)
        if why_not is not None and other is not None:  # say what the directory is, not what its loader tripped on
            raise CheckpointError(
                f"{path} is not an '{format}' checkpoint ({why_not}); it is a run directory in the '{other}' "
                f"format: pass format='{other}' or leave format out"
            )
        return FORMATS.get(format).load(directory)  # in no format: the asked one's loader says what is missing
    reasons = []
    for name in FORMATS:
        why_not = FORMATS.get(name).detect(directory)
        if why_not is None:
            return FORMATS.get(name).load(directory)
        reasons.append(f"{name}: {why_not}")
    raise CheckpointError(f"{path}: not a checkpoint in any known format. Tried " + "; ".join(reasons) + ".")


def load_checkpoint(path: str | Path, format: str | None = None) -> LoadedCheckpoint:
    """Load a model from a run directory, detecting its format (see FORMATS)."""
    return detect_and_load(Path(path), format)
