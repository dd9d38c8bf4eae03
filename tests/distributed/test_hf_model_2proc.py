"""A Hugging Face model with dict batches in 2 processes, with no subclass."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch

pytest.importorskip("transformers")


def test_a_transformers_model_in_two_processes_matches_one_process(tmp_path: Path) -> None:
    outcome = launch("hf_model.py", out_dir=tmp_path, timeout=180)
    assert outcome.returncode == 0, outcome.output[-4000:]
    first, second = outcome.ranks
    for result in (first, second):
        assert result["difference_to_one_process"] < 1e-5
        assert result["logits_shape"] == [12, 2]  # every sample once, the logits
        assert result["logits_difference"] < 1e-5
    assert first["accuracy"] == second["accuracy"]
    assert first["eval_loss"] == second["eval_loss"]
