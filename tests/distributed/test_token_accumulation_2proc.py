"""Token-exact accumulation in 2 processes: equal to one large batch of both processes' data."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch

pytest.importorskip("transformers")


def test_two_processes_accumulate_tokens_like_one_large_batch(tmp_path: Path) -> None:
    outcome = launch("token_accumulation.py", out_dir=tmp_path, timeout=240)
    assert outcome.returncode == 0, outcome.output[-4000:]
    for result in outcome.ranks:
        assert result["accumulated"] < 1e-6
        assert result["one_batch_per_update"] < 1e-6  # the mean over both processes' tokens
        assert result["gpt2_accumulated"] < 1e-6
        assert result["uncounted"] > 1e-3  # by count, the processes' means weigh alike
        # one per window (2 epochs of 2 windows), and one at the run's first batch
        assert result["extra_all_reduces"] == 4 + 1
        # the token mean; the last batch's real row is weighted by its share of the count
        assert result["eval_loss_error"] < 0.05
