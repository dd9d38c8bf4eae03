"""One run directory in 2 processes: the main process's name, on every rank, one directory."""

from __future__ import annotations

from pathlib import Path

from helpers import succeeded
from launcher import launch


def test_both_processes_write_in_one_run_directory(tmp_path: Path) -> None:
    result = launch("output_dir.py", out_dir=tmp_path)
    assert succeeded(result.returncode, result.output, "AFTER-TRAINING"), result.output[-4000:]
    rank0, rank1 = result.ranks
    assert rank0["local_hour"] != rank1["local_hour"]  # the clocks read differently
    for key in ("drawn", "after_first", "drawn_again", "after_resume", "resumed_from"):
        assert rank0[key] == rank1[key], key
    runs = tmp_path / "runs"
    first = Path(rank0["after_first"])
    assert first.parent == runs
    assert rank0["drawn_again"] != rank0["drawn"]  # the relaunch drew a name of its own ...
    assert rank0["after_resume"] == str(first)  # ... and continued the run it resumed
    assert rank0["resumed_from"] == str(first / "training_states" / "final")
    assert [path.name for path in runs.iterdir()] == [first.name]
    assert {path.name for path in (first / "training_states").iterdir()} == {
        "epoch-0001",
        "epoch-0002",
        "final",
    }
    assert (first / "best_model.pt").is_file()
    assert (first / "metrics.csv").read_text().count("\n") == 3  # header, epochs 1 and 2
    # a third trainer with the first run's name, not resuming, is refused on both processes
    for rank in (rank0, rank1):
        assert "already holds another run's files" in rank["refused"], rank["refused"]
        assert repr(str(first)) in rank["refused"]
