"""Collectives per training step, eval batch and predict batch, counted in two real processes.

DDP's gradient all-reduce is its own (issued from C++, not counted). By default the trainer
adds no collective per step; preemption handling agrees without blocking, about every 0.25 s
(one asynchronous all-reduce, read at the next exchange point; after every step with
``preemption_check_interval=0``), and so does a time budget at each check; a user callback
that may stop after every step costs one blocking all-reduce per step. Evaluation gathers
nothing per batch, prediction gathers once per batch.
"""

from __future__ import annotations

from typing import Any

import pytest
from launcher import Launch, launch

NO_COLLECTIVE = {"blocking": 0, "async": 0}
ONE_ASYNC = {"blocking": 0, "async": 1}
ONE_BLOCKING = {"blocking": 1, "async": 0}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    outcome = launch("collectives.py", out_dir=tmp_path_factory.mktemp("collectives"))
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return outcome


@pytest.mark.parametrize(
    ("scenario", "per_step"),
    [
        ("default", NO_COLLECTIVE),
        ("early_stopping", NO_COLLECTIVE),
        ("preemption_every_step", ONE_ASYNC),
        ("time_budget", ONE_ASYNC),
        ("may_stop_every_step", ONE_BLOCKING),
    ],
)
def test_collectives_per_training_step(
    result: Launch, scenario: str, per_step: dict[str, int]
) -> None:
    for rank in result.ranks:
        counted: dict[str, Any] = rank[scenario]
        assert counted["updates"] == 16
        assert len(counted["train"]) == 14  # 2 epochs of 8 steps: 7 gaps each
        assert all(step == per_step for step in counted["train"]), counted["train"]


@pytest.mark.parametrize(
    "scenario",
    ["default", "early_stopping", "preemption", "time_budget", "may_stop_every_step"],
)
def test_no_collective_per_eval_batch_and_one_gather_per_predict_batch(
    result: Launch, scenario: str
) -> None:
    for rank in result.ranks:
        counted: dict[str, Any] = rank[scenario]
        assert len(counted["eval"]) == 8  # 2 eval epochs of 5 batches: 4 gaps each
        assert all(batch == NO_COLLECTIVE for batch in counted["eval"])
        assert len(counted["predict"]) == 4
        assert all(batch == ONE_BLOCKING for batch in counted["predict"])


def test_preemption_handling_paces_its_exchanges(result: Launch) -> None:
    """About every 0.25 s: on these millisecond steps, a few asynchronous exchanges in all."""
    for rank in result.ranks:
        steps = rank["preemption"]["train"]
        assert all(step["blocking"] == 0 and step["async"] <= 1 for step in steps), steps
        assert 1 <= sum(step["async"] for step in steps) <= 4, steps


def test_a_signal_on_one_process_stops_both_at_the_same_step(result: Launch) -> None:
    """Rank 1 alone is signalled after update 3; both read the agreement at update 4."""
    for rank in result.ranks:
        assert rank["preempted_on_one_rank"] == {
            "updates": 4,
            "preempted_by": "SIGTERM",
            "states": ["preempted-00000004"],
        }
