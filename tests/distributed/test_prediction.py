"""predict() over 2 processes equals the single-process outputs, in order, without repeats."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import launch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("prediction.py", out_dir=tmp_path_factory.mktemp("prediction"))
    assert result.returncode == 0, result.output[-4000:]
    return result.ranks


@pytest.mark.parametrize("case", ["21x4", "10x4", "3x4", "16x4"])
def test_every_rank_gets_every_sample_once_in_order(ranks: list[dict[str, Any]], case: str) -> None:
    samples = int(case.split("x")[0])
    assert len(ranks) == 2
    for rank in ranks:
        assert rank[case]["shape"] == [samples, 2]
        assert rank[case]["equal"]
        assert rank[case]["loader_equal"]
        assert rank[case]["streamed"] == samples


def test_outputs_that_cannot_be_concatenated_are_kept_or_refused_on_every_rank(
    ranks: list[dict[str, Any]],
) -> None:
    # issue 29: batches of varying width, gathered from both processes, kept in the error
    for rank in ranks:
        report = rank["unconcatenated"]
        assert report["kept"] == [[8, 2], [8, 4], [5, 6]]  # 21 samples, 4 per process
        assert report["equal"]
        assert report["refused"] == [1, True]  # a mean: refused after the first batch


def test_outputs_of_varying_width_across_processes_are_padded_to_the_widest(
    ranks: list[dict[str, Any]],
) -> None:
    # issue 42: predict(pad_value=...) pads each batch across processes, then across batches
    for rank in ranks:
        report = rank["padded"]
        assert report["shape"] == [21, 6]  # 3 repeats of 2 outputs at the widest
        assert report["rows"] == 21  # every sample: its outputs, then the padding
        assert report["repeats"] == [1, 2, 3]  # widths of both processes' batches
