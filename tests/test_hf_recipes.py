"""The recipes of docs/hf-models.md run as they stand, in a fresh process.

Each code block after a ``<!-- recipe: NAME -->`` marker is a complete script (tiny models
built from configs, never downloaded): run in a temporary working directory, it must finish
without error (its own assertions included).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "hf-models.md"
RECIPE = re.compile(r"<!-- recipe: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)

pytest.importorskip("peft")
pytest.importorskip("transformers")


WRITES = {  # what each recipe leaves in its working directory
    "peft-save-memory": "adapter/adapter_model.safetensors",
    "load-and-card": "states/final/README.md",
}


def recipes() -> dict[str, str]:
    return dict(RECIPE.findall(PAGE.read_text()))


def test_the_page_has_its_recipes() -> None:
    assert set(recipes()) == set(WRITES)


@pytest.mark.parametrize("name", sorted(recipes()))
def test_a_recipe_runs_as_it_stands(name: str, tmp_path: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", recipes()[name]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert (tmp_path / WRITES[name]).is_file()
