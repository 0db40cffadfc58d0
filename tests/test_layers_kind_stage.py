"""A stage of the layers kind is one module: a class written here, outside probe/, it reads the layers'
induced weights (Fu et al. 2024, eq. 11-12; the induced stage's) through `needs`, writes its block and
adds a row to the evidence table, and its cache key holds the induced stage's, so that changing its
own settings re-runs it alone. The instrument (each layer's induced weights against the least-squares
weights of the same prompts) is checked against numpy's lstsq on the induced prompts."""

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from probe.cli import main
from probe.core.config import Section, setting
from probe.core.stages import AnalysisStage, StageTables, register_stage, unregister_stage

OFF = ["probes", "forgetting", "order", "token_probes", "ood", "steering", "interventions"]
INSTRUMENT = "distance to least squares (plugin)"


@dataclass
class OlsGapSettings(Section):
    SECTION = "ols_gap"
    enabled: bool = setting(True, "compare each layer's induced weights with least squares")
    examples: int = setting(0, "examples before the query (0: every example but the last)", minimum=0)


@dataclass
class OlsGapBlock:
    """Mean over the induced prompts of |w_layer - w_ols|^2 / |w_ols|^2 per layer boundary."""

    layer: list[int]
    gap: list[float]
    examples: int


def ols_weights(xs: np.ndarray, ys: np.ndarray, t: int) -> np.ndarray:
    """Least-squares weights (m, d) of each prompt's first t examples (minimum-norm below d)."""
    return np.stack([np.linalg.lstsq(x[:t], y[:t], rcond=None)[0] for x, y in zip(xs, ys)])


class OlsGap(AnalysisStage):
    """Each layer's induced weights against the least-squares weights of the same prompts."""

    name = "ols_gap"
    settings = OlsGapSettings
    block = OlsGapBlock
    title = "Induced weights against least squares"
    description = "Each layer's induced weights against the least-squares weights of the same prompts."
    reads = ("similarity",)
    needs = ("induced",)  # it reads the induced weights SimW fits there

    def run(self, c):
        from probe.analysis.pipeline import InducedWeights

        induced = InducedWeights.from_arrays(lambda name: c.before(name, "data"))
        if induced is None:  # SimW off: no weights were induced
            return StageTables()
        n = induced.xs.shape[1]
        t = c.recipe.ols_gap.examples or n - 1
        w_ols = ols_weights(induced.xs, induced.ys, t)
        layer_w = induced.weights[:, :, t]  # (L+1, m, d): the weights read with t examples before the query
        gap = ((layer_w - w_ols) ** 2).sum(-1) / (w_ols**2).sum(-1)
        table = pd.DataFrame({"layer": range(len(gap)), "gap": gap.mean(1)})
        return StageTables({"ols_gap": table}, {"ols_gap_examples": t})

    def summarise(self, t, recipe):
        if "ols_gap" not in t:
            return None
        return OlsGapBlock(t["ols_gap"].layer.tolist(), t["ols_gap"].gap.tolist(), int(t.data["ols_gap_examples"]))

    def evidence(self, block, summary, a, b):
        if block is None or (a, b) != ("newton", "gd"):
            return []
        return [
            {
                "instrument": INSTRUMENT,
                "favours": None,
                "effect": f"last layer {block.gap[-1]:.3g} of |w_ols|^2 from least squares at {block.examples} examples",
                "status": "unvalidated here",
            }
        ]


OLS_GAP = OlsGap()


@pytest.fixture
def registered():
    register_stage(OLS_GAP)
    yield OLS_GAP
    unregister_stage(OLS_GAP.name)


def _report(ckpt, out, cache, *extra):
    sets = [arg for name in OFF for arg in ("--set", f"{name}.enabled=false")]
    args = ["-q", "report", str(ckpt), "--recipe", "smoke", "--out", str(out), "--cache-dir", str(cache)]
    return main([*args, "--set", "similarity.simw=true", *sets, *extra])


@pytest.mark.slow
def test_a_layers_kind_stage_from_a_test_file_reads_induced_weights_and_adds_evidence(registered, ckpt, tmp_path):
    from probe.analysis.pipeline import InducedWeights
    from probe.io.formats import load_checkpoint
    from probe.reporting.build import run_stages
    from probe.reporting.cache import StageCache
    from probe.reporting.recipe import resolve_recipe

    cache = tmp_path / "cache"
    assert _report(ckpt, tmp_path / "a", cache) == 0
    data = json.loads((tmp_path / "a" / "summary.json").read_text())
    block = data["ols_gap"]
    assert block["layer"] == list(range(len(data["readout"]["layer"]))) and block["examples"] > 0
    newton_gd = next(q for q in data["evidence"] if (q["a"], q["b"]) == ("newton", "gd"))
    row = next(r for r in newton_gd["rows"] if r["instrument"] == INSTRUMENT)
    assert row["status"] == "unvalidated here" and row["favours"] is None
    assert INSTRUMENT in (tmp_path / "a" / "index.html").read_text()

    # the numbers: numpy's lstsq on the very prompts and weights the induced stage induced
    recipe = resolve_recipe("smoke", [{"similarity": {"simw": True}}])
    built = run_stages(load_checkpoint(ckpt), recipe, "cpu", StageCache(cache), False, only={"induced"})
    induced = InducedWeights.from_arrays(built.data.get)
    t = block["examples"]
    w = np.stack([np.linalg.pinv(x[:t]) @ y[:t] for x, y in zip(induced.xs, induced.ys)])
    expected = ((induced.weights[:, :, t] - w) ** 2).sum(-1) / (w**2).sum(-1)
    np.testing.assert_allclose(block["gap"], expected.mean(1), rtol=1e-6)

    # its own setting changed: the induced weights (and the layers) come from the cache, this one runs again
    assert _report(ckpt, tmp_path / "b", cache, "--set", "ols_gap.examples=2") == 0
    again = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert {"induced", "layers"} <= set(again["cached_stages"]) and "ols_gap" not in again["cached_stages"]
    assert again["ols_gap"]["examples"] == 2 and again["ols_gap"]["gap"] != block["gap"]


@pytest.mark.slow
def test_a_plugin_stages_evidence_row_is_in_a_studys_evidence_as_in_a_report(ckpt, tmp_path, monkeypatch):
    """A study's evidence is the report's own summary of the stages it ran (every stage's `evidence`
    hook), so the plugin stage's row, named in the study's analyses through its `study_rows`, is in
    study.csv beside the layers' rows, with the consolidated answer of a report on the same model."""
    rows = lambda t: [{"metric": "ols_gap", "value": r.gap, "layer": int(r.layer)} for r in t["ols_gap"].itertuples()]
    stage = OLS_GAP.replace(study_rows=rows)
    register_stage(stage)
    try:
        (tmp_path / "s.toml").write_text(
            f'description = "gap"\ncheckpoints = ["{ckpt}"]\nanalyses = ["heatmap", "ols_gap", "evidence"]\n'
            'x = "family"\nreport = "smoke"\n[set]\n"similarity.simw" = true\n'
        )
        monkeypatch.chdir(tmp_path)
        assert main(["-q", "study", "s.toml", "--out", "out"]) == 0
        table = pd.read_csv(tmp_path / "out" / "study.csv")
        evidence = table[(table.analysis == "evidence") & (table.metric == "newton_vs_gd")]
        assert INSTRUMENT in set(evidence.learner) and evidence[evidence.learner == INSTRUMENT].value.item() == 0
        assert len(table[table.analysis == "ols_gap"]) == table[table.analysis == "ols_gap"].layer.nunique() > 1
        assert _report(ckpt, tmp_path / "r", tmp_path / "cache") == 0
        report = json.loads((tmp_path / "r" / "summary.json").read_text())
        newton_gd = next(q for q in report["evidence"] if (q["a"], q["b"]) == ("newton", "gd"))
        assert [r["instrument"] for r in newton_gd["rows"]] == list(evidence.learner[:-1])
        side = {"newton": 1.0, "gd": -1.0}
        assert evidence[evidence.learner == "consolidated answer"].value.item() == side.get(newton_gd["answer"], 0.0)
    finally:
        unregister_stage(stage.name)
