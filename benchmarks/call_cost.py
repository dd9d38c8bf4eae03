"""Where a ``train()`` call's fixed cost goes in 2 processes: ``python -m benchmarks.call_cost``.

Run as a suite (``python -m benchmarks.run --suites call-2``), it launches itself under
``torchrun`` with 2 CPU processes (gloo). Each process builds a ``Trainer`` with the default
callbacks and a hand-written DDP loop (``benchmarks.pipelines``) on the tiny MLP and on the
medium CNN, then runs interleaved rounds of one epoch (16 steps) of each, after a barrier.

The fixed cost of a call is measured as ``benchmarks.worker`` does (the time outside the
batches, less one batch, plus how much the first gap exceeds the median). Inside the
trainer's calls, process 0 times sections by wrapping the functions that do them (no change
to the library): the argument checks, building the run config, preparing the train
dataloader (accelerate's ``prepare_data_loader``) and rebuilding it to resume mid-epoch
(``skip_first_batches``), the random-state broadcast at the loader's start, and the epoch
loss's all-reduce (both collectives include waiting for the other process). It also times
what accelerate's package checks cost (it asks them at each dataloader it builds: two per
call; the trainer does not patch accelerate to cache them).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import loops, pipelines, remove_scratch_directories, scratch_directory
from benchmarks.stats import median_interval, paired_difference

WARM_UP_BATCHES = 2
STEPS = 16
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("argument checks", "pytorch_accel._entry_checks", "check_train_arguments"),
    ("run config", "pytorch_accel._state", "Preparation.training_run_config"),
    ("train loader: accelerate's prepare", "accelerate.data_loader", "prepare_data_loader"),
    ("train loader: rebuilt to resume mid-epoch", "pytorch_accel._resumable", "make_resumable"),
    ("random-state broadcast (collective)", "accelerate.utils.random", "synchronize_rng_states"),
    ("epoch loss all-reduce (collective)", "pytorch_accel.distributed", "reduce_across_processes"),
)
"""(label, module, function or Class.method) of each timed section of a ``train()`` call."""
UNCACHED = "of it: accelerate's package checks at the two loaders"


class Timers:
    """Seconds spent in each wrapped function since the last ``take``: wall and thread CPU."""

    def __init__(self) -> None:
        self.spent: dict[str, tuple[float, float]] = {}

    def wrap(self, label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function``, adding the time of each call to ``label``."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                wall, cpu = self.spent.get(label, (0.0, 0.0))
                wall += time.perf_counter() - start
                self.spent[label] = (wall, cpu + time.thread_time() - start_cpu)

        return timed

    def take(self) -> dict[str, tuple[float, float]]:
        """Return the seconds by label, and start again."""
        spent, self.spent = self.spent, {}
        return spent


def install(timers: Timers) -> None:
    """Wrap each section's function, wherever a loaded module holds it by name."""
    for label, module_name, qualified in SECTIONS:
        module = importlib.import_module(module_name)
        owner_name, _, name = qualified.rpartition(".")
        if owner_name:  # a method: replace it on its class
            owner = getattr(module, owner_name)
            setattr(owner, name, timers.wrap(label, getattr(owner, name)))
            continue
        original = getattr(module, name)
        wrapped = timers.wrap(label, original)
        for loaded in list(sys.modules.values()):
            ours = getattr(loaded, "__name__", "").startswith(("pytorch_accel", "accelerate"))
            if ours and getattr(loaded, name, None) is original:
                setattr(loaded, name, wrapped)


def uncached_package_checks() -> tuple[float, float]:
    """Seconds (wall, CPU) of the package checks accelerate asked at a call's two loaders."""
    from accelerate.utils import imports

    start, start_cpu = time.perf_counter(), time.thread_time()
    for _ in range(2):
        imports.is_torchdata_stateful_dataloader_available()
        imports.is_datasets_available()
    return time.perf_counter() - start, time.thread_time() - start_cpu


def time_call(run: pipelines.Run) -> tuple[float, float]:
    """Return the fixed seconds of one call (as benchmarks.worker): wall, and thread CPU."""
    import torch.distributed as dist

    stamps: list[tuple[float, float]] = []
    dist.barrier()
    start = (time.perf_counter(), time.thread_time())
    run(lambda: stamps.append((time.perf_counter(), time.thread_time())))
    end = (time.perf_counter(), time.thread_time())
    fixed = []
    for clock in (0, 1):
        points = [stamp[clock] for stamp in stamps]
        gaps = [later - earlier for earlier, later in itertools.pairwise(points)]
        per_batch = statistics.median(gaps[WARM_UP_BATCHES:] or gaps)
        outside = (points[0] - start[clock]) + (end[clock] - points[-1]) - per_batch
        fixed.append(outside + (gaps[0] - per_batch if gaps else 0.0))
    return fixed[0], fixed[1]


def worker(rounds: int, out: Path) -> None:
    """One process: paired rounds of the trainer and hand-written DDP on each model."""
    import torch.distributed as dist
    from accelerate import PartialState

    torch.set_num_threads(1)
    PartialState(cpu=True)
    world = dist.get_world_size()
    timers = Timers()
    install(timers)
    models = {
        "tiny MLP": (loops.make_mlp, loops.mlp_data(32 * STEPS * world)),
        "medium CNN": (loops.make_cnn, pipelines.regression_data(32 * STEPS * world)),
    }
    results: dict[str, Any] = {}
    for model_name, (make, data) in models.items():
        trainer = pipelines.trainer_train(make(), data, 32, pipelines.default_callbacks())
        hand = pipelines.hand_written_train(make(), data, 32)
        samples: dict[str, list[tuple[float, float]]] = {
            "trainer": [],
            "hand-written DDP": [],
            UNCACHED: [],
        }
        sections: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in SECTIONS}
        for round_index in range(rounds + 1):  # round 0 warms up
            order = [("trainer", trainer), ("hand-written DDP", hand)]
            for name, run in order if round_index % 2 else reversed(order):
                timers.take()
                fixed = time_call(run)
                spent = timers.take()
                if round_index == 0:
                    continue
                samples[name].append(fixed)
                if name == "trainer":
                    for label in sections:
                        sections[label].append(spent.get(label, (0.0, 0.0)))
            if round_index:
                samples[UNCACHED].append(uncached_package_checks())
        results[model_name] = {"fixed": samples, "sections": sections}
    if dist.get_rank() == 0:
        out.write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    remove_scratch_directories()
    os._exit(0)  # as benchmarks.worker: no interpreter finalisation under gloo's threads


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Per model: the breakdown rows (median ms per call, wall and CPU) and the paired extra."""
    summary: dict[str, Any] = {}
    for model_name, figures in results.items():
        fixed, sections = figures["fixed"], figures["sections"]
        trainer, hand = fixed["trainer"], fixed["hand-written DDP"]
        rows = [{"section": label, **_ms(values)} for label, values in sections.items()]
        timed = [
            tuple(sum(pair[clock] for pair in spans) for clock in (0, 1))
            for spans in zip(*sections.values(), strict=True)
        ]
        rest = [
            tuple(whole[clock] - part[clock] for clock in (0, 1))
            for whole, part in zip(trainer, timed, strict=True)
        ]
        rows += [
            {"section": "the rest (events, callbacks, loader start, bookkeeping)", **_ms(rest)},
            {"section": "**fixed cost of a trainer call**", **_ms(trainer)},
            {"section": "fixed cost of a hand-written DDP call", **_ms(hand)},
            {"section": UNCACHED, **_ms(fixed[UNCACHED])},
        ]
        summary[model_name] = {
            "rows": rows,
            "extra_fixed_ms": paired_difference(
                [pair[0] for pair in trainer], [pair[0] for pair in hand], 1e3
            ),
            "extra_fixed_cpu_ms": paired_difference(
                [pair[1] for pair in trainer], [pair[1] for pair in hand], 1e3
            ),
            "rounds": len(trainer),
        }
    return summary


def _ms(values: list[Any]) -> dict[str, Any]:
    wall, cpu = [[pair[clock] * 1e3 for pair in values] for clock in (0, 1)]
    return {
        "median_ms": statistics.median(wall),
        "ci95": median_interval(wall),
        "median_cpu_ms": statistics.median(cpu),
        "cpu_ci95": median_interval(cpu),
    }


def measure(quick: bool) -> dict[str, Any]:
    """Launch the 2-process worker under torchrun; return the summary (``summarise``)."""
    rounds = 4 if quick else 20
    out = scratch_directory("bench-call-cost-") / "samples.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node=2", "-m", "benchmarks.call_cost", "--worker"]
    command += [f"--rounds={rounds}", f"--out={out}"]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    if not out.exists():
        raise RuntimeError(
            f"benchmarks.call_cost failed (exit status {done.returncode}):\n"
            f"{(done.stdout + done.stderr)[-4000:]}"
        )
    return summarise(json.loads(out.read_text()))


def markdown(summary: dict[str, Any]) -> list[str]:
    """The breakdown table: wall and thread-CPU ms per call, one pair of columns per model."""
    models = list(summary)
    lines = [
        "| per `train()` call, 2 processes, rank 0 (ms, median [95% CI]) | "
        + " | ".join(f"{model}: wall | {model}: CPU" for model in models)
        + " |",
        "| --- |" + " ---: | ---: |" * len(models),
    ]
    labels = [row["section"] for row in summary[models[0]]["rows"]]
    for index, label in enumerate(labels):
        cells = []
        for model in models:
            row = summary[model]["rows"][index]
            cells.append(_cell(row["median_ms"], row["ci95"]))
            cells.append(_cell(row["median_cpu_ms"], row["cpu_ci95"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for model in models:
        for key in ("extra_fixed_ms", "extra_fixed_cpu_ms"):
            extra = summary[model][key]
            low, high = extra["ci95"]
            cells.append(f"**{extra['median']:+.2f}** [{low:+.2f}, {high:+.2f}]")
    lines.append("| **trainer over hand-written DDP, paired** | " + " | ".join(cells) + " |")
    return lines


def _cell(median: float, interval: tuple[float, float]) -> str:
    return f"{median:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def main(argv: list[str] | None = None) -> None:
    """``--worker``: one process of the measurement; else measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.rounds, args.out)
        return
    summary = measure(args.quick)
    print("\n".join(markdown(summary)))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
