"""``on_oom="split"`` and ``find_batch_size`` over 2 processes: one launch of
``scripts/micro_batches.py``; a hang ends at the launch's timeout as a failure."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch


def test_out_of_memory_on_one_rank_splits_every_rank_and_changes_no_result(
    tmp_path: Path,
) -> None:
    outcome = launch("micro_batches.py", out_dir=tmp_path, timeout=180)
    assert outcome.returncode == 0, outcome.output[-4000:]
    first, second = outcome.ranks
    # rank 1 ran out of memory (16 rows, then 8); both ranks now run 4 micro-batches a step
    assert first["split"]["splits"] == second["split"]["splits"] == 4
    assert first["split"]["updates"] == first["reference"]["updates"] == 4
    assert first["split"]["params"] == pytest.approx(second["split"]["params"], abs=1e-7)
    assert first["split"]["params"] == pytest.approx(first["reference"]["params"], abs=1e-6)
    assert "out of memory in step 4 of epoch 1" in outcome.output
    # the search agrees on rank 1's limit
    assert first["found"] == second["found"] == 12
