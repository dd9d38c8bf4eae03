"""Every built-in callback survives two train() calls and an evaluate(), with its defaults."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from catalogue import exercise, factories

NAMES = sorted(factories())


@pytest.mark.parametrize("name", NAMES)
def test_callback_survives_repeated_runs_and_evaluate(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # callbacks that write files write them here
    outcome = exercise(name)
    assert outcome["epochs"] in (2, 3)  # EarlyStoppingCallback may stop the first run early
    assert math.isfinite(outcome["evaluation_loss"])


def test_the_catalogue_lists_every_exported_callback() -> None:
    import pytorch_accel.callbacks as cb

    exported = {n for n in cb.__all__ if n.endswith("Callback") and n != "TrainerCallback"}
    assert exported - {"WSDCheckpointCallback"} == set(NAMES)
