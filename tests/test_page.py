"""The report page's first screen and tables: the answer block (probe/reporting/answer.py) from
hand-built evidence and spectral blocks, table cells (numbers right, prose left, a missing value in
words), one layer numbering in the ablation table, and a re-render from the report's own files."""

import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from probe.reporting.answer import answer, layer_groups
from probe.reporting.page import table
from probe.reporting.schema import EvidenceQuestion, EvidenceRow

BOX = {"boxes": [{"words": "d 4-8, kappa 1, at least 64 prompts"}]}


def _spectral(verdicts, p):
    n = len(verdicts)
    return SimpleNamespace(
        status="answered",
        reason="",
        layer=list(range(n)),
        verdict=verdicts,
        p=p,
        p_low=[None if v is None else v - 0.1 for v in p],
        p_high=[None if v is None else v + 0.1 for v in p],
    )


def test_layer_groups_join_adjacent_layers_with_one_verdict_and_quote_each_exponent():
    sp = _spectral(
        ["no response", "no response", "gd", "gd", "precond_gd not separable from gd", "converged", "gd"],
        [None, None, 1.0, 1.2, 1.9, 0.5, 1.1],
    )
    groups = [(g.layers, g.looks_like, g.exponent) for g in layer_groups(sp)]
    assert groups == [
        ("0-1", "no response (predicts ~0, or does not follow least squares)", ""),
        ("2-3", "first-order class (GD)", "2: 1.00 [0.90, 1.10]; 3: 1.20 [1.10, 1.30]"),
        (
            "4",
            "Iterative Newton class (M_0 = alpha S), not separated from the first-order class (GD)",
            "1.90 [1.80, 2.00]",
        ),
        ("5", "converged (r ~ 1 at every eigenvalue: any class that converges fits)", ""),  # no exponent quoted
        ("6", "first-order class (GD)", "1.10 [1.00, 1.20]"),  # not joined with 2-3: not adjacent
    ]
    assert layer_groups(None) == []
    off = SimpleNamespace(status="not measured", reason="no induced weights (similarity.simw = false)")
    assert [g.looks_like for g in layer_groups(off)] == ["not measured here: no induced weights (similarity.simw = false)"]


def test_an_answer_names_the_validated_instruments_that_decided_it_and_their_domain():
    rows = [
        EvidenceRow("spectral filter", "gd", "...", validated_on="planted GD", domain=BOX),
        EvidenceRow("Table 1 SimE", "gd", "..."),  # not validated: never a decider
        EvidenceRow("causal map", None, "...", validated_on="shifted maps"),
    ]
    q = EvidenceQuestion("newton", "gd", rows, "gd", "gd (validated evidence: spectral filter)")
    a = answer(q)
    assert (a.question, a.answer, a.decided_by) == ("Iterative Newton or GD?", "gd", "spectral filter")
    assert a.holds_in == "spectral filter: d 4-8, kappa 1, at least 64 prompts"


def test_an_undecided_answer_says_which_instruments_could_not_decide_and_which_lie_outside():
    rows = [
        EvidenceRow("spectral filter", "gd", "...", validated_on="planted GD", status="unvalidated here",
                    outside="kappa = 100", domain=BOX),
        EvidenceRow("causal map", None, "...", validated_on="shifted maps"),
    ]
    words = "undecided by validated evidence; unvalidated instruments suggest gd (spectral filter)"
    a = answer(EvidenceQuestion("newton", "gd", rows, None, words))
    assert a.answer == words and a.holds_in == "-"
    assert a.decided_by == (
        "no validated instrument decides (validated and undecided: causal map); outside their known answers "
        "here: spectral filter (outside: kappa = 100)"
    )


def test_table_cells_align_numbers_right_and_write_a_missing_value_as_its_meaning():
    frame = pd.DataFrame(
        {"boundary": [2, 4], "exponent": ["0.66 [0.51, 0.84]", "-"], "consistency": [1.5, float("nan")],
         "verdict": ["neither map confirmed", "closer"]}
    )
    frame.attrs["missing"] = {"consistency": "- (expected below the noise floor)"}
    html = table(frame)
    cells = re.findall(r"<td( class=\"num\")?>([^<]*)</td>", html)
    assert cells == [
        (' class="num"', "2"), (' class="num"', "0.66 [0.51, 0.84]"), (' class="num"', "1.5000"),
        ("", "neither map confirmed"),
        (' class="num"', "4"), ("", "-"), ("", "- (expected below the noise floor)"), ("", "closer"),
    ]
    assert "NaN" not in table(pd.DataFrame({"x": [float("nan")]}))  # elsewhere: "-"


def test_the_page_opens_on_the_answer_block_and_numbers_ablated_layers_as_boundaries(report):
    html = (report / "index.html").read_text()
    assert html.index('<section id="answer"') < html.index('<section id="findings"') < html.index("<figure>")
    assert "What the layers look like" in html and "NaN" not in html
    n_layer = 3  # the session's tiny model (conftest.build_cfg(layers=3))
    ablation = html[html.index("layer whose update is removed") :].split("</table>")[0]
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>", ablation)
    assert rows == [(str(block + 1), str(block)) for block in range(n_layer)]


@pytest.mark.slow
def test_a_report_re_renders_from_its_own_files_to_the_same_page(ckpt, report, tmp_path):
    from probe.reporting.rerender import rerender_report

    copy = tmp_path / "r"
    shutil.copytree(report, copy)
    (copy / "index.html").write_text("stale")
    rerender_report(copy, checkpoint=ckpt)
    assert (copy / "index.html").read_text() == (report / "index.html").read_text()
    assert sorted(p.name for p in (copy / "figures").iterdir()) == sorted(p.name for p in (report / "figures").iterdir())


def test_re_rendering_refuses_another_checkpoint(report, tmp_path):
    from conftest import REPO

    from probe.core.errors import ConfigError
    from probe.reporting.rerender import rerender_report

    copy = tmp_path / "r"
    shutil.copytree(report, copy)
    with pytest.raises(ConfigError, match="is not the report's checkpoint this report was made from"):
        rerender_report(copy, checkpoint=REPO / "checkpoints" / "gpt2-default")
    assert (copy / "index.html").read_text() == (report / "index.html").read_text()  # nothing half-written


def test_re_rendering_refuses_a_folder_icl_probe_did_not_write(report, tmp_path):
    """Re-rendering replaces figures/: a folder without the report's output marker is refused and
    its figures are left as they are."""
    from probe.core.errors import ConfigError
    from probe.reporting.rerender import rerender_report

    copy = tmp_path / "r"
    shutil.copytree(report, copy)
    (copy / ".icl-probe-output.json").unlink()
    before = sorted(p.name for p in (copy / "figures").iterdir())
    with pytest.raises(ConfigError, match="was not written by `icl-probe report`"):
        rerender_report(copy)
    assert sorted(p.name for p in (copy / "figures").iterdir()) == before


def test_the_methods_list_the_papers_whose_methods_the_report_ran(report):
    """Each stage that ran names its papers (AnalysisStage.papers); the methods list each once."""
    import json

    from probe.core.stages import registered
    from probe.reporting.html import papers_run
    from probe.reporting.schema import Summary

    summary = Summary.from_json(json.loads((report / "summary.json").read_text()))
    papers = papers_run(summary)
    assert papers[:3] == [  # the error curve first (report order), then the layers stage
        "Garg et al. 2022: the error against the number of in-context examples",
        "Wu et al. 2024, App. G: R^2 beside training the task's network directly (ReLU-network tasks)",
        "Fu et al. 2024, §4.1: per-layer read-out retraining",
    ]
    assert len(papers) == len(set(papers)) and registered()["probes"].papers[0] in papers
    methods = (report / "index.html").read_text().split('<section id="methods">')[1]
    assert "The papers whose methods this report ran" in methods and "Hataya &amp; Imaizumi 2024, Discussion" in methods


def _tiny(path, d, seed, layers=2, points=8):
    from conftest import build_cfg

    from probe.io.checkpoint import save_model
    from probe.models import build_model

    torch.manual_seed(seed)
    cfg = build_cfg(d=d, layers=layers, points=points)
    save_model(build_model(cfg.model).eval(), cfg, path)
    return path


@pytest.mark.slow
def test_compare_reports_pair_one_task_and_set_different_d_side_by_side(ckpt, tmp_path):
    """`report --compare`: the same task gives the paired error difference over the same prompts
    (checked against the two models' own error curves); another d gives each model's answers and
    layers by relative depth, and no paired table."""
    from conftest import TINY_REPORT

    from probe.cli import main

    same, other_d = _tiny(tmp_path / "same", 3, seed=5, layers=3), _tiny(tmp_path / "d4", 4, seed=6, layers=2, points=12)
    for name, other in (("paired", same), ("apart", other_d)):
        argv = ["-q", "report", str(ckpt), "--compare", str(other), "--out", str(tmp_path / name), "--no-cache",
                "--recipe", "smoke", *TINY_REPORT]
        assert main(argv) == 0, name
    paired = json.loads((tmp_path / "paired" / "summary.json").read_text())["compare"]
    assert paired["same_task"] and [r["n_examples"] for r in paired["paired_error"]] == [3, 7]
    diff = pd.read_csv(tmp_path / "paired" / "data" / "comparison_paired.csv")
    mine = pd.read_csv(tmp_path / "paired" / "data" / "icl_error.csv")
    theirs = pd.read_csv(tmp_path / "paired" / "data" / "compare_icl_error.csv")
    np.testing.assert_allclose(diff.difference, mine.model - theirs.model, atol=1e-9)  # same prompts, paired
    assert (diff.ci_low <= diff.difference).all() and (diff.difference <= diff.ci_high).all()
    by_layer = pd.read_csv(tmp_path / "paired" / "data" / "comparison_paired_layers.csv")
    at = lambda f: f[f.n_examples == 7].sort_values("layer").error.to_numpy()  # each read-out table's 2d+1 row
    mine_r, theirs_r = pd.read_csv(tmp_path / "paired" / "data" / "readout.csv"), pd.read_csv(
        tmp_path / "paired" / "data" / "compare_readout.csv"
    )
    assert list(by_layer.layer_a) == list(by_layer.layer_b) == [0, 1, 2, 3]  # one depth: layer against layer
    np.testing.assert_allclose(by_layer["error tiny-gpt2"], at(mine_r), rtol=1e-9)  # the read-out tables' prompts
    np.testing.assert_allclose(by_layer["error same"], at(theirs_r), rtol=1e-9)
    np.testing.assert_allclose(by_layer.difference, at(mine_r) - at(theirs_r), rtol=1e-9)
    assert "Layer against layer on the same prompts" in (tmp_path / "paired" / "index.html").read_text()
    apart = json.loads((tmp_path / "apart" / "summary.json").read_text())["compare"]
    assert not apart["same_task"] and "paired_error" not in apart and set(apart["evidence"]) <= {"newton vs gd"}
    layers = pd.read_csv(tmp_path / "apart" / "data" / "comparison_layers.csv")
    assert layers.groupby("model").layer.max().to_dict() == {"tiny-gpt2": 3, "d4": 2}
    assert layers["relative depth"].between(0, 1).all() and set(layers.examples) == {7, 9}  # each model's own 2d+1
    page = (tmp_path / "apart" / "index.html").read_text()
    assert "Comparison with d4" in page and "no prompt fits both" in page
