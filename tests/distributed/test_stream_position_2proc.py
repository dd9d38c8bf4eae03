"""A stream that saves its position resumes mid-pass in 2 processes, bitwise, without replay."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch

pytestmark = pytest.mark.distributed


def test_two_processes_resume_a_positioned_stream_bitwise_without_replay(tmp_path: Path) -> None:
    result = launch("stream_position.py", out_dir=tmp_path, timeout=240)
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    for rank, report in enumerate(result.ranks):
        for mode in ("dataset", "stateful", "workers"):
            assert report[mode]["equal"], (rank, mode)
            assert report[mode]["num_updates"] == 7
    # each process reads the whole stream (rounds of 2 x 4 samples) and keeps its part: after
    # 5 of 7 rounds, the resumed run reads the 2 rounds left and 1 ahead, not the 40 samples
    # trained on (a replay reads them again: 64 in all)
    for report in result.ranks:
        assert report["dataset"]["loaded"] == report["stateful"]["loaded"] == 24
