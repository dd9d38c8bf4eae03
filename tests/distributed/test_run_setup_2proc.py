"""Run set-up over 2 processes: what one rank decides, every rank does at the same step."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import Launch, launch


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    outcome = launch("run_setup.py", out_dir=tmp_path_factory.mktemp("run_setup"))
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return outcome


def test_a_time_budget_over_on_one_rank_stops_both_at_the_same_step(result: Launch) -> None:
    for rank in result.ranks:
        outcome: dict[str, Any] = rank["time_budget"]
        assert outcome["updates"] == 2  # the first check, on both ranks
        assert outcome["stopped"] is True
        assert outcome["states"] == ["time-limit-00000002"]


def test_the_state_it_saved_resumes_to_the_uninterrupted_run(result: Launch) -> None:
    for rank in result.ranks:
        outcome: dict[str, Any] = rank["time_budget"]
        assert outcome["resumed_from"].endswith("time-limit-00000002")
        assert outcome["resumed_equals_reference"] is True


def test_per_rank_seeds_add_the_process_index_and_the_lr_scales_with_processes(
    result: Launch,
) -> None:
    for index, rank in enumerate(result.ranks):
        outcome: dict[str, Any] = rank["seeding_and_scaling"]
        assert outcome["per_rank_seed"] == 5 + index
        assert outcome["shared_seed"] == 5
        assert outcome["factor"] == 2.0  # 2 processes x 4 per device x 2 accumulated / 8
        assert outcome["lr"] == pytest.approx(0.1)


def test_a_batch_failing_on_one_rank_is_skipped_by_both_without_a_hang(result: Launch) -> None:
    first, second = (rank["failing_batch"] for rank in result.ranks)
    assert first["updates"] == second["updates"] == 15  # 2 epochs x 8 steps, one skipped
    assert first["skipped"] == second["skipped"] == [1, 0]
    assert first["params"] == second["params"]  # the replicas stayed in step
    assert "Skipped training batch 1 of at most 2" in result.output


def test_a_dry_run_in_two_processes_leaves_nothing_behind(result: Launch) -> None:
    for rank in result.ranks:
        assert rank["dry_run"] == {"updates": 2, "unchanged": True, "user_dir_exists": False}
