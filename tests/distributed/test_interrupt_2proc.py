"""Ctrl-C reaching every process of a torchrun group: each rank fires on_exception once, exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import wait_for_text
from launcher import REPO, SCRIPTS


def interrupted(mode: str, out: Path) -> tuple[list[dict[str, object]], str, float]:
    """Launch ``interrupt.py``; once both ranks trained a few steps, SIGINT the whole group."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPTS / "interrupt.py"),
        str(out),
        mode,
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        for rank in (0, 1):
            wait_for_text(out / f"started{rank}", timeout=120)
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        output, _ = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    return reports, output, took


@pytest.mark.parametrize("mode", ["save", "plain"])
def test_every_rank_fires_on_exception_once_and_exits(mode: str, tmp_path: Path) -> None:
    reports, output, took = interrupted(mode, tmp_path)
    for report in reports:
        assert report["seen"] == ["KeyboardInterrupt"], output[-3000:]
        assert report["outcome"] == "KeyboardInterrupt"
    assert took < 20, output[-3000:]  # no rank waited for the launcher's kill (30 s)
    if mode == "save":  # both ranks saved the same step, agreed, then stopped there
        assert reports[0]["updates"] == reports[1]["updates"]
        assert reports[0]["states"] == reports[1]["states"]
        assert reports[0]["states"] == [f"interrupted-{reports[0]['updates']:08d}"]
