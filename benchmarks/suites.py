"""The paired suites beyond one training process: launched, summarised, ready for the report.

- ``train-2``: training in 2 CPU processes (gloo, DDP) against a hand-written DDP loop;
- ``inference-1``, ``inference-2``: ``evaluate`` and ``predict`` against hand-written
  ``no_grad`` loops with gathering, in 1 and 2 processes;
- ``images``: a whole 2-epoch run over an image folder with dataloader workers, the trainer's
  default loader against a careful hand-written one;
- ``startup``: import and ``train()`` fixed costs in fresh processes (``benchmarks.startup``);
- ``resume``: time to the first resumed step against the position in the pass, for a replayed
  and a stateful stream (``benchmarks.resume_position``).
- ``loaders``: the trainer's default dataloader against fixed worker counts on in-memory
  tensors, tokenised text and decoded images (``benchmarks.loaders``);
- ``call-2``: where a ``train()`` call's fixed cost goes in 2 processes, section by section,
  against hand-written DDP (``benchmarks.call_cost``);
- ``saving``: the stall per save of training states, blocking and in the background, against
  ``torch.save`` + ``fsync`` (``benchmarks.saving``).

Each suite but ``startup`` runs ``benchmarks.worker`` (one thread per process), under
``torchrun`` for 2 processes and as a plain script for 1 (under a launcher with
``ACCELERATE_USE_CPU=1`` accelerate would make even one process a gloo group of one, with
DDP and gathers), and its loops are paired within rounds against the first loop of their
group.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchmarks import call_cost, loaders, resume_position, saving, scratch_directory, startup
from benchmarks.stats import paired_difference, paired_ratio

# suite -> (worker suite, processes, rounds, scale)
SUITES: dict[str, tuple[str, int, int, float]] = {
    "train-2": ("train", 2, 20, 1.0),
    "inference-1": ("inference", 1, 20, 1.0),
    "inference-2": ("inference", 2, 20, 1.0),
    "images": ("images", 1, 10, 1.0),
}
TITLES = {
    "train-2": "Training, 2 CPU processes (gloo, DDP), medium CNN, batch 32 per process, 16 steps",
    "inference-1": "Evaluation and prediction, 1 process, medium CNN, batch 64, 16 batches",
    "inference-2": "Evaluation and prediction, 2 CPU processes (gloo), medium CNN, batch 64 per "
    "process, 16 batches each",
    "images": "Image folder (256 PNGs, 16x16) with dataloader workers, 2 epochs of 8 steps per "
    "run, medium CNN classifier, batch 32",
}
ALL = (*SUITES, "loaders", "startup", "call-2", "resume", "saving")
OWN_TABLES = ("loaders", "startup", "call-2", "resume", "saving")
"""The suites with tables of their own (not per-batch ratios against a hand-written loop)."""


def launch(suite: str, quick: bool) -> dict[str, Any]:
    """Run one worker suite under torchrun; return its per-round samples by group and loop."""
    name, processes, rounds, scale = SUITES[suite]
    if quick:
        rounds, scale = 2, scale / 4
    out = scratch_directory("bench-suite-") / "samples.json"
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    worker = ["-m", "benchmarks.worker", f"--suite={name}", f"--rounds={rounds}"]
    command = [sys.executable, *(launcher if processes > 1 else []), *worker]
    command += [f"--scale={scale}", f"--out={out}"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    if processes > 1:
        environment["ACCELERATE_USE_CPU"] = "1"  # else a plain single-process run, as users run
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    if done.returncode != 0 and out.exists():  # measured and written; a process ended badly
        print(f"warning: {suite} exited with status {done.returncode} after writing its results")
    if not out.exists():
        raise RuntimeError(
            f"benchmarks.suites: {suite} failed (exit status {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def summarise(samples: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per loop: its per-batch time and its ratios to the first loop of its group."""
    rows = []
    for group, loops in samples.items():
        base = next(iter(loops.values()))
        for name, sample in loops.items():
            rows.append(
                {
                    "group": group,
                    "loop": name,
                    "per_batch_ms": statistics.median(sample["per_batch"]) * 1e3,
                    "ratio": paired_ratio(sample["per_batch"], base["per_batch"]),
                    "whole_ratio": paired_ratio(sample["whole"], base["whole"]),
                    "extra_fixed_ms": paired_difference(sample["fixed"], base["fixed"], 1e3),
                    "rounds": len(sample["per_batch"]),
                }
            )
    return rows


def measure_one(suite: str, quick: bool) -> Any:
    """Run one suite; return its rows (``startup``, ``resume``, ``saving``: their figures)."""
    print(f"measuring {suite}", flush=True)
    if suite == "startup":
        return startup.measure(rounds=2 if quick else 10)
    if suite == "resume":
        return resume_position.measure(quick)
    if suite == "saving":
        return saving.measure(quick)
    if suite == "loaders":
        return loaders.measure(quick)
    if suite == "call-2":
        return call_cost.measure(quick)
    return {"name": TITLES[suite], "rows": summarise(launch(suite, quick))}


def measure(chosen: list[str], quick: bool) -> dict[str, Any]:
    """Run the chosen suites; return their results by suite (see ``measure_one``)."""
    return {suite: measure_one(suite, quick) for suite in chosen}
