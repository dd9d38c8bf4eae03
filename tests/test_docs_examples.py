"""Every fenced ``python`` example of docs/*.md (and README.md) runs (issue 43).

How the examples run (the convention the pages follow):

- The blocks of one page run in order in one fresh interpreter, in a temporary working
  directory, as one script: a block continues the blocks above it, as a reader reads them.
- The script starts with :data:`PREAMBLE`: the names the pages take as given (``model``,
  ``loss_func``, ``optimizer``, ``train_dataset``, ``eval_dataset``, ``test_dataset``,
  ``val_dataset``, ``trainer``: a 10-class problem of 8 features, 128/32/32 samples), as the
  quickstart builds them.
- Runs are shortened: ``num_epochs=N`` runs at most 2 epochs and ``max_num_train_steps=N`` at
  most 4 steps (:func:`shortened`); nothing else of a block is changed.
- Markers, HTML comments that the rendered page does not show:

  - ``<!-- docs-test: setup`` ... ``-->`` holds Python that the page assumes but does not show
    (a tokenizer, a saved state to resume): it runs at its place in the page's sequence.
  - On the line right before a fence, for that block only:

    - ``<!-- docs-test: skip REASON -->``: the block does not run. :data:`MAX_SKIPPED` bounds
      how many do; ``python tests/test_docs_examples.py`` lists them with their reasons.
    - ``<!-- docs-test: raises NAME -->``: the block shows an error; it must raise ``NAME``.
    - ``<!-- docs-test: alone REASON -->``: the block runs in a process of its own, after the
      preamble but before its ``trainer`` is created (a trainer with another accelerator
      setting than the page's, which accelerate cannot change within a process).
    - ``<!-- docs-test: epochs N -->``: the block's runs are shortened to ``N`` epochs, not 2
      (a schedule that needs more).

  - ``<!-- recipe: NAME -->`` blocks are complete scripts that tests/test_hf_recipes.py also
    runs (with its own checks).

``python tests/test_docs_examples.py`` prints each page's count of blocks run and skipped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MAX_SKIPPED = 12

PREAMBLE = '''\
import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback


def _ten_classes(samples, seed):
    """8 features, a label of 10 classes: the arg-max of a fixed linear map."""
    features = torch.randn(samples, 8, generator=torch.Generator().manual_seed(seed))
    weights = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    return TensorDataset(features, (features @ weights).argmax(dim=1))


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 10))
loss_func = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_dataset = _ten_classes(128, 1)
eval_dataset, test_dataset = _ten_classes(32, 2), _ten_classes(32, 3)
val_dataset = eval_dataset
trainer = Trainer(model, loss_func, optimizer)
'''

FENCE = re.compile(r"^( *)```python\n(.*?)^\1```$", re.DOTALL | re.MULTILINE)
SETUP = re.compile(r"^<!-- docs-test: setup\n(.*?)^-->$", re.DOTALL | re.MULTILINE)
BLOCK_MARKER = re.compile(r"<!-- docs-test: (skip|alone|raises|epochs) (.+?) -->\n *$")
ANY_MARKER = re.compile(r"^ *<!-- docs-test: (\w+)", re.MULTILINE)  # prose may name one
KNOWN_MARKERS = {"setup", "skip", "alone", "raises", "epochs"}


@dataclass(frozen=True)
class Block:
    """A piece of a page's script: a fenced example or a hidden set-up."""

    page: str
    line: int  # of the code's first line in the page, 1-based
    code: str
    marker: tuple[str, str] | None = None  # ("skip", why), ("alone", why), ("raises", name), ...
    setup: bool = False

    @property
    def alone(self) -> bool:
        """Whether the block runs in a process of its own."""
        return self.marker is not None and self.marker[0] == "alone"

    @property
    def skip_reason(self) -> str | None:
        """Why the block does not run, or ``None`` when it runs."""
        return self.marker[1] if self.marker and self.marker[0] == "skip" else None

    def script_lines(self) -> list[str]:
        """The block's lines in the page's script: shortened, and checked for an error."""
        epochs = int(self.marker[1]) if self.marker and self.marker[0] == "epochs" else 2
        lines = shortened(self.code, epochs).splitlines()
        if self.marker and self.marker[0] == "raises":
            error = self.marker[1]
            return [
                "try:",
                *(f"    {line}" for line in lines),
                f"except {error}:",
                "    pass",
                "else:",
                f"    raise AssertionError('{self.page}:{self.line}: no {error} raised')",
            ]
        return lines


def page_blocks(page: Path) -> list[Block]:
    """The fenced examples and set-ups of ``page``, in page order."""
    text = page.read_text()
    found: list[Block] = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start(2)) + 1
        marker = BLOCK_MARKER.search(text[: match.end(1)])
        found.append(
            Block(
                str(page.relative_to(ROOT)),
                line,
                textwrap.dedent(match.group(2)),
                (marker.group(1), marker.group(2)) if marker else None,
            )
        )
    for match in SETUP.finditer(text):
        line = text.count("\n", 0, match.start(1)) + 1
        found.append(Block(str(page.relative_to(ROOT)), line, match.group(1), setup=True))
    return sorted(found, key=lambda block: block.line)


def shortened(code: str, epochs: int = 2) -> str:
    """``code`` with at most ``epochs`` epochs and 4 steps per run."""
    code = re.sub(r"num_epochs=(\d[\d_]*)", lambda m: f"num_epochs={min(int(m[1]), epochs)}", code)
    return re.sub(
        r"max_num_train_steps=(\d[\d_]*)",
        lambda m: f"max_num_train_steps={min(int(m[1]), 4)}",
        code,
    )


def page_script(blocks: list[Block], alone: int | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The page's script and, for each of its lines, ``(page line, block index)`` (-1: preamble).

    With ``alone``, the script of that block alone, run before the preamble's trainer exists.
    """
    lines = PREAMBLE.splitlines()
    if alone is not None:
        lines = [line for line in lines if not line.startswith("trainer = ")]
    origin = [(0, -1)] * len(lines)
    for index, block in enumerate(blocks):
        if block.skip_reason is not None or block.alone != (index == alone):
            continue
        if alone is not None and index != alone:
            continue
        code_lines = block.script_lines()
        lines.extend(code_lines)
        start = block.line - (1 if block.marker and block.marker[0] == "raises" else 0)
        origin.extend((start + offset, index) for offset in range(len(code_lines)))
    lines.append(f"print({END_OF_PAGE!r})")  # an early os._exit(0) would skip the rest
    origin.append((0, -1))
    return "\n".join(lines) + "\n", origin


END_OF_PAGE = "docs-test: the end of the page"
PAGES = [
    *sorted(page for page in DOCS.glob("*.md") if FENCE.search(page.read_text())),
    ROOT / "README.md",
]


def test_the_markers_are_known_and_every_skip_has_a_reason() -> None:
    for page in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        text = page.read_text()
        unknown = set(ANY_MARKER.findall(text)) - KNOWN_MARKERS
        assert not unknown, f"{page.name}: unknown docs-test markers {unknown}"
        for match in re.finditer(
            r"^ *<!-- docs-test: (skip|alone|raises|epochs)(.*?)-->", text, re.MULTILINE
        ):
            assert match.group(2).strip(), f"{page.name}: a {match.group(1)} marker without value"
            following = text[match.end() :]
            assert re.match(r"\n *```python", following), (
                f"{page.name}: a {match.group(1)} marker must be on the line right before a "
                "```python fence"
            )


def test_few_examples_are_skipped() -> None:
    blocks = [block for page in PAGES for block in page_blocks(page) if not block.setup]
    skipped = [block for block in blocks if block.skip_reason is not None]
    assert len(blocks) >= 90
    assert len(skipped) <= MAX_SKIPPED, [(b.page, b.line, b.skip_reason) for b in skipped]


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_the_examples_of_a_page_run(page: Path, tmp_path: Path) -> None:
    blocks = page_blocks(page)
    done = run_script(page, blocks, *page_script(blocks), tmp_path / "page")
    assert END_OF_PAGE in done.stdout, f"{page.relative_to(ROOT)}: a block ended the script early"
    for index, block in enumerate(blocks):
        if block.alone:  # may end its process early (os._exit)
            run_script(page, blocks, *page_script(blocks, alone=index), tmp_path / f"{index}")


def run_script(
    page: Path, blocks: list[Block], script: str, origin: list[tuple[int, int]], directory: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in ``directory``; fail naming the page line where it raised."""
    directory.mkdir()
    path = directory / "page.py"
    path.write_text(script)
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MLFLOW_", "WANDB_", "PYTORCH_ACCEL_", "ACCELERATE_"))
    }
    environment.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]),
        OMP_NUM_THREADS="1",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(directory / "wandb-config"),
        MPLBACKEND="Agg",
    )
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=240,
        env=environment,
        check=False,
    )
    if done.returncode != 0:
        where = re.findall(rf'File "{re.escape(str(path))}", line (\d+)', done.stderr)
        place = "the preamble"
        if where:
            page_line, index = origin[int(where[-1]) - 1]
            if index >= 0:
                where_page = page.relative_to(ROOT)
                place = f"{where_page}:{page_line} (the block from line {blocks[index].line})"
        pytest.fail(f"an example fails at {place}:\n{done.stderr[-4000:]}")
    return done


def main() -> None:
    """Print each page's count of examples run and skipped, and the skips' reasons."""
    total_run = total_skipped = 0
    for page in PAGES:
        blocks = [block for block in page_blocks(page) if not block.setup]
        skipped = [block for block in blocks if block.skip_reason is not None]
        total_run += len(blocks) - len(skipped)
        total_skipped += len(skipped)
        print(f"{page.name}: {len(blocks) - len(skipped)} run, {len(skipped)} skipped")
        for block in skipped:
            print(f"    line {block.line}: {block.skip_reason}")
    print(f"all pages: {total_run} run, {total_skipped} skipped")


if __name__ == "__main__":
    main()
