"""The documentation reads its numbers from the committed reports, and summary.json has a
published JSON Schema that every committed report satisfies."""

from __future__ import annotations

import ast
import importlib.util
import json
import re

import jsonschema
import pytest
from conftest import REPO

from probe.reporting.json_schema import json_schema

MACRO = re.compile(r"\{\{\s*(number|table1|verdict)\((.*?)\)\s*\}\}", re.DOTALL)


def _macros():
    spec = importlib.util.spec_from_file_location("docs_macros", REPO / "docs" / "macros.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quoted():
    for page in sorted((REPO / "docs").glob("*.md")):
        for name, args in MACRO.findall(page.read_text()):
            yield page.name, name, ast.literal_eval(f"({args},)")


def test_every_quoted_number_is_the_reports_own():
    macros, seen = _macros(), 0
    for _page, name, args in _quoted():
        text = getattr(macros, name)(*args)  # raises on a path the report does not have
        if name == "number":
            report, path, *fmt = args
            value = json.loads((REPO / "reports" / report / "summary.json").read_text())
            for key in path.split("."):
                value = value[int(key)] if isinstance(value, list) else value[key]
            assert text == (format(value, fmt[0] if fmt else ".3f") if isinstance(value, float | int) else str(value))
        seen += 1
    assert seen >= 10


def test_a_quoted_path_the_report_lacks_fails_the_build():
    with pytest.raises(KeyError):
        _macros().number("gpt2-default-quick", "table1.sime.no_such_learner.similarity")


def test_the_published_schema_is_the_generated_one_and_every_report_satisfies_it():
    schema = json_schema()
    assert json.loads((REPO / "probe" / "reporting" / "summary.schema.json").read_text()) == schema
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    reports = [p for p in sorted((REPO / "reports").glob("*/summary.json")) if "checkpoint" in json.loads(p.read_text())]
    assert len(reports) >= 10
    for path in reports:
        errors = [e.message for e in validator.iter_errors(json.loads(path.read_text()))]
        assert errors == [], (path, errors[:3])
    summary = json.loads(reports[0].read_text())
    summary["table1"]["sime"]["gd"]["similarty"] = 1.0  # a misspelt key
    assert not validator.is_valid(summary)
    summary = json.loads(reports[0].read_text())
    summary["readout"]["error"][0] = "0.1"  # a number written as a string
    assert not validator.is_valid(summary)


def test_the_readme_is_a_landing_page_whose_numbers_are_the_reports():
    import subprocess
    import sys

    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert text.count("<!-- n:") >= 8
    check = subprocess.run(
        [sys.executable, "scripts/readme_numbers.py", "--check"], check=False, cwd=REPO, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout
    for link in re.findall(r"\]\(((?:docs|reports)/[^)]+)\)", text):  # every page and figure it links to exists
        assert (REPO / link).is_file(), link


def test_a_changed_quote_is_caught(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_numbers", REPO / "scripts" / "readme_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    quoted = "<!-- n:gpt2-default-quick:table1.sime.gd.similarity:.3f -->0.111<!-- /n -->"
    assert module.render(quoted) != quoted
    assert module.MARKER.search(module.render(quoted))[4] == module.value("gpt2-default-quick", "table1.sime.gd.similarity", ".3f")


def test_a_fresh_report_is_strict_json_and_satisfies_the_schema(report):
    """The session's freshly written tiny report: no NaN / Infinity constants, and the schema holds."""
    from probe.core.errors import ConfigError
    from probe.reporting.schema import Summary, check_summary

    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")

    data = json.loads((report / "summary.json").read_text(), parse_constant=refuse)
    check_summary(data)
    assert Summary.from_json(data).checkpoint.name == data["checkpoint"]["name"]
    data["table1"]["sime"]["gd"]["similarity"] = "high"
    with pytest.raises(ConfigError, match=r"summary.json does not match its schema at table1/sime/gd/similarity: 'high'"):
        Summary.from_json(data)


@pytest.mark.slow
@pytest.mark.slow
def test_the_quick_start_notebook_ends_on_the_evidence_and_the_layers_filters_and_warns_nothing():
    """The first example a reader sees (docs/notebooks/quickstart.ipynb, executed when the docs are
    built): its cells run in order without a warning (tqdm's IProgress warning showed a machine path
    in every cell); its probe decodes (leave-one-out R^2 > 0.5), and it ends on the answer: the
    evidence table, then the spectral class and exponent of every layer."""
    import warnings

    notebook = json.loads((REPO / "docs" / "notebooks" / "quickstart.ipynb").read_text())
    cells = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    namespace: dict = {}
    values = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for source in cells:
            tree = ast.parse(source)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, "<cell>", "exec"), namespace)  # noqa: S102 (the notebook is this repository's own)
            values.append(eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace) if last else None)
    probe_r2, evidence, layers = values[-3:]
    assert probe_r2 > 0.5
    assert {"Table 1 SimE", "spectral filter", "consolidated answer"} <= set(evidence.instrument)
    assert layers.layer.tolist() == list(range(9)) and layers.verdict.notna().all()  # every layer of gpt2-default


def test_user_facing_text_cites_papers_by_author_and_never_by_tracker_or_seed_file():
    """The README, docs, recipes, templates and probe/ (help strings, report text, docstrings) cite
    papers by author and year: never the specification's file names ("seed 003", "the seeds'
    Newton") nor tracker numbers ("issue 57")."""
    import re

    pattern = re.compile(r"seeds'|\bseed 00\d|\bissue \d{2}", re.IGNORECASE)
    roots = ["README.md", "docs", "analyses", "recipes", "probe"]
    suffixes = {".md", ".py", ".toml", ".j2", ".ipynb", ".yml"}
    found = []
    for root in roots:
        path = REPO / root
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if f.is_file() and f.suffix in suffixes:
                for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line):
                        found.append(f"{f.relative_to(REPO)}:{i}: {line.strip()[:80]}")
    assert found == [], "\n".join(found)


def test_the_site_link_check_names_directory_and_missing_links(tmp_path):
    """scripts/check_site_links.py (run by scripts/build_docs.sh): a link to a directory (file://
    shows a listing) or to a missing file is named; files, anchors and external links pass."""
    import subprocess
    import sys

    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "method.html").write_text('<a href="../index.html#top">home</a>')
    (tmp_path / "index.html").write_text(
        '<a href="guide/method.html">ok</a><a href="#x">anchor</a><a href="https://example.org/">out</a>'
        '<img src="figures/a.png"><a href="guide/">dir</a>'
    )
    run = lambda: subprocess.run([sys.executable, str(REPO / "scripts" / "check_site_links.py"), str(tmp_path)],
                                 check=False, capture_output=True, text=True)
    out = run()
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "index.html: figures/a.png (missing)",
        "index.html: guide/ (a directory: opened from disk it lists files)",
    ]
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "a.png").write_bytes(b"")
    (tmp_path / "index.html").write_text('<a href="guide/method.html">ok</a><img src="figures/a.png">')
    assert run().returncode == 0
    import yaml

    conf = yaml.safe_load((REPO / "mkdocs.yml").read_text().split("plugins:")[0])
    assert conf["use_directory_urls"] is False  # links name files, so the site opens from disk
