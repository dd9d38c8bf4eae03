"""Several named eval sets over 2 processes equal evaluating each set alone, and one process."""

from __future__ import annotations

from typing import Any

import pytest
from launcher import launch


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    result = launch("eval_sets.py", out_dir=tmp_path_factory.mktemp("eval_sets"))
    assert result.returncode == 0, result.output[-4000:]
    return result.ranks


@pytest.mark.parametrize("name", ["val", "ood"])
def test_each_set_equals_evaluating_it_alone_and_in_one_process(
    ranks: list[dict[str, Any]], name: str
) -> None:
    assert len(ranks) == 2
    for rank in ranks:
        values = rank[name]
        assert values["recorded_loss"] == pytest.approx(values["alone_loss"], rel=1e-6)
        assert values["recorded_mae"] == pytest.approx(values["alone_mae"], rel=1e-6)
        assert values["recorded_loss"] == pytest.approx(values["direct"]["loss"], rel=1e-5)
        assert values["recorded_mae"] == pytest.approx(values["direct"]["mae"], rel=1e-5)
        both = rank["both"]
        assert both[f"both_{name}_loss"] == pytest.approx(values["alone_loss"], rel=1e-6)
        assert both[f"both_{name}_mae"] == pytest.approx(values["alone_mae"], rel=1e-6)
    assert ranks[0][name] == ranks[1][name]  # every process records the same values
