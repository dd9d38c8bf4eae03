"""An IterableDataset over 2 processes trains as one process on the combined batches."""

from __future__ import annotations

from pathlib import Path

from launcher import launch


def test_a_stream_in_two_processes_equals_one_process(tmp_path: Path) -> None:
    result = launch("stream.py", out_dir=tmp_path)
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    for rank in result.ranks:
        assert rank["num_updates"] == 7
        assert rank["passes"] == 3  # 3 updates of 2 x 4 samples per pass of 24
        assert rank["difference"] < 1e-6
