"""Start a script in several real processes and collect what each rank reports."""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import run_process_group

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).parents[2]


@dataclass
class Launch:
    """The outcome of one multi-process launch."""

    returncode: int
    output: str
    ranks: list[dict[str, Any]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(
    script: str,
    *args: str,
    out_dir: Path,
    nproc: int = 2,
    launcher: str = "torchrun",
    use_cpu: bool = True,
    extra_env: dict[str, str] | None = None,
    timeout: float = 180,
) -> Launch:
    """Run ``scripts/<script>`` in ``nproc`` processes; each rank writes ``rank<N>.json``.

    Args:
        script: File name under ``tests/distributed/scripts``.
        *args: Arguments after the output directory.
        out_dir: Where the ranks write their JSON reports.
        nproc: Number of processes.
        launcher: ``"torchrun"`` (``python -m torch.distributed.run --standalone``) or
            ``"accelerate"`` (``accelerate launch --multi_gpu``).
        use_cpu: Set ``ACCELERATE_USE_CPU=1``.
        extra_env: More environment variables.
        timeout: Seconds before the whole process group is killed.

    Returns:
        The exit code, the interleaved output, and each rank's report (in rank order).
    """
    # this checkout's package first: an editable install elsewhere must not stand in for it
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
    }
    env.pop("ACCELERATE_USE_CPU", None)
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "1"
    env.update(extra_env or {})
    target = [str(SCRIPTS / script), str(out_dir), *args]
    if launcher == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *target,
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            f"--num_processes={nproc}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            f"--main_process_port={free_port()}",
            *target,
        ]
    returncode, output = run_process_group(command, env=env, cwd=REPO, timeout=timeout)
    reports = sorted(out_dir.glob("rank*.json"), key=lambda path: int(path.stem[4:]))
    return Launch(returncode, output, [json.loads(path.read_text()) for path in reports])
