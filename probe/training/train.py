"""Training in-context regression models (Garg et al.'s recipe, with a modern optimizer).

Every step draws fresh prompts from a generator seeded by (seed, step, rank), so the data
stream does not depend on where a run was interrupted: `--resume` reloads the model,
the AdamW state and the step, and continues with exactly the batches an uninterrupted run
would have seen. Under `torchrun` the model is wrapped in DistributedDataParallel and each
rank draws its own share of the batch.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..analysis.evaluate import eval_prompts
from ..core.errors import CheckpointError, ConfigError, OutputError, TrainingDiverged
from ..core.progress import tqdm
from ..core.provenance import stamp
from ..core.seeds import Stream, stream_generator
from ..core.validate import check_memory
from ..data.metrics import error_per_dim
from ..data.tasks import generator_for, sample_prompts
from ..io.checkpoint import atomic_write, load_weights, read_safetensors, safe_torch_load, save_model
from ..io.outputs import mark_run_directory
from ..io.run_config import RunConfig
from ..models import build_model
from ..models.sizes import activation_bytes, model_bytes

log = logging.getLogger(__name__)

LOCK = ".icl-probe-train.lock"
TRAIN_LOG = "train_log.csv"
EVAL_LOG = "eval_log.csv"
TRAIN_LOG_FIELDS = ["step", "loss", "lr", "dims", "points", "elapsed_s"]
EVAL_LOG_FIELDS = ["step", "error_mean", "error_at_2d1"]


def learning_rate(cfg: RunConfig, step: int) -> float:
    """Linear warm-up to cfg.train.lr, then cosine / linear decay to min_lr_ratio * lr, or constant."""
    t = cfg.train
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    if t.schedule == "constant":
        return t.lr
    frac = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    shape = 0.5 * (1 + math.cos(math.pi * frac)) if t.schedule == "cosine" else 1 - frac
    return t.lr * (t.min_lr_ratio + (1 - t.min_lr_ratio) * shape)


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> DistInfo:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return DistInfo(rank=dist.get_rank(), world=dist.get_world_size())


def _read_log(path: Path) -> tuple[list[str], list[dict]]:
    if not path.is_file():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _write_log(path: Path, fields: list[str], rows: list[dict]) -> None:
    """The whole log, written by replacement (a new file renamed over the old: never edited in
    place, so a hard-linked copy of the run keeps its own log, and a symlink is replaced, not followed)."""

    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(path, write)


def _append_rows(path: Path, fields: list[str], rows: list[dict]) -> None:
    _write_log(path, fields, _read_log(path)[1] + rows)


def _truncate_log(path: Path, last_step: int) -> None:
    """Drop rows logged after the checkpoint we resume from (they will be recomputed)."""
    fields, rows = _read_log(path)
    if fields:
        _write_log(path, fields, [r for r in rows if int(r["step"]) <= last_step])


@contextlib.contextmanager
def run_lock(out: Path):
    """One writer per run directory: an exclusive lock on `out/.icl-probe-train.lock` (holding the
    owner's pid), released when the process ends however it ends, so a stale lock never blocks."""

    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    if path.is_symlink():
        raise OutputError(f"--out {out}: {LOCK} is a symbolic link; remove it")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise OutputError(
                f"--out {out}: another `icl-probe train` (pid {owner}) is writing this run; wait for it "
                "or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            path.unlink(missing_ok=True)  # while still held: a later writer makes a fresh lock
    finally:
        os.close(fd)


@torch.no_grad()
def held_out_error(model: nn.Module, cfg: RunConfig, device: str) -> dict[str, float]:
    """Error/d on the fixed evaluation prompts: mean over positions and at 2d+1 examples."""
    prompts = eval_prompts(cfg.task, cfg.train.eval_prompts, cfg.train.seed).to(device)
    model.eval()
    err = error_per_dim(model(prompts.xs, prompts.ys), prompts.ys, cfg.task.n_dims).mean(0)  # (n,)
    model.train()
    k = 2 * cfg.task.n_dims + 1
    return {"error_mean": float(err.mean()), "error_at_2d1": float(err[k]) if k < err.numel() else float("nan")}


TRAIN_STATE = "train_state.pt"
SNAPSHOTS = "snapshots"


def save_training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: RunConfig, out: Path, step: int, elapsed: float
) -> None:
    """Publish the weights, then commit weights + optimizer state + step as one file.

    `train_state.pt` is the commit point: it carries its own copy of the weights, so a kill
    between any two writes leaves either the old or the new state, never a mix (the published
    `model.safetensors` may run ahead of it; `--resume` always restarts from train_state.pt).
    """
    meta = {**stamp(), "train_step": step, "train_seconds": round(elapsed, 1)}
    save_model(model, cfg, out, meta)
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    state = {"model": weights, "optimizer": optimizer.state_dict(), "step": step, "elapsed": elapsed}
    atomic_write(out / TRAIN_STATE, lambda p: torch.save(state, p))


def save_snapshot(model: nn.Module, cfg: RunConfig, out: Path, step: int, elapsed: float) -> Path:
    """Write an immutable snapshot `snapshots/step_<k>/` (a loadable checkpoint), renamed into place."""
    target = out / SNAPSHOTS / f"step_{step}"
    if target.exists():  # immutable: a resumed run reproduces the same weights at the same step
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".step_{step}."))
    try:
        save_model(model, cfg, tmp, {**stamp(), "train_step": step, "train_seconds": round(elapsed, 1)})
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_training_state(model: nn.Module, optimizer: torch.optim.Optimizer, out: Path) -> tuple[int, float]:
    """Restore model and optimizer from train_state.pt; refuse anything inconsistent."""
    path = out / TRAIN_STATE
    if not path.exists():
        raise CheckpointError(f"--resume: {out} has no {TRAIN_STATE} to resume from")
    state = safe_torch_load(path)
    if not isinstance(state, dict) or not {"optimizer", "step", "elapsed"} <= set(state):
        raise CheckpointError(
            f"{path}: not an icl-probe training state (needs optimizer, step, elapsed); "
            "start a new run in another --out"
        )
    try:
        step, elapsed = int(state["step"]), float(state["elapsed"])
    except (TypeError, ValueError):
        raise CheckpointError(f"{path}: step/elapsed are not numbers; the file is corrupt") from None
    if "model" in state:
        load_weights(model, state["model"], path)
    else:  # older runs: the weights file must be the one saved with this step
        load_weights(model, read_safetensors(out / "model.safetensors"), out / "model.safetensors")
        saved_step = _saved_train_step(out)
        if saved_step != step:
            raise CheckpointError(
                f"--resume: {out}/model.safetensors is from step {saved_step} but {TRAIN_STATE} from step "
                f"{step} (the run was killed between the two writes); this older run cannot be resumed safely"
            )
    try:
        optimizer.load_state_dict(state["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise CheckpointError(
            f"{path}: optimizer state does not match the model ({err}); start a new run in another --out"
        ) from None
    return step, elapsed


def _saved_train_step(out: Path) -> int | None:

    try:
        return int(json.loads((out / "config.json").read_text())["meta"]["train_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def train(
    cfg: RunConfig,
    out: str | Path,
    *,
    resume: bool = False,
    device: str = "cpu",
    progress: bool = True,
    keep_every: int = 0,
    keep_at: Sequence[int] = (),
) -> nn.Module:
    """Train `cfg` into run directory `out`; returns the trained (unwrapped) model.

    keep_every > 0 also keeps an immutable snapshot every that many steps (and at the end)
    under `out/snapshots/step_<k>/`, each loadable with `load_checkpoint`; `keep_at` keeps one
    at each listed step count (e.g. log-spaced steps for a training-dynamics study).
    """
    out = Path(out)
    dist_info = init_distributed(device)
    device = _check_training(cfg, out, resume, device, keep_every, dist_info)
    keep = _snapshot_rule(cfg, keep_every, keep_at)
    created = not out.exists()
    with run_lock(out) if dist_info.main else contextlib.nullcontext():
        model, optimizer, start, elapsed = _training_state(cfg, out, resume, device, dist_info)
        net = model
        if dist_info.world > 1:
            net = nn.parallel.DistributedDataParallel(model)
        try:
            _loop(cfg, out, model, net, optimizer, start, elapsed, device, dist_info, progress, keep)
        except BaseException:
            if created and dist_info.main and not (out / TRAIN_STATE).exists():
                shutil.rmtree(out, ignore_errors=True)  # nothing worth keeping was written
            raise
    if dist_info.world > 1:
        import torch.distributed as dist

        dist.barrier()
    return model.eval()


def _snapshot_rule(cfg: RunConfig, keep_every: int, keep_at: Sequence[int]) -> Callable[[int], bool]:
    """Which step counts keep a snapshot: every `keep_every` steps and the end, and each of `keep_at`."""
    at = set()
    for k in keep_at:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= cfg.train.steps:
            raise ConfigError(
                f"--keep-at: {k!r} is not a step count between 1 and train.steps = {cfg.train.steps}; "
                "give whole numbers of steps done, e.g. --keep-at 500,1000,2000"
            )
        at.add(k)

    def keep(done: int) -> bool:
        every = bool(keep_every) and (done % keep_every == 0 or done == cfg.train.steps)
        return every or done in at

    return keep


def _check_training(cfg: RunConfig, out: Path, resume: bool, device: str, keep_every: int, dist_info) -> str:
    """Refuse a run that cannot start (bad --keep-every, no GPU, an existing run without --resume,
    a batch that does not fit in memory); returns this process's device."""
    if not isinstance(keep_every, int) or keep_every < 0:
        raise ConfigError(f"--keep-every must be a non-negative integer, got {keep_every!r}")
    if device.startswith("cuda") and dist_info.world > 1:
        device = f"cuda:{dist_info.rank % torch.cuda.device_count()}"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for but torch sees no GPU; use --device cpu")
    if cfg.train.batch_size % dist_info.world:
        raise ConfigError(
            f"train.batch_size ({cfg.train.batch_size}) must divide evenly over {dist_info.world} processes"
        )
    if (out / TRAIN_STATE).exists() and not resume:
        raise ConfigError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    linked = [
        name
        for name in (TRAIN_LOG, EVAL_LOG, TRAIN_STATE, SNAPSHOTS, "config.json", "model.safetensors", LOCK)
        if (out / name).is_symlink()
    ]
    if linked:
        raise OutputError(
            f"--out {out}: {linked[0]} is a symbolic link; a run writes only its own files, never through a link "
            "(replace the link by the file, or choose another --out)"
        )

    check_memory(
        model_bytes(cfg.model) * 4
        + activation_bytes(cfg.model, cfg.train.batch_size // dist_info.world, cfg.task.n_points, training=True),
        f"training with train.batch_size={cfg.train.batch_size}",
        "lower train.batch_size or the model size",
    )
    # the held-out prompts and one forward over them at once (held_out_error)
    check_memory(
        4 * cfg.train.eval_prompts * cfg.task.n_points * (cfg.task.n_dims + 2)
        + activation_bytes(cfg.model, cfg.train.eval_prompts, cfg.task.n_points, training=False),
        f"train.eval_prompts = {cfg.train.eval_prompts}",
        "lower train.eval_prompts",
    )
    return device


def _training_state(cfg: RunConfig, out: Path, resume: bool, device: str, dist_info):
    """The seeded model and AdamW optimizer on `device`, at step 0 or where a resumed run stopped
    (its logs cut back to that step); returns (model, optimizer, start step, elapsed seconds)."""
    with torch.random.fork_rng(devices=[]):  # the caller's global random state is left as it was
        torch.manual_seed(cfg.train.seed)  # the initialisation (probe/core/seeds.py)
        model = build_model(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    start, elapsed = 0, 0.0
    if resume:
        start, elapsed = load_training_state(model, optimizer, out)
        if dist_info.main:  # train_log's step is the step taken (0-based), eval_log's the steps done
            _truncate_log(out / TRAIN_LOG, start - 1)
            _truncate_log(out / EVAL_LOG, start)
        log.info("resuming %s at step %d", out, start)
    model.to(device)
    # Optimizer state follows the parameters onto the device.
    for st in optimizer.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and k != "step":
                st[k] = v.to(device)
    return model, optimizer, start, elapsed


def _train_step(
    cfg: RunConfig,
    model: nn.Module,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    lr: float,
    shape: tuple[int, int, int],
    device: str,
    rank: int,
    out: Path,
) -> torch.Tensor:
    """One AdamW step on fresh prompts (batch, points, active dims = `shape`) seeded by (seed,
    step, rank); the loss is the squared error averaged over every prefix (Garg et al.'s
    training objective), or at the last point alone (`train.loss = "last"`). Returns the loss."""
    batch, points, dims = shape
    prompts = sample_prompts(
        cfg.task, batch, points, generator=generator_for(cfg.train.seed, step, rank), active_dims=dims
    ).to(device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    errors = (net(prompts.xs, prompts.ys) - prompts.ys) ** 2
    loss = (errors[:, -1] if cfg.train.loss == "last" else errors).mean()
    if not torch.isfinite(loss):
        kept = (
            f"The last finite checkpoint in {out} is kept ({TRAIN_STATE})"
            if (out / TRAIN_STATE).exists()
            else "No checkpoint was written"
        )
        raise TrainingDiverged(
            f"training diverged at step {step}: the loss is {loss.item()} (train.lr={cfg.train.lr:g}, "
            f"task.w_scale={cfg.task.w_scale:g}); lower train.lr or the task's scale. {kept}"
        )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.train.grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    optimizer.step()
    return loss


def estimated_adam_state(model: nn.Module, cfg: RunConfig, step: int, batches: int = 64) -> dict:
    """An Adam state for a run whose optimizer state is not kept (a shipped checkpoint), in
    torch's state_dict layout: first and second moments estimated from the gradients of `batches`
    training batches at the end of the curriculum (exp_avg = mean g, exp_avg_sq = mean g^2, what
    the moving averages of Adam, Kingma & Ba Alg. 1, track), with `step` steps taken, so that a
    resumed Adam continues at its usual step size instead of moving every weight by its learning
    rate at once, as zero moments do. Batches are drawn from a stream of their own (not the
    training run's)."""
    params = list(model.parameters())
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    dims, points = cfg.stage_at(step)
    generator = stream_generator(cfg.train.seed, Stream.ADAM_ESTIMATE)
    model.train()
    for _ in range(batches):
        prompts = sample_prompts(cfg.task, cfg.train.batch_size, points, generator=generator, active_dims=dims)
        model.zero_grad(set_to_none=True)
        ((model(prompts.xs, prompts.ys) - prompts.ys) ** 2).mean().backward()
        for f, sq, p in zip(first, second, params):
            if p.grad is not None:
                f += p.grad / batches
                sq += p.grad**2 / batches
    model.zero_grad(set_to_none=True)
    model.eval()
    state = {
        i: {"step": torch.tensor(float(max(step, 1))), "exp_avg": f, "exp_avg_sq": sq}
        for i, (f, sq) in enumerate(zip(first, second))
    }
    group = {
        "lr": cfg.train.lr,
        "betas": (0.9, 0.999),
        "eps": 1e-8,
        "weight_decay": 0.0,
        "params": list(range(len(params))),
    }
    return {"state": state, "param_groups": [group]}


def _commit(model, optimizer, cfg: RunConfig, out: Path, done: int, rows: list[dict], elapsed: float) -> None:
    """Write the pending log rows (emptying `rows`) and the training state after `done` steps,
    refusing non-finite weights so that train_state.pt always holds the last finite state."""

    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        raise TrainingDiverged(
            f"training diverged before step {done}: the weights hold NaN or infinite "
            f"values; lower train.lr (now {cfg.train.lr:g}). {out}/train_state.pt keeps "
            "the last finite state"
        )
    _append_rows(out / TRAIN_LOG, TRAIN_LOG_FIELDS, rows)
    rows.clear()
    save_training_state(model, optimizer, cfg, out, done, elapsed)
    mark_run_directory(out, "train")


def _loop(
    cfg: RunConfig,
    out: Path,
    model: nn.Module,
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    start: int,
    elapsed: float,
    device: str,
    dist_info: DistInfo,
    progress: bool,
    keep: Callable[[int], bool],
) -> None:
    """The training steps from `start`: fresh prompts, AdamW, logging, checkpoints and snapshots."""

    if dist_info.main:
        mark_run_directory(out, "train")
        if start and keep(start):
            save_snapshot(model, cfg, out, start, elapsed)  # a kill may have come between commit and snapshot

    local_batch = cfg.train.batch_size // dist_info.world
    rows: list[dict] = []
    bar = tqdm(
        range(start, cfg.train.steps),
        initial=start,
        total=cfg.train.steps,
        disable=not (progress and dist_info.main),
        desc="train",
        dynamic_ncols=True,
    )
    t0 = time.perf_counter() - elapsed
    model.train()
    for step in bar:
        dims, points = cfg.stage_at(step)
        lr = learning_rate(cfg, step)
        loss = _train_step(
            cfg, model, net, optimizer, step, lr, (local_batch, points, dims), device, dist_info.rank, out
        )
        done = step + 1
        if dist_info.main and (step % cfg.train.log_every == 0 or done == cfg.train.steps):
            elapsed_s = f"{time.perf_counter() - t0:.1f}"
            row = {"step": step, "loss": f"{loss.item():.6g}", "lr": f"{lr:.4g}", "dims": dims, "points": points}
            rows.append({**row, "elapsed_s": elapsed_s})
            bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.1e}")
        if dist_info.main and (done % cfg.train.eval_every == 0 or done == cfg.train.steps):
            ev = held_out_error(model, cfg, device)
            # step = steps done, as in snapshots/step_<k>/ and train_state.pt
            _append_rows(out / EVAL_LOG, EVAL_LOG_FIELDS, [{"step": done, **{k: f"{v:.6g}" for k, v in ev.items()}}])
            log.info("step %d: held-out error/d %.4f, at 2d+1 %.4f", done, ev["error_mean"], ev["error_at_2d1"])
        if dist_info.main and (done % cfg.train.save_every == 0 or done == cfg.train.steps):
            _commit(model, optimizer, cfg, out, done, rows, time.perf_counter() - t0)
        if dist_info.main and keep(done):
            save_snapshot(model, cfg, out, done, time.perf_counter() - t0)
            mark_run_directory(out, "train")
