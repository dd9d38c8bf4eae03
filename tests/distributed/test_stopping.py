"""A stop on one rank stops all ranks at the same step; files are written once."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import Launch, launch


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    outcome = launch("stopping.py", out_dir=tmp_path_factory.mktemp("stopping"))
    assert outcome.returncode == 0, outcome.output[-4000:]
    return outcome


@pytest.mark.parametrize(
    ("scenario", "updates"),
    [("step_stop", 3), ("epoch_stop", 8), ("nan_stop", 3), ("nan_epoch_stop", 8)],
)
def test_all_ranks_stop_at_the_same_update(result: Launch, scenario: str, updates: int) -> None:
    for rank in result.ranks:
        outcome: dict[str, Any] = rank[scenario]
        assert outcome["updates"] == updates
        assert outcome["epochs_started"] == 1
        assert outcome["tail"][-2:] == ["on_stop_training_error", "on_training_run_end"]


def test_checkpoint_written_once_and_loaded_on_every_rank(result: Launch) -> None:
    for rank in result.ranks:
        assert rank["checkpoint"] == {"loaded_equal": True, "files": ["model.pt"]}


def test_print_prints_once(result: Launch) -> None:
    assert result.output.count("PRINTED-ONCE") == 1
