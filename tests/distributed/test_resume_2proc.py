"""Exact resume and preemption in two real processes (gloo), with shuffling and workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for_text
from launcher import REPO, SCRIPTS, launch

from pytorch_accel._checkpointing.store import verify_training_state
from pytorch_accel.training_state import find_training_states

pytestmark = pytest.mark.distributed

COMPARED = ("weights", "moments", "lr", "history", "num_updates", "ema")
COMMON = ("--accumulation", "3", "--workers", "1")


def launched(out_dir: Path, *args: str) -> list[dict[str, Any]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    result = launch("resume_job.py", *COMMON, *args, out_dir=out_dir, timeout=240)
    assert result.returncode == 0, result.output[-4000:]
    return result.ranks


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    ranks = launched(tmp_path_factory.mktemp("uninterrupted"))
    assert len(ranks) == 2
    return ranks


def assert_same_runs(resumed: list[dict[str, Any]], uninterrupted: list[dict[str, Any]]) -> None:
    assert len(resumed) == len(uninterrupted) == 2
    for rank, (mine, reference) in enumerate(zip(resumed, uninterrupted, strict=True)):
        for key in COMPARED:
            assert mine[key] == reference[key], (rank, key)


def test_two_processes_resume_inside_an_accumulation_window_bitwise(
    tmp_path: Path, uninterrupted: list[dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    (tmp_path / "first").mkdir()
    first = launch(
        "resume_job.py",
        *COMMON,
        "--save-dir",
        str(save_dir),
        "--die-after-step",
        "4",
        out_dir=tmp_path / "first",
        timeout=240,
    )
    assert first.returncode == 0, first.output[-4000:]
    assert first.ranks == []  # both died right after the save
    assert sorted(p.name for p in (save_dir / "state").glob("trainer_rank_*.pt")) == [
        "trainer_rank_0.pt",
        "trainer_rank_1.pt",
    ]
    resumed = launched(
        tmp_path / "second", "--save-dir", str(save_dir), "--resume-from", str(save_dir / "state")
    )
    assert_same_runs(resumed, uninterrupted)
    for mine, reference in zip(resumed, uninterrupted, strict=True):
        # each process's part of the logging interval in progress at the save is its own
        logged = mine["step_losses"]
        assert logged
        assert logged == {update: reference["step_losses"][update] for update in logged}


def test_sigterm_to_one_process_saves_the_same_step_on_both_and_exits_0(
    tmp_path: Path, uninterrupted: list[dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    out = tmp_path / "preempted"
    out.mkdir()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPTS / "resume_job.py"),
        str(out),
        *COMMON,
        "--save-dir",
        str(save_dir),
        "--pace",
        "0.05",
    ]
    env = {**_env(), "PYTHONPATH": os.pathsep.join(map(str, (REPO, REPO / "tests", SCRIPTS)))}
    process = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        pid = int(wait_for_text(out / "progress1").split()[0])
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-4000:]
    states = find_training_states(save_dir)
    assert len(states) == 1, output[-2000:]
    assert states[0].name.startswith("preempted-")
    resumed = launched(tmp_path / "resumed", "--save-dir", str(save_dir), "--resume-from", "latest")
    assert all(rank["resumed_from"] == str(states[0]) for rank in resumed)
    assert_same_runs(resumed, uninterrupted)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}


def test_two_processes_save_in_the_background_and_resume_bitwise(
    tmp_path: Path, uninterrupted: list[dict[str, Any]]
) -> None:
    """Each rank writes its files; a state is published once both did; training is unchanged."""
    save_dir = tmp_path / "states"
    args = ("--save-dir", str(save_dir), "--every-n-steps", "3", "--async-save")
    assert_same_runs(launched(tmp_path / "whole", *args), uninterrupted)
    states = find_training_states(save_dir)
    assert [state.name for state in states] == ["updates-00000003", "updates-00000006"]
    for state in states:
        verify_training_state(state, 2, "test")  # both ranks' files, digests as recorded
    assert not list(save_dir.glob(".*"))
    resumed = launched(tmp_path / "resumed", *args, "--resume-from", str(states[0]))
    assert_same_runs(resumed, uninterrupted)
