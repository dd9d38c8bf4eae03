"""Early stopping, best-model saving, EMA and step-based evaluation over 2 processes."""

from __future__ import annotations

import pytest
from launcher import Launch, launch


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    outcome = launch("callbacks_a.py", out_dir=tmp_path_factory.mktemp("callbacks_a"))
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2, outcome.output[-4000:]
    return outcome


def test_early_stopping_on_one_rank_stops_both_at_the_same_epoch(result: Launch) -> None:
    for rank in result.ranks:
        outcome = rank["early_stop_and_save_best"]
        assert outcome["epochs_completed"] == 3  # rank 1's metric never improves: patience 2
        assert outcome["updates"] == 3 * 4


def test_save_best_follows_the_main_process_and_loads_on_every_rank(result: Launch) -> None:
    for rank in result.ranks:
        outcome = rank["early_stop_and_save_best"]
        assert outcome["top"] == [[2, 1.0], [3, 2.0]]  # rank 0's values 3, 1, 2
        assert outcome["files"] == ["best_model-epoch2.pt", "best_model-epoch3.pt", "best_model.pt"]
        assert outcome["loaded_epoch_2"]
        assert outcome["differs_from_epoch_3"]


def test_ema_is_identical_on_both_ranks_and_matches_the_reference(result: Launch) -> None:
    first, second = (rank["ema_and_step_evaluation"] for rank in result.ranks)
    assert first["ema"] == second["ema"]
    for outcome in (first, second):
        assert outcome["ema_error"] < 1e-5
        assert len(outcome["ema_eval"]) == 2
        assert outcome["files"] == ["ema_model.pt"]
    assert first["ema_eval"] == second["ema_eval"]


def test_step_based_evaluation_runs_on_both_ranks(result: Launch) -> None:
    first, second = (rank["ema_and_step_evaluation"] for rank in result.ranks)
    for outcome in (first, second):
        assert outcome["updates"] == 8
        assert len(outcome["intermediate"]) == 2  # after updates 3 and 6
    assert first["intermediate"] == second["intermediate"]


def test_a_stop_inside_a_step_evaluation_stops_both_ranks_together(result: Launch) -> None:
    first, second = (rank["stop_inside_step_evaluation"] for rank in result.ranks)
    assert first == second
    # The trainer agrees on it at the latest at the end of the training epoch.
    assert 3 <= first["updates"] <= 4
    assert first["training"]
