"""Several training sets over 2 processes: every sample once per epoch, per-set losses, resume."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from launcher import launch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("mixing.py", out_dir=tmp_path_factory.mktemp("mixing"))
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    return result.ranks


@pytest.mark.parametrize("epoch", [0, 1])
def test_each_set_is_split_across_the_processes_every_sample_once(
    ranks: list[dict[str, Any]], epoch: int
) -> None:
    steps = [[step for step in rank["steps"] if step["epoch"] == epoch] for rank in ranks]
    assert [len(each) for each in steps] == [8, 8]  # 10 + 5 batches of 2, the 16th padded
    for each in steps:
        for step in each:
            assert len({name for name, _ in step["samples"]}) == 1  # a batch from one set
    # the padding: process 1's last batch is the epoch's first (process 0's first)
    assert steps[1][-1]["samples"] == steps[0][0]["samples"]
    seen = collections.Counter(
        tuple(sample) for each in (steps[0], steps[1][:-1]) for s in each for sample in s["samples"]
    )
    expected = {("a", i) for i in range(20)} | {("b", i) for i in range(9)}
    assert set(seen) == expected
    assert set(seen.values()) == {1}
    for name in ("a", "b"):  # both processes train on both sets
        assert all(any(s["samples"][0][0] == name for s in each) for each in steps)


@pytest.mark.parametrize("epoch", [0, 1])
def test_per_set_losses_equal_a_hand_computation_over_both_processes(
    ranks: list[dict[str, Any]], epoch: int
) -> None:
    totals: dict[str, list[float]] = {"a": [0.0, 0.0], "b": [0.0, 0.0]}
    for rank in ranks:
        for step in rank["steps"]:
            if step["epoch"] == epoch:
                size = len(step["samples"])
                total = totals[step["samples"][0][0]]
                total[0] += step["loss"] * size
                total[1] += size
    for rank in ranks:
        for name, (loss_sum, count) in totals.items():
            recorded = rank["metrics"][f"train_loss_{name}_epoch"][epoch]
            assert recorded == pytest.approx(loss_sum / count, abs=1e-6)
        overall = sum(total[0] for total in totals.values()) / sum(
            total[1] for total in totals.values()
        )
        assert rank["metrics"]["train_loss_epoch"][epoch] == pytest.approx(overall, abs=1e-6)


def test_a_run_resumed_mid_epoch_is_bitwise_the_uninterrupted_one(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        assert rank["resumed_equal"]
        assert rank["resumed_metrics"] == rank["metrics"]
