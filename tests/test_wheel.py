"""The package works when installed as a wheel: build it from the project's own
files, install it into a fresh virtual environment, run the CLI from a directory outside the
repository. Dependencies come from the test environment through a .pth path entry, so nothing is
downloaded; the wheel's own `probe` shadows the editable install of the repository."""

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO, TINY_REPORT

pytestmark = pytest.mark.slow

SOURCES = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "probe", "analyses", "recipes",
           "checkpoints/gpt2-default/config.json", "checkpoints/gpt2-default/model.safetensors"]


def copy_sources(target: Path) -> None:
    for name in SOURCES:
        source, dest = REPO / name, target / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "_shipped"))
        else:
            shutil.copyfile(source, dest)


def run(*cmd, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, check=False, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    copy_sources(root / "src")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", root / "dist", root / "src", cwd=root)
    (wheel,) = (root / "dist").glob("icl_probe-*.whl")
    run(sys.executable, "-m", "venv", root / "venv", cwd=root)
    python = root / "venv" / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root).stdout.strip()
    Path(purelib, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return root / "venv" / "bin", elsewhere


def test_installed_wheel_is_the_package_imported(installed):
    bin_dir, cwd = installed
    where = run(bin_dir / "python", "-c", "import probe, probe.core.resources as r; "
                "print(probe.__file__); print(r.RECIPE_DIR); print(r.DEFAULT_CHECKPOINT)", cwd=cwd).stdout.split()
    assert all(str(bin_dir.parent) in line for line in where), where
    assert Path(where[1], "quick.toml").is_file() and Path(where[2], "model.safetensors").is_file()


def test_inspect_and_report_from_the_wheel(installed):
    bin_dir, cwd = installed
    out = run(bin_dir / "icl-probe", "inspect", "--json", "--prompts", "32", cwd=cwd).stdout
    assert '"format": "icl-probe"' in out and '"n_layer": 8' in out
    settings = [*TINY_REPORT, "--set", "probes.enabled=false", "--set", "interventions.enabled=false"]
    run(bin_dir / "icl-probe", "-q", "report", "--recipe", "quick", *settings, cwd=cwd)
    report = cwd / "runs" / "gpt2-default-quick"
    assert (report / "index.html").is_file() and (report / "summary.json").is_file()


def test_training_recipes_and_the_default_checkpoint_from_the_wheel(installed):
    """The wheel carries the training recipes: `train --recipe tiny` and the README's
    `--recipe recipes/tiny.toml` work outside a checkout; probe.default_checkpoint() is the wheel's copy."""
    bin_dir, cwd = installed
    for recipe, out in (("tiny", "run-a"), ("recipes/tiny.toml", "run-b")):
        run(bin_dir / "icl-probe", "-q", "train", "--recipe", recipe, "--set", "train.steps=3", "--out", out, cwd=cwd)
        assert (cwd / out / "model.safetensors").is_file()
    where = run(bin_dir / "python", "-c", "import probe; print(probe.default_checkpoint())", cwd=cwd).stdout.strip()
    assert str(bin_dir.parent) in where and Path(where, "config.json").is_file()
