"""Sharding requests that cannot run here are refused (FSDP itself: tests/distributed)."""

from __future__ import annotations

import pytest
from helpers import make_trainer


@pytest.mark.bad_input
def test_deepspeed_without_cuda_is_refused_not_trained_as_ddp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(
        ValueError, match=r"Trainer: DeepSpeed was asked for .* FullyShardedDataParallelPlugin"
    ):
        make_trainer()
