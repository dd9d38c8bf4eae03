"""The docs gate of ``make test`` is real: a broken link in the docs fails it (issue 41)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _docs_build_command() -> list[str]:
    """The ``docs-build`` recipe of the Makefile, with ``$(BIN)`` as this interpreter's bin."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs-build:.*\n\t(.+)$", makefile, flags=re.MULTILINE)
    assert recipe is not None, "the Makefile has no docs-build recipe"
    line = recipe.group(1).replace("$(BIN)", str(Path(sys.executable).parent))
    return shlex.split(line)


def test_the_docs_build_recipe_shows_the_warnings_strict_mode_counts() -> None:
    # `--quiet` hides the warnings, and then `--strict` has nothing to abort on.
    command = _docs_build_command()
    assert "--strict" in command
    assert "--quiet" not in command
    assert "-q" not in command


def test_a_planted_broken_link_fails_the_docs_gate(tmp_path: Path) -> None:
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed (the dev extra installs it)")
    for name in ("docs", "pytorch_accel", "examples"):
        shutil.copytree(REPO_ROOT / name, tmp_path / name)
    shutil.copy(REPO_ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "quickstart.md"
    page.write_text(page.read_text() + "\nSee [nowhere](trainer.md#no-such-section-anywhere).\n")

    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [*_docs_build_command(), "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "no-such-section-anywhere" in output
    # The planted link is the only warning: the docs as committed build clean.
    assert "Aborted with 1 warnings in strict mode" in output, output
