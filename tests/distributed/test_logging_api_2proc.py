"""``Trainer.log`` in two real processes: reduced across them, one collective per point."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import Launch, launch


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    outcome = launch("logging_api.py", out_dir=tmp_path_factory.mktemp("logging_api"))
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return outcome


def test_epoch_values_are_reduced_over_both_processes(result: Launch) -> None:
    """Rank r logs 10 r + s at its steps s = 0..7: mean 8.5, sum 136, max 17 per epoch."""
    for rank in result.ranks:
        history: dict[str, Any] = rank["logging"]["history"]
        assert history["train_value_epoch"] == [8.5, 8.5]
        assert history["train_value_sum_epoch"] == [136.0, 136.0]
        assert history["train_value_max_epoch"] == [17.0, 17.0]
        assert history["train_rank_part_epoch"] == [0.5, 0.5]  # batch_output's extra
        assert history["rank"] == [0.5, 0.5]  # logged between epochs: reduced at once
    first, second = (rank["logging"]["history"] for rank in result.ranks)
    assert first == second


def test_step_values_are_reduced_over_both_processes_per_interval(result: Launch) -> None:
    """Every 4 updates: steps 0-3 of both ranks (mean 6.5), then steps 4-7 (mean 10.5)."""
    rows = result.ranks[0]["logging"]["steps"]
    assert [row["step"] for row in rows] == ["4", "8", "12", "16"]
    assert [float(row["train_value_step"]) for row in rows] == [6.5, 10.5, 6.5, 10.5]
    assert [float(row["train_value_max_step"]) for row in rows] == [13.0, 17.0, 13.0, 17.0]
    assert [float(row["train_value_sum_step"]) for row in rows] == [52.0, 84.0, 52.0, 84.0]


def test_logging_adds_no_collective_per_step_and_one_per_epoch(result: Launch) -> None:
    """The step values ride in the step logging's collective; each epoch end adds one.

    Per training step: none (issue 44: the logging points of updates 4 and 8 of each epoch are
    read together, in one collective at the epoch's end), with or without the logged values.
    Per run: one more per training epoch (its logged values) and one per value logged
    between epochs (reduced at once), so 2 + 2.
    """
    for rank in result.ranks:
        plain, logging = rank["plain"], rank["logging"]
        one_epoch = [{"blocking": 0, "async": 0}] * 7
        assert plain["train"] == one_epoch * 2
        assert logging["train"] == one_epoch * 2
        assert logging["collectives"] - plain["collectives"] == 4
