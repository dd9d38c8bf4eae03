"""Fresh-process measurements: import cost and a whole training run, as a user pays them."""

from __future__ import annotations

import platform
import resource
import statistics
import subprocess
import sys
import textwrap

import torch

IMPORT_BASE = "import torch, accelerate"
IMPORT_OURS = "import torch, accelerate, pytorch_accel, pytorch_accel.callbacks"

WHOLE_RUN = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.set_num_threads(1)
    from benchmarks import loops
    model, data = loops.make_mlp(), loops.mlp_data(32 * 200)
    run = {loop}
    run(data, 32, lambda: None)
    """
)

RUNS = {
    "hand-written": "loops.hand_written(model)",
    "pytorch-accel, default callbacks": "loops.pytorch_accel_trainer(model, True)",
    "pytorch-accelerated": "loops.pytorch_accelerated_trainer(model)",
}


def machine_description() -> dict[str, object]:
    """The facts a reader needs to compare these numbers with their own."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "processor": platform.processor() or platform.machine(),
        "threads": 1,
    }


def child_cpu_seconds(code: str) -> float:
    """CPU time (user + system) of ``python -c code`` in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(rounds: int) -> dict[str, dict[str, float]]:
    """Median CPU seconds of imports and of a 200-step run, alternating in fresh processes."""
    programs = {"import torch + accelerate": IMPORT_BASE, "... + pytorch_accel": IMPORT_OURS}
    for name, loop in RUNS.items():
        if name != "pytorch-accelerated" or _installed("pytorch_accelerated"):
            programs[f"200-step run: {name}"] = WHOLE_RUN.format(loop=loop)
    samples: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(rounds):
        for name, code in programs.items():
            samples[name].append(child_cpu_seconds(code))
    return {
        name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}
        for name, values in samples.items()
    }


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
