"""Shared builders: tiny configs and models so that every test runs in seconds."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from probe.core.config import TrainConfig
from probe.data.config import TaskConfig
from probe.io.run_config import RunConfig
from probe.models.config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
if os.environ.get("PYTEST_XDIST_WORKER"):  # one pytest worker per core: one thread each (torch's, BLAS's)
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1)
# reports' stage cache: one fresh directory per test session, never the user's ~/.cache
os.environ["ICL_PROBE_CACHE"] = tempfile.mkdtemp(prefix="icl-probe-test-cache-")


def build_cfg(family: str = "gpt2", d: int = 3, points: int = 8, width: int = 16, layers: int = 2,
              heads: int = 2, **train) -> RunConfig:
    """A tiny RunConfig; keyword arguments override TrainConfig fields."""
    defaults = {"steps": 30, "batch_size": 16, "lr": 3e-3, "warmup_steps": 5, "log_every": 5, "eval_every": 10,
                    "eval_prompts": 32, "save_every": 10}
    return RunConfig(
        model=ModelConfig(family=family, n_dims=d, n_positions=points, n_embd=width, n_layer=layers, n_head=heads),
        task=TaskConfig(n_dims=d, n_points=points),
        train=TrainConfig(**{**defaults, **train}),
    )


def relu_attention_model(d: int = 3, points: int = 8, width: int = 16, layers: int = 2, heads: int = 2):
    """(model, task): a random GPT-2 with ReLU attention (Wu et al. 2024, Def. 7), its weights scaled up
    from GPT-2's init so that attention scores are O(1) and many pass the ReLU."""
    from probe.models import build_model

    cfg = build_cfg(d=d, points=points, width=width, layers=layers, heads=heads)
    cfg.model.attn_activation = "relu"
    torch.manual_seed(11)
    model = build_model(cfg.model).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "c_attn" in name or "_read_in" in name:
                p.mul_(20.0)
    return model, cfg.task


class GargTransformerModel(torch.nn.Module):
    """Garg et al.'s `TransformerModel` rebuilt from REFERENCE.md §1 with Hugging Face GPT-2."""

    def __init__(self, n_dims: int, n_positions: int, n_embd: int, n_layer: int, n_head: int):
        super().__init__()
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(n_positions=2 * n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        self._read_in = torch.nn.Linear(n_dims, n_embd)
        self._backbone = GPT2Model(cfg)
        self._read_out = torch.nn.Linear(n_embd, 1)

    @staticmethod
    def _combine(xs, ys):
        b, n, d = xs.shape
        ys_wide = torch.cat((ys.view(b, n, 1), torch.zeros(b, n, d - 1)), dim=2)
        return torch.stack((xs, ys_wide), dim=2).view(b, 2 * n, d)

    def forward(self, xs, ys):
        embeds = self._read_in(self._combine(xs, ys))
        out = self._backbone(inputs_embeds=embeds).last_hidden_state
        return self._read_out(out)[:, ::2, 0]


def write_garg_run(directory: Path, model: GargTransformerModel, d: int, points: int, width: int, layers: int,
                   heads: int, prefix: str = "", extra: dict | None = None, name: str = "state.pt") -> Path:
    """A run directory as Garg et al.'s train.py leaves it."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump({
        "model": {"family": "gpt2", "n_dims": d, "n_embd": width, "n_head": heads, "n_layer": layers, "n_positions": points},
        "training": {"task": "linear_regression", "data": "gaussian", "batch_size": 64, "learning_rate": 1e-4,
                     "train_steps": 10, "curriculum": {"dims": {"start": d, "end": d, "inc": 1, "interval": 2000},
                                                       "points": {"start": points, "end": points, "inc": 2, "interval": 2000}}},
    }))
    state = {prefix + k: v for k, v in model.state_dict().items()}
    state.update(extra or {})
    opt = torch.optim.Adam(model.parameters())
    if name == "state.pt":
        torch.save({"model_state_dict": state, "optimizer_state_dict": opt.state_dict(), "train_step": 10}, directory / name)
    else:
        torch.save(state, directory / name)
    return directory


# A tiny saved checkpoint and its report, built once per test session (tests/test_report.py,
# tests/test_browser.py).
TINY_REPORT = ["--set", "prompts.curve=48", "--set", "prompts.train=48", "--set", "prompts.val=24", "--set", "prompts.test=48",
        "--set", "prompts.induced=12", "--set", "probes.prompts=48", "--set", "probes.max_iter=10", "--set",
        "forgetting.prompts=16", "--set", "similarity.bootstrap=40"]


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    from probe.io.checkpoint import save_model
    from probe.models import build_model

    cfg = build_cfg(layers=3)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny-gpt2"
    save_model(build_model(cfg.model), cfg, path)
    return path


@pytest.fixture(scope="session")
def report(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep") / "r1"
    from probe.cli import main

    assert main(["-q", "report", str(ckpt), "--out", str(out), "--no-cache", *TINY_REPORT]) == 0
    return out
