"""Evaluation over 2 processes equals single-process evaluation, sample for sample."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import launch

CASES = [
    "21x4",
    "10x4",
    "3x4",
    "16x4",
]  # samples x per-device batch: uneven, empty rank, tiny, even


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("evaluation.py", out_dir=tmp_path_factory.mktemp("evaluation"))
    assert result.returncode == 0, result.output[-4000:]
    return result.ranks


@pytest.mark.parametrize("case", CASES)
def test_eval_loss_and_gathered_accuracy_are_exact(ranks: list[dict[str, Any]], case: str) -> None:
    samples = int(case.split("x")[0])
    for rank in ranks:
        values = rank[case]
        assert values["loss"] == pytest.approx(values["expected_loss"], abs=1e-6)
        assert values["accuracy"] == values["expected_accuracy"]
        assert values["samples_seen"] == samples  # no duplicated or dropped samples


def test_every_rank_runs_the_same_number_of_eval_batches(ranks: list[dict[str, Any]]) -> None:
    for case in CASES:
        assert ranks[0][case]["eval_batches"] == ranks[1][case]["eval_batches"]
