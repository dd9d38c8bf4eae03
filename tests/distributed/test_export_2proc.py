"""Trainer.save_model in 2 processes: one export, the same refusal on every process."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch

pytest.importorskip("safetensors")


def test_the_main_process_exports_and_every_process_agrees(tmp_path: Path) -> None:
    result = launch("export.py", out_dir=tmp_path)
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    for rank in result.ranks:
        assert rank["files"] == ["model.safetensors"]
        assert rank["equal"]
        assert rank["refused"][1]
        assert rank["after_overwrite"] == ["model.safetensors"]
    assert [rank["refused"][0] for rank in result.ranks] == ["FileExistsError", "RuntimeError"]
