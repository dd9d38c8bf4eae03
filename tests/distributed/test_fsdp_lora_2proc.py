"""A LoRA model under FSDP2 in 2 gloo processes: trains like DDP, exports, resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch

pytest.importorskip("peft")
pytest.importorskip("transformers")


def test_a_lora_model_trains_saves_and_resumes_under_fsdp2(tmp_path: Path) -> None:
    outcome = launch("fsdp_lora.py", out_dir=tmp_path, timeout=300)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    for result in outcome.ranks:
        assert result["type"] == "DistributedType.FSDP"
        assert result["sharded"]  # every parameter a DTensor, the frozen base's too
        assert result["lora_keys"] == 2
        assert result["adapter_moved"] > 1e-3  # the adapter trained
        assert result["base_moved"] == 0.0  # the base model is frozen
        assert result["fsdp_vs_ddp"] <= 1e-6  # the same adapter as the DDP run
        # a DDP training state holds the adapter only, and resumes exactly (issue 42)
        assert result["ddp_state_is_adapter"]
        assert result["ddp_resumed_vs_straight"] == 0.0
        # save_model gathers the adapter and writes it alone, for PeftModel.from_pretrained
        assert "adapter_model.safetensors" in result["exported"]
        assert "model.safetensors" not in result["exported"]
        assert result["exported_equal"]
        # a training state by FSDP's writer, with each process's file from on_save_training_state
        assert result["state_files"] == ["card_rank0.txt", "card_rank1.txt"]
        assert result["resumed_vs_straight"] <= 1e-6
        assert result["failed_left"] == []
    first, second = outcome.ranks
    assert second.pop("failed") == "RuntimeError: no card on rank 1"
    # FSDP's states are written by the one path DDP's are (issue 40): its message
    assert "another process could not write its part" in first.pop("failed")
    assert first == second
