"""LossSpikeCallback over 2 processes: a spike seen on one process only is acted on by both.

Each scenario is one ``torchrun --nproc_per_node 2`` launch (gloo) of
``scripts/loss_spikes.py``; a hang ends at the launch's timeout as a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from launcher import launch


def run(action: str, tmp_path: Path) -> list[dict[str, Any]]:
    outcome = launch("loss_spikes.py", action, out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return [rank["result"] for rank in outcome.ranks]


def test_a_spike_on_rank_one_skips_the_update_on_both(tmp_path: Path) -> None:
    first, second = run("skip", tmp_path)
    assert first["skipped_updates"] == second["skipped_updates"] == 1
    assert first["updates"] == second["updates"] == 8
    assert first["params"] == pytest.approx(second["params"], abs=1e-7)
    assert first["params"] == pytest.approx(first["reference"], abs=1e-5)


def test_a_spike_on_rank_one_rolls_both_back(tmp_path: Path) -> None:
    first, second = run("rollback", tmp_path)
    # checks at updates 2, 4, 6, 8: the spike of update 6 restores the state of update 4
    assert first["rollbacks"] == second["rollbacks"] == [[4, 6]]
    assert first["params"] == pytest.approx(second["params"], abs=1e-7)
    assert first["params"] == pytest.approx(first["reference"], abs=1e-5)
