"""One process of two does what the other does not: a clear error on both, in seconds, no abort.

Issue 41, items 1-3: ``trainer.log`` on one process only (it waited for the process-group
timeout), other names on each process (combined by position), and a ``StopTrainingError`` or
another error raised in ``calculate_train_batch_loss`` on one process (a gloo collective
mismatch and SIGABRT, or gloo's "Connection reset by peer").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launcher import Launch, launch

DIFFERENT_NAMES = r"Trainer\.log: the processes logged different metrics in one"


def run(scenario: str, tmp_path: Path) -> Launch:
    """Launch the scenario: both processes fail with an error of their own, in seconds."""
    outcome = launch("rank_faults.py", scenario, out_dir=tmp_path, timeout=120)
    assert "SIGABRT" not in outcome.output
    assert "terminate called" not in outcome.output  # gloo's collective mismatch
    assert outcome.returncode != 0
    assert len(outcome.ranks) == 2, outcome.output[-4000:]
    for rank in outcome.ranks:
        assert rank["seconds"] < 10, rank  # not the process-group timeout (30 minutes)
    return outcome


@pytest.mark.parametrize(
    ("scenario", "span", "per_process"),
    [
        (
            "log_one_rank",
            r"train epoch \(train_loss_epoch\)",
            "process 0 logged nothing; process 1 logged 'rare_event' (mean)",
        ),
        (
            "log_other_names",
            r"train epoch \(train_loss_epoch\)",
            "process 0 logged 'a' (mean); process 1 logged 'b' (mean)",
        ),
        (
            "log_one_rank_steps",
            # the step logging may read its points at the epoch's end, after the epoch's check
            r"(logging interval|train epoch \(train_loss_epoch\))",
            "process 0 logged 'rare_event' (mean); process 1 logged nothing",
        ),
        (
            "log_one_rank_eval",
            r"eval epoch \(eval_loss_epoch\)",
            "process 0 logged 'eval_only_here' (mean); process 1 logged nothing",
        ),
    ],
)
def test_names_logged_on_one_process_raise_on_both(
    scenario: str, span: str, per_process: str, tmp_path: Path
) -> None:
    """Both processes raise the same ValueError at the same point, naming the names per process."""
    outcome = run(scenario, tmp_path)
    for rank in outcome.ranks:
        assert rank["error"] == "ValueError"
        assert re.match(rf"{DIFFERENT_NAMES} {span}: {re.escape(per_process)}\.", rank["message"])
        assert "weight=0" in rank["message"]  # the fix
        assert not any(name in rank["history"] for name in ("train_a_epoch", "train_b_epoch"))


def test_a_stop_raised_in_one_process_step_fails_both_clearly(tmp_path: Path) -> None:
    """Process 1's stop is refused there (no collective); process 0 names it."""
    outcome = run("stop_in_step", tmp_path)
    first, second = outcome.ranks
    assert second["error"] == "RuntimeError"
    assert second["message"].startswith(
        "Trainer.train: StopTrainingError('rank 1 has seen enough') was raised inside a train "
        "step (e.g. by calculate_train_batch_loss) on process 1"
    )
    assert "from a callback" in second["message"]
    assert first["error"] == "RuntimeError"
    assert first["message"].startswith(
        "Trainer.train: process 0 stopped because the run failed on another process: process 1: "
        "RuntimeError: Trainer.train: StopTrainingError('rank 1 has seen enough')"
    )


def test_an_error_raised_in_one_process_step_is_named_on_the_other(tmp_path: Path) -> None:
    outcome = run("raise_in_step", tmp_path)
    first, second = outcome.ranks
    assert (second["error"], second["message"]) == ("ValueError", "rank 1's batch is bad")
    assert first["error"] == "RuntimeError"
    assert first["message"].startswith(
        "Trainer.train: process 0 stopped because the run failed on another process: process 1: "
        "ValueError: rank 1's batch is bad"
    )


def test_more_names_than_an_interval_has_room_for_are_combined_by_name(tmp_path: Path) -> None:
    """Ten means (20 parts, room for 16): the interval's exchange grows once; values exact."""
    outcome = launch("rank_faults.py", "log_many_names", out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    first, second = outcome.ranks
    assert first["history"] == second["history"]
    for index in range(10):  # rank r logs r + index: the mean over both is index + 0.5
        assert first["history"][f"train_n{index}_epoch"] == [index + 0.5] * 2
    rows = first["steps"]
    assert len(rows) == 8  # 16 updates (8 per epoch), logged every 2
    for row in rows:
        assert [float(row[f"train_n{index}_step"]) for index in range(10)] == [
            index + 0.5 for index in range(10)
        ]
