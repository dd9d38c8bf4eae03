"""Two processes with batch b train exactly like one process with batch 2b."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import launch

TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("training.py", out_dir=tmp_path_factory.mktemp("training"))
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    return result.ranks


@pytest.mark.parametrize("scenario", ["plain", "accumulation_short_last_window", "clip_norm"])
def test_weights_match_single_process_with_double_batch(
    ranks: list[dict[str, Any]], scenario: str
) -> None:
    for rank in ranks:
        assert rank["num_processes"] == 2
        assert rank[scenario] <= TOLERANCE


def test_one_cycle_from_placeholders_ends_exactly(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        schedule = rank["one_cycle"]
        assert schedule["updates"] == schedule["last_epoch"] == schedule["total_steps"] == 9
        assert schedule["last_lr"] == pytest.approx(schedule["min_lr"])


def test_max_num_train_steps_means_the_same_updates_on_every_rank(
    ranks: list[dict[str, Any]],
) -> None:
    assert [rank["max_steps_updates"] for rank in ranks] == [11, 11]


def test_unfrozen_parameters_are_synchronised(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["unfreeze"] <= TOLERANCE


def test_results_are_identical_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    assert ranks[0] == ranks[1]
