"""Metrics, tracking and throughput callbacks over 2 processes: exact, written once, all ranks."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from launcher import launch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

TRAIN_SAMPLES, EVAL_SAMPLES = 30, 21  # neither divides into 2 processes x batches of 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("callbacks_b")
    result = launch("callbacks_b.py", out_dir=out)
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    return result.ranks, out


def test_metrics_equal_single_process_values_on_every_rank(
    run: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, _ = run
    for rank in ranks:
        history = rank["history"]
        assert history["accuracy"][-1] == rank["expected_accuracy"]
        assert history["n"] == [EVAL_SAMPLES] * 2  # no repeated sample, no double count
        assert history["train_n"] == [TRAIN_SAMPLES] * 2
    assert ranks[0]["history"]["accuracy"] == ranks[1]["history"]["accuracy"]


def test_tracking_writes_once_from_the_main_process(
    run: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, out = run
    assert [rank["tracker_counts"] for rank in ranks] == [[1, 1], [0, 0]]
    run_dir = out / "runs" / "pytorch-accel"
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert len(list(run_dir.rglob("hparams.yml"))) == 1
    events = EventAccumulator(str(run_dir))
    events.Reload()
    accuracy = [(event.step, event.value) for event in events.Scalars("accuracy")]
    history = ranks[0]["history"]
    with open(out / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["epoch"] for row in rows] == ["1", "2"]
    ends = [int(row["update"]) for row in rows]  # the update count at each epoch's end
    assert ends[0] > 1
    assert ends[1] == 2 * ends[0]
    assert accuracy == [
        (ends[0], pytest.approx(history["accuracy"][0])),
        (ends[1], pytest.approx(history["accuracy"][1])),
    ]
    assert [float(row["train_loss_epoch"]) for row in rows] == history["train_loss_epoch"]


def test_throughput_is_recorded_on_both_ranks_with_global_counts(
    run: tuple[list[dict[str, Any]], Path],
) -> None:
    ranks, _ = run
    for rank in ranks:
        # 4 rounds of 2 processes x 4 samples, the last one padded with repeats
        assert (rank["throughput_samples"], rank["throughput_updates"]) == (32, 4)
        for name in ("train_samples_per_second", "train_updates_per_second"):
            assert len(rank["history"][name]) == 2
            assert all(value > 0 for value in rank["history"][name])
        assert all(0 <= value <= 1 for value in rank["history"]["train_data_wait_fraction"])
    for name in ("train_samples_per_second", "train_data_wait_fraction"):
        assert ranks[0]["history"][name] == ranks[1]["history"][name]  # combined, not per rank
