"""Skipping failing batches over 2 processes: no hang, no abort, the replicas stay equal.

Each scenario is one ``torchrun --nproc_per_node 2`` launch (gloo) of
``scripts/skipping.py``; a hang ends at the launch's timeout as a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from launcher import launch


def run(name: str, tmp_path: Path) -> list[dict[str, Any]]:
    outcome = launch("skipping.py", name, out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return [rank["result"] for rank in outcome.ranks]


def test_out_of_memory_on_one_rank_at_the_end_of_a_window_with_batchnorm(tmp_path: Path) -> None:
    first, second = run("end_of_window_one_rank", tmp_path)
    # 2 epochs x 4 windows of 2 per rank; the 1st and 3rd windows lose their last micro-batch
    assert first["updates"] == second["updates"] == 8
    assert first["skipped"] == second["skipped"] == [2, 0]
    assert first["params"] == pytest.approx(second["params"], abs=1e-6)


@pytest.mark.parametrize("where", ["end_of_window_both", "start_of_window_both"])
def test_a_micro_batch_failing_on_both_ranks_keeps_the_replicas_equal(
    where: str, tmp_path: Path
) -> None:
    first, second = run(where, tmp_path)
    assert first["updates"] == second["updates"] == 8  # no window lost all its batches
    assert first["skipped"] == second["skipped"] == [1, 0]
    assert first["params"] == pytest.approx(second["params"], abs=1e-6)


@pytest.mark.parametrize("where", ["before_forward_one_rank", "before_forward_end_of_window"])
def test_a_failure_before_the_forward_on_one_rank_is_skipped_by_both(
    where: str, tmp_path: Path
) -> None:
    first, second = run(where, tmp_path)
    assert first["skipped"] == second["skipped"] == [1, 0]
    assert first["updates"] == second["updates"]
    assert first["params"] == pytest.approx(second["params"], abs=1e-6)


def test_a_stop_raised_in_the_step_on_one_rank_stops_both(tmp_path: Path) -> None:
    first, second = run("stop_one_rank", tmp_path)
    assert first["skipped"] == second["skipped"] == [0]  # never skipped
    assert "failed before the forward pass" in second["stopped_by"]
    assert first["stopped_by"] is not None
    assert first["updates"] == second["updates"] == 2
    assert first["params"] == pytest.approx(second["params"], abs=1e-6)


def test_an_error_the_policy_does_not_skip_on_one_rank_is_raised_on_both(tmp_path: Path) -> None:
    first, second = run("error_one_rank", tmp_path)
    assert second["error"] == "ValueError: failed before the forward pass (rank 1)"
    assert first["error"].startswith("RuntimeError: Trainer.train: calculate_train_batch_loss")
    assert "another process" in first["error"]
    assert first["updates"] == second["updates"] == 2


def test_eval_and_predict_batches_failing_on_one_rank_are_skipped_by_both(
    tmp_path: Path,
) -> None:
    outcome = launch("skipping_eval.py", out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    first, second = (rank["result"] for rank in outcome.ranks)
    assert first["eval_skipped"] == second["eval_skipped"] == [1]  # train()'s eval epoch
    assert first["eval_loss"] == pytest.approx(second["eval_loss"])
    assert first["evaluate"]["evaluation_skipped_batches"] == 1
    assert first["evaluate"] == pytest.approx(second["evaluate"])
    assert first["predict_skipped"] == second["predict_skipped"] == [2]
    # the round of batch index 2 (samples 16 to 23: 4 per rank) is missing, nothing else
    everything = first["everything"]
    assert first["predictions"] == second["predictions"]
    assert first["predictions"] == pytest.approx(everything[:16] + everything[24:])
