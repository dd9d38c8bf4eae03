"""The save and load events in 2 processes: fired on every one, a file per rank, no hang."""

from __future__ import annotations

from pathlib import Path

from launcher import launch


def test_the_save_and_load_events_fire_on_every_process(tmp_path: Path) -> None:
    outcome = launch("checkpoint_events.py", out_dir=tmp_path, timeout=240)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    names = ["updates-00000002", "updates-00000004"]
    for rank, result in enumerate(outcome.ranks):
        for mode in ("blocking", "background"):
            # every state holds (and its manifest covers) both processes' files
            assert result[mode]["states"] == {
                name: ["card_rank0.txt", "card_rank1.txt"] for name in names
            }
            assert result[mode]["events"] == [["save_state", name] for name in names]
        checkpoint_keys = ["model_state_dict", "optimizer_state_dict", "saved_by"]
        assert result["load_and_checkpoint"] == [
            ["load_state", f"{rank} 2"],
            ["save_checkpoint", checkpoint_keys],
            ["load_checkpoint", 0],  # the main process's dict is the one written
        ]
        assert result["saved_by"] == 0
        assert result["failed_left"] == []
        assert result["tampered"].startswith("TrainingStateError: ")
        assert "card_rank1.txt' is" in result["tampered"]
    assert outcome.ranks[1]["failed"] == "RuntimeError: no card on rank 1"
    assert outcome.ranks[0]["failed"].startswith("TrainingStateError: ")
    assert "another process could not write its part" in outcome.ranks[0]["failed"]
