"""Every built-in callback works in a 2-process run, with the same results on both ranks."""

from __future__ import annotations

import math
from pathlib import Path

from launcher import launch


def test_every_callback_in_two_processes(tmp_path: Path) -> None:
    result = launch("catalogue.py", out_dir=tmp_path, timeout=300)
    assert result.returncode == 0, result.output[-4000:]
    first, second = result.ranks
    assert first.keys() == second.keys()
    assert len(first) >= 16
    for name, outcome in first.items():
        assert outcome["epochs"] in (2, 3), name
        assert math.isfinite(outcome["evaluation_loss"]), name
        assert outcome == second[name], name  # every rank ends with the same history
