"""CPU multi-process runs never silently train independent copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from launcher import launch


def test_accelerate_launch_multi_gpu_on_cpu_forms_one_process_group(tmp_path: Path) -> None:
    result = launch(
        "launchers.py", "automatic", out_dir=tmp_path, launcher="accelerate", use_cpu=False
    )
    assert result.returncode == 0, result.output[-4000:]
    first, second = result.ranks
    assert first["num_processes"] == second["num_processes"] == 2
    assert first["distributed_type"] == "DistributedType.MULTI_CPU"
    assert first["params"] == second["params"]  # one model, not two copies
    # SyncBatchNorm is GPU-only in DDP: on CPU the callback warns and leaves BatchNorm
    assert first["batchnorm"] == "BatchNorm1d"
    assert "rejects SyncBatchNorm on CPU" in first["warnings"][0]


def test_a_mismatched_accelerator_names_the_fix(tmp_path: Path) -> None:
    result = launch("launchers.py", "mismatch", out_dir=tmp_path, use_cpu=False)
    assert result.returncode == 0, result.output[-4000:]
    for rank in result.ranks:
        assert "launcher started 2 processes" in rank["error"]
        assert "ACCELERATE_USE_CPU=1" in rank["error"]


@pytest.mark.parametrize("precision", ["bf16"])
def test_bf16_in_two_processes_stays_close_to_fp32(tmp_path: Path, precision: str) -> None:
    result = launch(
        "precision.py", out_dir=tmp_path, extra_env={"ACCELERATE_MIXED_PRECISION": precision}
    )
    assert result.returncode == 0, result.output[-4000:]
    for rank in result.ranks:
        assert rank["mixed_precision"] == precision
        assert rank["max_difference"] < 1e-2  # documented bf16 tolerance on this model
