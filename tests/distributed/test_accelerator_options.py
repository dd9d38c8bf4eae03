"""Process-group and DDP options through Trainer(accelerator_kwargs=...), in 2 processes."""

from __future__ import annotations

from pathlib import Path

from launcher import launch


def test_the_process_group_timeout_and_ddp_options_reach_torch(tmp_path: Path) -> None:
    outcome = launch("accelerator_options.py", out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    for rank in outcome.ranks:
        assert rank == {"processes": 2, "timeout_s": 77.0, "find_unused_parameters": True}
