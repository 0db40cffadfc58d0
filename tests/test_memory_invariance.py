"""Numbers do not depend on the memory budget: a report whose every chunk and batch is
one prompt and whose streams spill to disk equals, byte for byte, the report made with the
machine's default budget (summary.json apart from its timings and creation time, every table and
every figure)."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_REPORT

from probe.cli import main
from probe.core.memory import MemoryBudget

VOLATILE = ("timings", "created")


def _summary(path):
    data = json.loads((path / "summary.json").read_text())
    return {k: v for k, v in data.items() if k not in VOLATILE}


@pytest.mark.slow
def test_a_report_is_byte_identical_under_a_starved_memory_budget(ckpt, report, tmp_path, monkeypatch):
    monkeypatch.setattr(MemoryBudget, "headroom", lambda self: 1)  # every batch and chunk one prompt, streams on disk
    out = tmp_path / "starved"
    assert main(["-q", "report", str(ckpt), "--out", str(out), "--no-cache", "--max-memory", "64M", *TINY_REPORT]) == 0
    assert _summary(out) == _summary(report)
    files = sorted(p.relative_to(report) for p in report.rglob("*") if p.is_file() and p.name != "summary.json")
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and p.name != "summary.json")
    different = [str(f) for f in files if (report / f).read_bytes() != (out / f).read_bytes()]
    assert different == []


def test_linear_rows_do_not_depend_on_how_many_rows_share_the_call():
    # MKL takes other kernels for a call's tail rows and for calls of under 12 rows (probe/models/linear.py)
    import torch

    from probe.models.linear import StableLinear, padded_rows

    g = torch.Generator().manual_seed(0)
    for n_in, n_out, dtype in ((256, 1, torch.float32), (16, 48, torch.float32), (16, 48, torch.float64)):
        layer = StableLinear(n_in, n_out).to(dtype)
        x = torch.randn(160, n_in, generator=g, dtype=dtype)
        with torch.no_grad():
            full = layer(x)
            assert all(torch.equal(layer(x[:m]), full[:m]) for m in range(1, 70))
            assert torch.allclose(full, x @ layer.weight.t() + layer.bias, rtol=1e-5, atol=1e-5)
    assert [padded_rows(m) for m in (1, 12, 16, 17, 41, 44)] == [16, 16, 16, 20, 44, 44]
