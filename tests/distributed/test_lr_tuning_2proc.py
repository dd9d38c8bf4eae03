"""find_lr and a metric-driven scheduler in two real processes: one launch, several checks."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import launch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("lr_tuning.py", out_dir=tmp_path_factory.mktemp("lr_tuning"))
    assert result.returncode == 0, result.output[-4000:]
    assert [rank["num_processes"] for rank in result.ranks] == [2, 2]
    return result.ranks


def test_find_lr_gives_every_process_the_same_curve_and_suggestion(
    ranks: list[dict[str, Any]],
) -> None:
    first, second = (rank["lr_finder"] for rank in ranks)
    assert first["losses"] == second["losses"]  # averaged across processes
    assert first["suggestion"] == second["suggestion"] is not None
    assert first["diverged_at"] == second["diverged_at"] == len(first["lrs"]) - 1 < 39
    assert first["accumulated_losses"] == second["accumulated_losses"]  # windows of 2 batches
    assert len(first["accumulated_losses"]) == 20


def test_find_lr_restores_every_process_and_training_after_it_is_unchanged(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        assert rank["lr_finder"]["restored"]
        assert rank["lr_finder"]["lr_after"] == 0.01
        assert rank["lr_finder"]["same_training"]


def test_a_monitored_metric_is_the_main_processs_so_the_rates_stay_equal(
    ranks: list[dict[str, Any]],
) -> None:
    first, second = (rank["plateau"] for rank in ranks)
    assert first["scores"] != second["scores"]  # each process recorded its own
    assert first["lrs"] == second["lrs"]
    # rank 0's score never improves after epoch 1: halved after epochs 2, 3 (patience 0)
    per_epoch = first["lrs"][::4]  # 128 samples / 2 processes / 16: 4 updates per epoch
    assert per_epoch == [0.01, 0.01, 0.005, 0.0025]
