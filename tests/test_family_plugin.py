"""A model family declared in one module outside probe/ (this file) runs through the quick report:
its class registers itself, owns its sizes, rules and random initialisation, and
nothing in probe/ names it."""

import json

import pytest
import torch
from conftest import TINY_REPORT, build_cfg
from torch import Tensor, nn

from probe.cli import main
from probe.core.errors import ConfigError
from probe.data.positions import x_positions
from probe.io.checkpoint import save_model
from probe.models import ModelOutput, build_model
from probe.models.base import ReadInOutModel
from probe.models.config import FAMILIES, ModelConfig
from probe.models.encoding import interleave
from probe.models.sizes import model_bytes

FAMILY = "prefix_mean"


class PrefixMeanICL(ReadInOutModel, nn.Module):
    """L residual layers h <- h + W_l mean(h_1..h_i) (a causal running mean), then the read-out."""

    family = FAMILY

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        super().check_config(cfg)
        if cfg.n_head != 1:
            raise ConfigError(f"a {FAMILY} model has no heads; set model.n_head = 1 (got {cfg.n_head})")

    @staticmethod
    def parameter_count(cfg: ModelConfig) -> int:
        return cfg.n_layer * (cfg.n_embd**2 + cfg.n_embd) + (cfg.token_dim + 1) * cfg.n_embd + cfg.n_embd + 1

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self._read_in = nn.Linear(cfg.token_dim, cfg.n_embd)
        self._layers = nn.ModuleList(nn.Linear(cfg.n_embd, cfg.n_embd) for _ in range(cfg.n_layer))
        self._read_out = nn.Linear(cfg.n_embd, 1)

    def run(self, xs: Tensor, ys: Tensor) -> ModelOutput:
        h = self._read_in(interleave(xs, ys, self.config.encoding))
        counts = torch.arange(1, h.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        resid = [h]
        for layer in self._layers:
            h = h + layer(h.cumsum(1) / counts)
            resid.append(h)
        return ModelOutput(pred=self.readout(h[:, x_positions(xs.shape[1])]), resid=resid, final=h)

    def forward(self, xs: Tensor, ys: Tensor) -> Tensor:
        return self.run(xs, ys).pred


@pytest.fixture
def family():
    FAMILIES.register(FAMILY)(PrefixMeanICL)
    yield PrefixMeanICL
    FAMILIES.unregister(FAMILY)


def test_family_declares_its_own_rules_and_sizes(family):
    cfg = build_cfg(FAMILY, heads=1).model
    model = build_model(cfg)
    assert isinstance(model, family) and model_bytes(cfg) == 4 * sum(p.numel() for p in model.parameters())
    with pytest.raises(ConfigError, match=f"a {FAMILY} model has no heads; set model.n_head = 1"):
        build_cfg(FAMILY, heads=2)
    with pytest.raises(ConfigError, match="model.attn_activation applies to the gpt2 family only"):
        ModelConfig(family=FAMILY, n_head=1, attn_activation="relu")


@pytest.mark.slow
def test_family_from_a_test_file_runs_the_quick_report(family, tmp_path):
    cfg = build_cfg(FAMILY, heads=1, layers=2)
    torch.manual_seed(0)
    save_model(build_model(cfg.model), cfg, tmp_path / "ckpt")
    out = tmp_path / "report"
    assert main(["-q", "report", str(tmp_path / "ckpt"), "--out", str(out), "--no-cache", *TINY_REPORT]) == 0
    from probe.reporting.schema import check_summary

    s = json.loads((out / "summary.json").read_text())
    check_summary(s)
    assert s["checkpoint"]["model"]["family"] == FAMILY and s["readout"]["layer"] == [0, 1, 2]
    assert s["probes"]["xty"]["linear"]["control_r2"]  # a fresh instance is its random-weights control
    assert "interventions" not in s["timings"]  # no hook points: the causal stage is left out, not failed
    assert FAMILY in (out / "index.html").read_text()


PLUGIN = '''
"""A model family shipped by another package: registered at import, found through the
icl_probe.families entry-point group; it names its capture back-end and its intervention runner."""
from probe.interventions.runner import RUNNERS, GPT2Runner
from probe.models.config import FAMILIES
from probe.models.gpt2 import GPT2ICL


class CountingRunner(GPT2Runner):
    made = 0

    def __init__(self, model, device):
        super().__init__(model, device)
        CountingRunner.made += 1


RUNNERS.register("counting")(CountingRunner)


@FAMILIES.register("gpt2_plugin")
class PluginGPT2(GPT2ICL):
    family = "gpt2_plugin"
    capture_backend = "hooked"
    intervention_runner = "counting"
'''


@pytest.fixture
def entry_point_family(tmp_path, monkeypatch):
    """A package on sys.path whose entry point (group icl_probe.families) is the module above."""
    import sys

    from probe.interventions.runner import RUNNERS

    (tmp_path / "icl_probe_plugin_family.py").write_text(PLUGIN)
    info = tmp_path / "icl_probe_plugin_family-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: icl-probe-plugin-family\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[icl_probe.families]\ngpt2_plugin = icl_probe_plugin_family\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = FAMILIES._loaded
    FAMILIES._loaded = False
    yield
    FAMILIES.unregister("gpt2_plugin")
    RUNNERS.unregister("counting")
    sys.modules.pop("icl_probe_plugin_family", None)
    FAMILIES._loaded = loaded


def test_a_family_from_an_entry_point_brings_its_back_end_and_runner(entry_point_family, tmp_path):
    """Nothing in probe/ names the family: the entry point registers it on first lookup, and its class
    picks the capture back-end and the intervention runner."""
    from probe.capture.backends import backend_for
    from probe.interventions.runner import runner_for

    assert "gpt2_plugin" in FAMILIES
    model = build_model(build_cfg("gpt2_plugin").model)
    assert type(model).__name__ == "PluginGPT2"
    assert type(backend_for(model, "auto", "cpu")).__name__ == "HookedBackend"
    runner = runner_for(model)
    assert type(runner).__name__ == "CountingRunner" and type(runner).made == 1


@pytest.mark.slow
def test_an_entry_point_family_runs_capture_a_smoke_report_and_an_intervention(entry_point_family, tmp_path):
    import probe

    cfg = build_cfg("gpt2_plugin", layers=2)
    torch.manual_seed(0)
    save_model(build_model(cfg.model).eval(), cfg, tmp_path / "ck")
    xs, ys = probe.prompts(tmp_path / "ck", 4)
    assert probe.activations(tmp_path / "ck", xs, ys).acts["resid"].shape[0] == 3  # layers + 1 boundaries
    argv = ["-q", "report", str(tmp_path / "ck"), "--recipe", "smoke", "--out", str(tmp_path / "r"), *TINY_REPORT]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["checkpoint"]["model"]["family"] == "gpt2_plugin" and "ablation" in summary["interventions"]
    assert not summary.get("not_measured")  # every stage ran: interventions through the plugin's runner
    import icl_probe_plugin_family

    assert icl_probe_plugin_family.CountingRunner.made >= 1
