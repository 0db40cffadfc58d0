"""Package hygiene: no import cycles inside probe/."""

import ast
import json
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = Path(__file__).resolve().parents[1] / "probe"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> probe modules it imports (top level or inside functions). A package's own
    `__init__` re-exporting its submodules is not counted as the package depending on them."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            for alias in node.names:
                found = f"{target}.{alias.name}" if f"{target}.{alias.name}" in paths else target
                if found in paths and not (path.name == "__init__.py" and found.startswith(name + ".")):
                    graph[name].add(found)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w.startswith(v + ".") or v.startswith(w + "."):
                continue  # a package and its own submodules
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    graph = import_graph()
    assert "probe.io.checkpoint" in graph["probe.io.formats"]  # the graph sees real edges
    assert cycles(graph) == []


def test_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_module_docstring_examples_run_as_doctests():
    """Every `>>>` example in the package's docstrings runs and prints what it says."""
    import doctest
    import importlib

    import probe

    root = Path(probe.__file__).parent
    tried = 0
    for path in sorted(root.rglob("*.py")):
        name = ".".join(("probe", *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        if name == "probe.__main__":
            continue
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
        tried += result.attempted
    assert tried >= 2


def test_the_first_quick_start_command_leaves_the_checkout_clean():
    """A bare `icl-probe report` writes to runs/<checkpoint>-<recipe>/, which git ignores, so the
    README's first command never overwrites the committed example reports."""
    import subprocess

    from probe.cli.report import REPORTS

    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    path = REPORTS / "gpt2-default-quick" / "index.html"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], check=False, cwd=REPO)
    assert ignored.returncode == 0, f"{path} would be tracked by git"


@pytest.mark.slow
def test_the_readme_python_api_block_runs_as_written(tmp_path, monkeypatch):
    """The guide's "Python API" (docs/guide/reference.md): the block runs unchanged (from a working
    directory that has the checkout's checkpoints/, as the repository root does) and its results
    have the shapes it says."""
    text = (REPO / "docs" / "guide" / "reference.md").read_text()
    section = text[text.index("## Python API") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    block = block[: block.index("```\n")]
    (tmp_path / "checkpoints").symlink_to(REPO / "checkpoints")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "docs/guide/reference.md (Python API)", "exec"), scope)  # noqa: S102 (the README, as a user runs it)
    assert scope["acts"].acts["resid"].shape == (9, 64, 32, 64)
    assert scope["H"].shape == (64, 16, 64) and scope["Y"].shape == (64, 4)
    assert scope["newton"].preds.shape == (25, 64, 16)
    assert {"sweep", "layer", "k", "similarity"} <= set(scope["layers"].best.columns)
    assert scope["report"].summary["verdicts"] and (tmp_path / "runs" / "python-smoke" / "index.html").is_file()
    assert {Path(m).name for m in scope["table"].model} == {"gpt2-relu3", "gpt2-relu4"}


def test_the_readme_summary_json_block_reads_a_committed_report(monkeypatch):
    """The guide's "summary.json" (docs/guide/reference.md): reading a committed report back as a
    typed Summary, as written."""
    text = (REPO / "docs" / "guide" / "reference.md").read_text()
    section = text[text.index("## summary.json") :]
    block = section[section.index("```python\n") + len("```python\n") :]
    block = block[: block.index("```\n")]
    monkeypatch.chdir(REPO)
    scope: dict = {}
    exec(compile(block, "docs/guide/reference.md (summary.json)", "exec"), scope)  # noqa: S102
    written = json.loads((REPO / "reports/gpt2-default-quick/summary.json").read_text())
    assert scope["summary"].best_match["newton"]["sime"].k == written["best_match"]["newton"]["sime"]["k"]
    assert scope["summary"].to_json() == written


def test_git_commit_is_dirty_for_code_changes_but_not_for_regenerated_reports(tmp_path):
    import subprocess

    from probe.core.provenance import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "summary.json").write_text("{}")
    evaluations = [
        tmp_path / "checkpoints" / "m" / kind / "icl_error.csv"
        for kind in ("eval", "eval-shift-noisy", "eval-points-32")
    ]
    for path in evaluations:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("n\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    head = git_commit(tmp_path)
    assert len(head) == 40
    (tmp_path / "reports" / "summary.json").write_text('{"a": 1}')
    assert git_commit(tmp_path) == head  # a regenerated example report does not make the tree dirty
    for path in evaluations:  # nor do the checkpoints' regenerated evaluations (the script's first job)
        path.write_text("n\n1\n")
    assert git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == head + "-dirty"


def test_the_first_set_up_layer_holds_every_package_probe_imports():
    """`scripts/setup.sh` without --dev installs [project.dependencies] only: every third-party
    module probe/ imports (at the top or inside a function) must come from one of them, not from the
    test or docs extras; and the script refuses an option it does not know."""
    import importlib.metadata
    import re
    import subprocess
    import sys
    import tomllib

    declared = {
        re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-")
        for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    owners = importlib.metadata.packages_distributions()
    imported: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "probe" and m != "__future__"}
    missing = {
        m: owners.get(m) for m in third_party if not {o.lower().replace("_", "-") for o in owners.get(m, [])} & declared
    }
    assert missing == {}
    setup = [str(REPO / "scripts" / "setup.sh"), "--devv"]
    run = subprocess.run(["bash", *setup], check=False, capture_output=True, text=True)
    assert run.returncode == 2 and "unknown option '--devv' (use --dev or --with-browser)" in run.stderr


@pytest.mark.slow
def test_importing_probe_makes_openmp_waits_passive_unless_chosen_or_too_late():
    """probe/core/omp.py: idle OpenMP threads sleep instead of spinning (set before torch loads its
    runtime); a policy the user set is kept, and nothing is set once torch is already loaded."""
    import os
    import subprocess
    import sys

    show = "import os, sys; {} import probe; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def policy(code: str, **extra: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", show.format(code)],
            env={**env, **extra},
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        return run.stdout.strip()

    assert policy("") == "PASSIVE"
    assert policy("", OMP_WAIT_POLICY="active") == "active"
    assert policy("import torch;") == "None"


def test_usable_cpus_follow_the_affinity_mask():
    """Study workers split the CPUs the process may use, not the machine's count."""
    import os

    from probe.core.omp import usable_cpus

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no affinity API on this platform")
    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert usable_cpus() == 1
    finally:
        os.sched_setaffinity(0, mask)
    assert usable_cpus() <= len(mask)


def test_progress_bars_are_plain_text_without_ipywidgets(monkeypatch):
    """tqdm.auto without ipywidgets warns in every notebook cell (TqdmWarning with a machine path);
    probe/core/progress.py picks the text bar then."""
    import importlib.util

    import tqdm.std

    from probe.core import progress

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert progress._choose() is tqdm.std.tqdm
