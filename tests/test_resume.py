"""Exact resume in new processes: a resumed run ends bitwise where an uninterrupted one does."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for_text

from pytorch_accel._checkpointing.store import TrainingStateError, verify_training_state
from pytorch_accel.training_state import MANIFEST_NAME, find_training_states

REPO = Path(__file__).parents[1]
JOB = REPO / "tests" / "distributed" / "scripts" / "resume_job.py"
COMPARED = ("weights", "moments", "lr", "history", "num_updates", "ema")


def job_command(out_dir: Path, *args: str, cuda: bool = False) -> tuple[list[str], dict[str, str]]:
    """Return the job's command and environment; it trains on the CPU unless ``cuda``.

    The device is set here rather than inherited: module fixtures start jobs before the
    per-test environment (conftest's ``ACCELERATE_USE_CPU``) is in place.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{JOB.parent}",  # this checkout's package first
        "PYTHONUNBUFFERED": "1",
        "ACCELERATE_USE_CPU": "false" if cuda else "true",
    }
    return [sys.executable, str(JOB), str(out_dir), *args], env


def run_job(out_dir: Path, *args: str, cuda: bool = False) -> dict[str, Any]:
    command, env = job_command(out_dir, *args, cuda=cuda)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = out_dir / "rank0.json"
    return json.loads(report.read_text()) if report.exists() else {}


def assert_same_run(resumed: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    for key in COMPARED:
        assert resumed[key] == uninterrupted[key], key


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    root = tmp_path_factory.mktemp("uninterrupted")
    return {steps: run_job(root / str(steps), "--accumulation", str(steps)) for steps in (1, 3)}


@pytest.mark.parametrize(
    ("name", "accumulation", "die_after"),
    [
        ("mid-epoch", 1, ("--die-after-step", "4")),
        ("inside an accumulation window", 3, ("--die-after-step", "14")),
        ("last batch of an epoch", 3, ("--die-after-step", "10")),
        ("epoch boundary", 3, ("--die-after-epoch", "1")),
    ],
)
def test_resumed_run_is_bitwise_equal_to_uninterrupted(
    tmp_path: Path,
    uninterrupted: dict[int, dict[str, Any]],
    name: str,
    accumulation: int,
    die_after: tuple[str, str],
) -> None:
    save_dir = tmp_path / "states"
    common = ("--accumulation", str(accumulation), "--save-dir", str(save_dir))
    run_job(tmp_path / "first", *common, *die_after)
    assert not (tmp_path / "first" / "rank0.json").exists()  # it died right after the save
    resumed = run_job(tmp_path / "second", *common, "--resume-from", str(save_dir / "state"))
    assert resumed["resumed_from"] == str(save_dir / "state")
    assert_same_run(resumed, uninterrupted[accumulation])


@pytest.mark.cuda
def test_a_run_resumed_mid_epoch_on_cuda_is_bitwise_equal_to_uninterrupted(tmp_path: Path) -> None:
    """Dropout draws from the CUDA generator here, so its state must be restored too."""
    uninterrupted = run_job(tmp_path / "whole", cuda=True)
    assert uninterrupted["device"] == "cuda"
    common = ("--save-dir", str(tmp_path / "states"))
    run_job(tmp_path / "first", *common, "--die-after-step", "4", cuda=True)
    resumed = run_job(
        tmp_path / "second", *common, "--resume-from", str(tmp_path / "states" / "state"), cuda=True
    )
    assert_same_run(resumed, uninterrupted)


def test_states_differ_from_the_uninterrupted_end_before_resuming(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    """The comparison can fail: a run that stops early does not match the full run."""
    short = run_job(tmp_path / "short", "--epochs", "2")
    assert short["weights"] != uninterrupted[1]["weights"]


def test_kill_9_at_random_points_then_resume_latest_finishes_the_same_run(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    args = ("--save-dir", str(save_dir), "--every-n-steps", "1", "--max-checkpoints", "2")
    rng = random.Random(0)
    for attempt in range(3):
        out = tmp_path / f"killed{attempt}"
        command, env = job_command(out, *args, "--resume-from", "latest", "--pace", "0.05")
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_text(out / "progress0")
        time.sleep(rng.uniform(0.0, 0.6))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for state in find_training_states(save_dir):
            verify_training_state(state, 1, "test")  # every complete state is intact
    resumed = run_job(tmp_path / "last", *args, "--resume-from", "latest")
    assert resumed["resumed_from"] is not None
    assert_same_run(resumed, uninterrupted[1])


def test_kill_9_during_a_save_keeps_the_previous_state_and_ignores_the_partial_one(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    args = ("--save-dir", str(save_dir), "--every-n-steps", "3")
    out = tmp_path / "killed"
    command, env = job_command(out, *args, "--pace", "0.01", "--pause-in-save", "0.5")
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_text(save_dir / "updates-00000003" / MANIFEST_NAME)
    deadline = time.monotonic() + 60
    while not list(save_dir.glob(".updates-00000006.incomplete")) and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert (save_dir / ".updates-00000006.incomplete").is_dir()  # killed inside the save
    assert find_training_states(save_dir) == [save_dir / "updates-00000003"]
    resumed = run_job(tmp_path / "resumed", *args, "--resume-from", "latest")
    assert resumed["resumed_from"] == str(save_dir / "updates-00000003")
    assert not list(save_dir.glob(".*.incomplete"))  # cleaned up when the run started
    assert_same_run(resumed, uninterrupted[1])


def test_sigterm_saves_stops_and_exits_0_then_resumes_exactly(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    out = tmp_path / "preempted"
    command, env = job_command(out, "--save-dir", str(save_dir), "--pace", "0.05")
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wait_for_text(out / "progress0")
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output[-3000:]
    assert "Preempted by SIGTERM" in output
    assert not (out / "rank0.json").exists()  # it exited instead of finishing
    states = find_training_states(save_dir)
    assert [state.name[:10] for state in states] == ["preempted-"]
    resumed = run_job(tmp_path / "resumed", "--save-dir", str(save_dir), "--resume-from", "latest")
    assert_same_run(resumed, uninterrupted[1])


def test_kill_9_during_an_asynchronous_save_leaves_no_state_that_loads(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    """Killed after the background write, before the state was published: never loaded."""
    save_dir = tmp_path / "states"
    args = ("--save-dir", str(save_dir), "--every-n-steps", "3", "--async-save")
    out = tmp_path / "killed"
    command, env = job_command(out, *args, "--pace", "0.3")
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_text(save_dir / "updates-00000003" / MANIFEST_NAME)
    partial = save_dir / ".updates-00000006.incomplete"
    deadline = time.monotonic() + 60
    while not (partial / "trainer_rank_0.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # the last file written
    time.sleep(0.1)  # its step, and the next, take 0.3 s each: published after that
    process.send_signal(signal.SIGKILL)  # every file written and flushed, no manifest yet
    process.wait(timeout=30)
    assert (partial / "model.safetensors").is_file()
    assert not (partial / MANIFEST_NAME).exists()
    assert find_training_states(save_dir) == [save_dir / "updates-00000003"]
    with pytest.raises(TrainingStateError, match="not a complete training state"):
        verify_training_state(partial, 1, "test")
    resumed = run_job(tmp_path / "resumed", *args, "--resume-from", "latest")
    assert resumed["resumed_from"] == str(save_dir / "updates-00000003")
    assert not list(save_dir.glob(".*.incomplete"))  # cleaned up when the run started
    assert_same_run(resumed, uninterrupted[1])


def test_kill_9_at_random_points_with_asynchronous_saves_then_resume_latest(
    tmp_path: Path, uninterrupted: dict[int, dict[str, Any]]
) -> None:
    save_dir = tmp_path / "states"
    args = ("--save-dir", str(save_dir), "--every-n-steps", "1", "--async-save")
    rng = random.Random(1)
    for attempt in range(2):
        out = tmp_path / f"killed{attempt}"
        command, env = job_command(out, *args, "--resume-from", "latest", "--pace", "0.05")
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for_text(out / "progress0")
        time.sleep(rng.uniform(0.0, 0.6))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        for state in find_training_states(save_dir):
            verify_training_state(state, 1, "test")  # every complete state is intact
    resumed = run_job(tmp_path / "last", *args, "--resume-from", "latest")
    assert resumed["resumed_from"] is not None
    assert_same_run(resumed, uninterrupted[1])
