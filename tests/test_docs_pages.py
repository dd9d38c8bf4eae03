"""The docs' pictures and the home page's table cannot drift (issue 43).

- Every picture a page shows is in docs/images, small, and made by ``make pictures``
  (``scripts/generate_pictures.py`` lists it in ``PICTURES``); every picture it makes is shown,
  but for the picture of the docs' home page (``DOCS_PICTURES``).
- Every test the home page's table of capabilities names exists (the file, and the test
  function when the name has ``::``).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\((images/[^)\s]+)\)")
TEST_NAME = re.compile(r"`(tests/[\w/.-]+\.py)(?:::(\w+))?`")
MAX_PICTURE_BYTES = 200_000


def generated_pictures(name: str = "PICTURES") -> tuple[str, ...]:
    """``PICTURES`` (or ``name``) of scripts/generate_pictures.py (imported, not run)."""
    spec = importlib.util.spec_from_file_location(
        "generate_pictures", ROOT / "scripts" / "generate_pictures.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(getattr(module, name))


def shown_pictures() -> dict[str, list[str]]:
    """Each picture the pages show, with the pages that show it."""
    shown: dict[str, list[str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for path in IMAGE.findall(page.read_text()):
            shown.setdefault(path.removeprefix("images/"), []).append(page.name)
    return shown


def test_every_picture_shown_is_generated_and_every_one_generated_is_shown() -> None:
    shown = shown_pictures()
    generated = generated_pictures()
    assert set(shown) == set(generated), (
        "docs/images: the pictures the pages show and those scripts/generate_pictures.py "
        f"makes differ: shown only {sorted(set(shown) - set(generated))}, "
        f"generated only {sorted(set(generated) - set(shown))}"
    )
    for name in (*generated, *generated_pictures("DOCS_PICTURES")):
        picture = DOCS / "images" / name
        assert picture.is_file(), f"{picture} is missing: run make pictures"
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
        assert picture.stat().st_size < MAX_PICTURE_BYTES, f"{picture} is over 200 KB"


def test_the_home_page_shows_the_pictures_of_a_run() -> None:
    assert {"console.png", "metrics.png", "lr_finder.png", "run_report.png"} <= {
        name for name, pages in shown_pictures().items() if "index.md" in pages
    }


def home_page_tests() -> list[tuple[str, str | None]]:
    """The tests the home page's table names: (file, function or None)."""
    table = [line for line in (DOCS / "index.md").read_text().splitlines() if line.startswith("|")]
    return [(path, name or None) for line in table for path, name in TEST_NAME.findall(line)]


def test_the_home_page_table_names_tests_on_every_row() -> None:
    rows = [
        line
        for line in (DOCS / "index.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith(("| Capability", "| ---"))
    ]
    assert len(rows) >= 15
    for row in rows:
        assert TEST_NAME.search(row.rsplit("|", 2)[1]), f"a capability without its tests: {row}"


@pytest.mark.parametrize(("path", "name"), home_page_tests())
def test_every_test_the_home_page_names_exists(path: str, name: str | None) -> None:
    source = ROOT / path
    assert source.is_file(), f"docs/index.md names {path}, which does not exist"
    if name is not None:
        assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE), (
            f"docs/index.md names {path}::{name}, which is not a test of that file"
        )
