"""Build step only (metadata lives in pyproject.toml): a wheel carries the shipped analysis and
training recipes and
the default checkpoint in probe/_shipped/, where probe/core/resources.py finds them after
`pip install .`. Editable installs read the repository's own files and copy nothing."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_FILES = [*sorted((ROOT / "analyses").glob("*.toml")),
                 *sorted((ROOT / "recipes").glob("*.toml")),
                 ROOT / "checkpoints" / "gpt2-default" / "config.json",
                 ROOT / "checkpoints" / "gpt2-default" / "model.safetensors"]


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for source in SHIPPED_FILES:
            target = Path(self.build_lib) / "probe" / "_shipped" / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


setup(cmdclass={"build_py": BuildWithShippedFiles})
