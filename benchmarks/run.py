"""Measure the trainer's cost over a hand-written loop: ``python -m benchmarks.run``.

Method (see docs/performance.md):

- All loops train the same model on the same data, one thread, in one process, in interleaved
  rounds (a new random order each round), so drift in machine speed hits every loop alike.
- Per-step cost is CPU time between the same point of consecutive steps (every loop calls the
  same probe from its loss function, once per step), so it covers loading, forward, backward,
  update and all per-step bookkeeping. Each round reports the median over its steps, which is
  robust to the scheduler's and the hypervisor's hiccups. The fixed cost of a run (building
  dataloaders, run events) is the epoch's CPU time minus its steps.
- Ratios and differences are paired within a round against the hand-written loop; a second
  copy of the hand-written loop is the raw-vs-raw control that shows the noise floor.
- Python calls per step are counted (deterministically) with ``sys.setprofile``.
- Import time and a whole run are measured in fresh processes.
- The suites of ``benchmarks.suites`` pair the trainer against hand-written loops in 2
  processes (DDP training), in evaluation and prediction (1 and 2 processes), over an image
  folder with loader workers, and at start-up (import, ``train()`` fixed cost).

Results go to ``benchmarks/results/``: ``overhead.md`` (tables), ``overhead.json`` and, when
matplotlib is installed, ``overhead.png`` (one process) and ``suites.png`` (the suites).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks import fresh, loops, report, suites
from benchmarks.stats import median_interval

RESULTS = Path(__file__).parent / "results"
WARM_UP_STEPS = 3
LOGGING_ROW = "pytorch-accel, default callbacks + logging every 50 updates"
DEFAULT_ROW = "pytorch-accel, default callbacks"
EVERY_UPDATE_ROW = "pytorch-accel, default callbacks + logging every update"
# glibc adapts its mmap and trim thresholds while a program runs, which makes timings drift;
# fixed thresholds keep every round on the same allocator behaviour.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"


@dataclass
class Workload:
    """One model size: how to build the model and data, and how many steps to time."""

    name: str
    make_model: Callable[[], nn.Module]
    make_data: Callable[[int], TensorDataset]
    batch_size: int
    steps: int
    rounds: int


@dataclass
class Samples:
    """Per-round measurements of one loop."""

    per_step: list[float] = field(default_factory=list)
    fixed: list[float] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)  # the epoch's CPU time, steps and all


def build_loops(make_model: Callable[[], nn.Module]) -> dict[str, loops.Loop]:
    """Create every loop once, each with its own copy of the model."""
    built: dict[str, loops.Loop | None] = {
        "hand-written": loops.hand_written(make_model()),
        "hand-written (control)": loops.hand_written(make_model()),
        "accelerate loop": loops.accelerate_loop(make_model()),
        "pytorch-accel, default callbacks": loops.pytorch_accel_trainer(make_model(), True),
        LOGGING_ROW: loops.pytorch_accel_step_logging(make_model(), every_n_updates=50),
        EVERY_UPDATE_ROW: loops.pytorch_accel_step_logging(make_model(), every_n_updates=1),
        "pytorch-accel, no callbacks": loops.pytorch_accel_trainer(make_model(), False),
        "pytorch-accelerated": loops.pytorch_accelerated_trainer(make_model()),
    }
    return {name: loop for name, loop in built.items() if loop is not None}


def time_epoch(loop: loops.Loop, dataset: TensorDataset, batch_size: int) -> tuple[float, float]:
    """Return (median CPU seconds per step, fixed CPU seconds of the run) for one epoch."""
    stamps: list[float] = []
    start = time.process_time()
    loop(dataset, batch_size, lambda: stamps.append(time.process_time()))
    total = time.process_time() - start
    steps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    per_step = statistics.median(steps[WARM_UP_STEPS:] or steps)
    return per_step, total - len(stamps) * per_step


def measure(workload: Workload) -> dict[str, Samples]:
    """Interleaved rounds of every loop, in a new order each round; round 0 is a warm-up."""
    built = build_loops(workload.make_model)
    dataset = workload.make_data(workload.steps * workload.batch_size)
    samples = {name: Samples() for name in built}
    order = list(built)
    shuffler = random.Random(0)
    for round_index in range(workload.rounds + 1):
        shuffler.shuffle(order)
        for name in order:
            per_step, fixed = time_epoch(built[name], dataset, workload.batch_size)
            if round_index > 0:
                samples[name].per_step.append(per_step)
                samples[name].fixed.append(fixed)
                samples[name].whole.append(fixed + per_step * workload.steps)
    return samples


def count_calls(workload: Workload) -> dict[str, float]:
    """Python function calls per step of each loop, by differencing K and 2K steps."""
    built = build_loops(workload.make_model)
    short = workload.make_data(workload.steps * workload.batch_size)
    long = workload.make_data(2 * workload.steps * workload.batch_size)
    counts: dict[str, float] = {}
    for name, loop in built.items():
        loop(short, workload.batch_size, loops.no_probe)  # warm caches and lazy imports
        calls = [_calls_in(loop, data, workload.batch_size) for data in (short, long)]
        counts[name] = (calls[1] - calls[0]) / workload.steps
    return counts


def _calls_in(loop: loops.Loop, dataset: TensorDataset, batch_size: int) -> int:
    counter = [0]

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "call":
            counter[0] += 1

    sys.setprofile(profile)
    try:
        loop(dataset, batch_size, loops.no_probe)
    finally:
        sys.setprofile(None)
    return counter[0]


def summarise(samples: dict[str, Samples], calls: dict[str, float]) -> list[dict[str, object]]:
    """Median and min-max of each loop's cost, paired against the hand-written loop."""
    base = samples["hand-written"].per_step
    rows = []
    for name, sample in samples.items():
        extra = [(own - ref) * 1e6 for own, ref in zip(sample.per_step, base, strict=True)]
        ratio = [own / ref for own, ref in zip(sample.per_step, base, strict=True)]
        rows.append(
            {
                "loop": name,
                "per_step_us": statistics.median(sample.per_step) * 1e6,
                "extra_us": statistics.median(extra),
                "extra_us_ci95": median_interval(extra),
                "extra_us_range": (min(extra), max(extra)),
                "ratio": statistics.median(ratio),
                "ratio_range": (min(ratio), max(ratio)),
                "fixed_ms": statistics.median(sample.fixed) * 1e3,
                "calls_per_step": calls.get(name),
            }
        )
    return rows


def paired_overhead(samples: dict[str, Samples], name: str, reference: str) -> dict[str, float]:
    """The per-step and per-run cost of ``name`` over ``reference``, paired within rounds.

    Returns:
        The median ratio of per-step times (with its min-max), the median extra fixed
        cost per run in ms (where the logging points, a few steps each run, land), and the
        median ratio of whole epochs (steps and fixed costs: what reading logging points in
        bursts costs, amortised), with its min-max.
    """
    own, ref = samples[name], samples[reference]
    ratios = [a / b for a, b in zip(own.per_step, ref.per_step, strict=True)]
    fixed = [(a - b) * 1e3 for a, b in zip(own.fixed, ref.fixed, strict=True)]
    whole = [a / b for a, b in zip(own.whole, ref.whole, strict=True)]
    return {
        "per_step_ratio": statistics.median(ratios),
        "per_step_ratio_min": min(ratios),
        "per_step_ratio_max": max(ratios),
        "extra_fixed_ms": statistics.median(fixed),
        "whole_ratio": statistics.median(whole) if whole else math.nan,
        "whole_ratio_min": min(whole, default=math.nan),
        "whole_ratio_max": max(whole, default=math.nan),
    }


WORKLOADS = {
    "tiny": Workload("tiny MLP, batch 32", loops.make_mlp, loops.mlp_data, 32, 100, 150),
    "medium": Workload("medium CNN, batch 32", loops.make_cnn, loops.cnn_data, 32, 16, 40),
}


def run_with_tuned_malloc(module: str) -> None:
    """Run ``python -m module`` again with ``MALLOC_TUNABLES`` and one thread, unless it is.

    Replaces the current process (``os.execve``), keeping its command-line arguments.
    """
    if os.environ.get("GLIBC_TUNABLES") == MALLOC_TUNABLES:
        return
    environment = {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES, "OMP_NUM_THREADS": "1"}
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], environment)


def main(argv: list[str] | None = None) -> None:
    """Run the chosen workloads and suites, writing the results after each one finishes.

    A part that fails is reported and recorded (``failed`` in ``overhead.json``) and the
    others still run; the exit status is then 1. What was measured before a crash is on disk.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--suites", nargs="*", default=list(suites.ALL), choices=suites.ALL)
    parser.add_argument("--no-fresh", action="store_true", help="skip the fresh-process figures")
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke test")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="the results folder (benchmarks/results)"
    )
    args = parser.parse_args(argv)
    run_with_tuned_malloc("benchmarks.run")
    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "machine": fresh.machine_description(),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick,
        "suites": {},
        "failed": {},
    }
    parts: list[tuple[str, Callable[[], Any]]] = [
        (key, functools.partial(measure_workload, WORKLOADS[key], args.quick))
        for key in args.workloads
    ]
    if not args.no_fresh:
        parts.append(("fresh", functools.partial(fresh.measure, rounds=2 if args.quick else 5)))
    parts += [
        (f"suites.{suite}", functools.partial(suites.measure_one, suite, args.quick))
        for suite in args.suites
    ]
    for name, measure_part in parts:
        started = time.perf_counter()
        try:
            figures = measure_part()
        except Exception:  # keep what the other parts measure; report this one
            results["failed"][name] = traceback.format_exc()
            print(f"benchmarks.run: {name} failed:\n{results['failed'][name]}", flush=True)
        else:
            if name.startswith("suites."):
                results["suites"][name.removeprefix("suites.")] = figures
            else:
                results[name] = figures
            print(f"{name}: done in {time.perf_counter() - started:.0f} s", flush=True)
        save_results(results, args.out)
    print(report.markdown(results))
    chart = report.chart(results, args.out / "overhead.png")
    chart = report.suites_chart(results["suites"], args.out / "suites.png") and chart
    print(f"results in {args.out}" + ("" if chart else " (install matplotlib for the chart)"))
    if results["failed"]:
        sys.exit(f"benchmarks.run: failed: {', '.join(results['failed'])}")


def measure_workload(workload: Workload, quick: bool) -> dict[str, Any]:
    """One process's paired loops on one workload, with the step-logging overheads."""
    if quick:
        workload = dataclasses.replace(workload, rounds=3)
    print(
        f"measuring {workload.name}: {workload.rounds} rounds x {workload.steps} steps", flush=True
    )
    samples = measure(workload)
    figures = {
        "name": workload.name,
        "rounds": workload.rounds,
        "steps": workload.steps,
        "rows": summarise(samples, count_calls(workload)),
        "logging_overhead": paired_overhead(samples, LOGGING_ROW, DEFAULT_ROW),
        "logging_every_update_overhead": paired_overhead(samples, EVERY_UPDATE_ROW, DEFAULT_ROW),
    }
    print(f"{LOGGING_ROW} vs default: {figures['logging_overhead']}", flush=True)
    print(f"{EVERY_UPDATE_ROW} vs default: {figures['logging_every_update_overhead']}", flush=True)
    return figures


def save_results(results: dict[str, Any], folder: Path) -> None:
    """Write ``overhead.json`` and ``overhead.md`` (each replaced whole: never half-written)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("overhead.json", json.dumps(results, indent=2)),
        ("overhead.md", report.markdown(results)),
    ):
        partial = folder / f".{name}.partial"
        partial.write_text(text)
        os.replace(partial, folder / name)


if __name__ == "__main__":
    main()
