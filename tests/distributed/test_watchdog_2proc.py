"""A hung process named within the watchdog's timeout, in 2 real processes (issue 43).

Process 1 stops (``SIGSTOP``), sleeps inside a step, or waits for a data-loader worker that
blocks; ``WatchdogCallback(timeout_s=3)`` must name process 1 (and only it) as behind within
the timeout and a few heartbeats, write every responding process's stacks, and end the job
with ``WatchdogCallback.EXIT_CODE``, not after torch's 30-minute process-group timeout. A
healthy run with a straggler and evaluations longer than the timeout is not stopped, and
records which process is the slowest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import _descendants as descendants
from helpers import run_process_group
from launcher import REPO, SCRIPTS, launch

from pytorch_accel.callbacks import WatchdogCallback

WATCHDOG_EXIT_CODE = WatchdogCallback.EXIT_CODE

TIMEOUT_S = 3
REPORT_WITHIN_S = TIMEOUT_S + 4  # the timeout, a heartbeat or two, and a busy machine


def environment() -> dict[str, str]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
    }
    return env


def command(out: Path, scenario: str) -> list[str]:
    script = [str(SCRIPTS / "watchdog.py"), str(out), scenario]
    if scenario in ("single", "evaluate"):
        return [sys.executable, *script]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launcher, "--nproc_per_node=2", *script]


def check_report(out: Path, stalled: int, size: int = 2) -> dict[str, Any]:
    """The report names ``stalled`` alone, within the time; return the verdict."""
    directory = out / "watchdog"
    verdict = json.loads((directory / "hang-report.json").read_text())
    stall = json.loads((out / "stall.json").read_text())
    assert stall["rank"] == stalled
    took = verdict["time"] - stall["time"]
    print(f"stall to report: {took:.2f} s")  # the measurement the issue asks for
    assert TIMEOUT_S <= took < REPORT_WITHIN_S
    assert verdict["behind"] == [stalled]
    assert verdict["exit_code"] == WATCHDOG_EXIT_CODE
    report = (directory / "hang-report.txt").read_text()
    assert f"BEHIND  process {stalled} " in report
    assert f"ending the job (every process exits with code {WATCHDOG_EXIT_CODE})" in report
    for rank in set(range(size)) - {stalled}:  # waiting in a collective, and shown so
        assert f"waiting process {rank} " in report
    return verdict


def test_a_stopped_process_is_named_from_its_heartbeat(tmp_path: Path) -> None:
    """Process 1 stops itself; process 0 names it from its stale heartbeat and exits."""
    process = subprocess.Popen(
        command(tmp_path, "sigstop"),
        cwd=REPO,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    stopped = None
    try:
        verdict_file = tmp_path / "watchdog" / "hang-report.json"
        deadline = time.monotonic() + 90
        while not verdict_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        verdict = check_report(tmp_path, stalled=1)
        first, second = verdict["processes"]["0"], verdict["processes"]["1"]
        assert not second["responding"]
        assert first["responding"]
        assert second["doing"].startswith("batch 3: computing the loss")
        assert first["doing"].startswith("batch 3: backward")
        stopped = int(second["pid"])
        report = tmp_path / "watchdog" / "hang-report.txt"
        deadline = time.monotonic() + 20  # process 0 reports, then exits
        while "=== process 0 ===" not in report.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = report.read_text()
        assert "process 1 (pid" in text
        assert "NOT RESPONDING" in text
        assert "no stacks: the process did not respond" in text
        assert "backward" in text.split("=== process 0 ===")[1]  # its stack: waiting there
        time.sleep(1)
        # torchrun would kill the stopped process 30 s after process 0's exit: do it now
        os.kill(stopped, signal.SIGKILL)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            for pid in (*descendants(process.pid), process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode != 0
    assert f"exitcode  : {WATCHDOG_EXIT_CODE}" in output, output[-3000:]


def run(scenario: str, out: Path) -> str:
    """Launch ``scenario``; it ends by itself with the watchdog's exit code."""
    started = time.monotonic()
    returncode, output = run_process_group(
        command(out, scenario), env=environment(), cwd=REPO, timeout=90
    )
    assert time.monotonic() - started < 60, output[-3000:]
    if scenario in ("single", "evaluate"):
        assert returncode == WATCHDOG_EXIT_CODE, output[-3000:]
    else:
        assert returncode != 0
        assert f"exitcode  : {WATCHDOG_EXIT_CODE}" in output, output[-3000:]
    return output


def test_a_process_sleeping_in_a_step_is_named_with_its_stack(tmp_path: Path) -> None:
    output = run("sleep", tmp_path)
    verdict = check_report(tmp_path, stalled=1)
    assert verdict["processes"]["1"]["responding"]
    stacks = (tmp_path / "watchdog" / "stacks-rank1.txt").read_text()
    assert "in calculate_train_batch_loss" in stacks
    assert "time.sleep(60)" in stacks
    waiting = (tmp_path / "watchdog" / "stacks-rank0.txt").read_text()
    assert "backward" in waiting
    report = (tmp_path / "watchdog" / "hang-report.txt").read_text()
    assert "=== process 0 ===" in report
    assert "=== process 1 ===" in report
    assert "WatchdogCallback: process 1 behind" in output  # the log and standard error


def test_a_blocked_data_worker_is_named(tmp_path: Path) -> None:
    """Process 1 waits for its worker (killed on the way out, or the job would linger)."""
    run("worker", tmp_path)
    verdict = check_report(tmp_path, stalled=1)
    # accelerate's loader reads a batch ahead: it waits for batch 3 before batch 2 runs
    assert verdict["processes"]["1"]["doing"].startswith("after batch 1: ")
    stacks = (tmp_path / "watchdog" / "stacks-rank1.txt").read_text()
    assert "_next_data" in stacks  # waiting on the data loader


def test_one_process_is_named_alone(tmp_path: Path) -> None:
    run("single", tmp_path)
    verdict = check_report(tmp_path, stalled=0, size=1)
    assert verdict["same_point"]
    report = (tmp_path / "watchdog" / "hang-report.txt").read_text()
    assert report.startswith("WatchdogCallback: process 0 made no progress for 3 s")


def test_a_hang_in_evaluate_is_named(tmp_path: Path) -> None:
    run("evaluate", tmp_path)
    verdict = check_report(tmp_path, stalled=0, size=1)
    process = verdict["processes"]["0"]
    assert process["phase"] == "eval"
    assert process["doing"] == "eval batch 2: computing the loss"


def test_a_healthy_run_with_long_evaluations_is_not_stopped(tmp_path: Path) -> None:
    """Evaluation steps are progress; the straggler is named at each epoch's end."""
    outcome = launch("watchdog.py", "healthy", out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-3000:]
    assert not (tmp_path / "watchdog" / "hang-report.json").exists()
    first, second = outcome.ranks
    assert first == second
    assert first["train_slowest_process"][0] == 1  # it sleeps in each step of epoch 1
    assert first["train_step_skew"][0] > 1.5
    assert len(first["train_step_seconds"]) == 2
    assert "step times, epoch 1: slowest process 1" in outcome.output
    with contextlib.suppress(FileNotFoundError):  # heartbeats are removed at the run's end
        assert not list((tmp_path / "watchdog").glob("heartbeat-*"))
