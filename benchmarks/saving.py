"""Stall per save: how long a save blocks the training thread, blocking and in the background.

``python -m benchmarks.saving [--quick]`` (also the ``saving`` suite of ``benchmarks.run``).
An MLP with AdamW (50M and 200M parameters; ``--quick``: 5M) trains with one thread; at every
save point, in the same run, the callback below times, in a random order:

- the baseline: ``torch.save`` of the model's and optimizer's state dicts, plus ``fsync``;
- ``trainer.save_training_state(blocking=True)``: the whole blocking save (staging, writing
  with digests, manifest, rename);
- in another run, ``save_training_state(blocking=False)``: the snapshot into host memory, plus
  the training thread's share of completing the save at later step boundaries (the time
  between a step's end and the next step's start beyond that of steps without a save in
  flight), measured until the state is published.

Each save point does one save, as a run does, and save points are far enough apart for a
background write to finish before the next one. Consecutive save points make a pair, one
baseline and one trainer save in a random order: on the 2-core VM's virtual disk, a second
2.4 GB write right after a first one takes 2-3 times as long (even after ``os.sync()`` and a
pause), so two saves at one save point would pair a first write with a second. Every save,
the baseline's included, writes new files, and each kind keeps only its latest (as a rotating
``SaveTrainingStateCallback`` does): rewriting one file in place is about three times as fast
as writing a new one there. The first save of each run is a warm-up (it allocates the host
buffers the later saves reuse: its stall is reported apart). Ratios to the baseline are
paired by pair, summarised as medians with 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks import scratch_directory
from benchmarks.stats import paired_ratio, summary
from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.training_state import find_training_states

SIZES = {"50M": 50e6, "200M": 200e6}
QUICK_SIZES = {"5M": 5e6}


def make_mlp(parameters: float) -> nn.Module:
    """Four square linear layers with about ``parameters`` parameters."""
    width = int((parameters / 4) ** 0.5)
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(4)])


def baseline_save(trainer: Trainer, path: Path) -> float:
    """Seconds of ``torch.save`` of the model and optimizer state dicts, plus ``fsync``."""
    start = time.perf_counter()
    state = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return time.perf_counter() - start


class TimedSaves(TrainerCallback):
    """Saves every ``gap`` steps, one save per save point, and times the training thread's share.

    After the warm-up, save points come in pairs: a baseline and the trainer's save (blocking,
    or in the ``background``), in a random order per pair.
    """

    order = 1000

    def __init__(self, directory: Path, gap: int, background: bool) -> None:
        self.directory, self.gap, self.background = directory, gap, background
        self.steps = 0
        self.baseline: list[float] = []
        self.blocking: list[float] = []
        self.stall: list[float] = []
        self.warm_up = 0.0  # the first save's time (its stall, in the background)
        self.quiet: list[float] = []  # step end -> next step start, no save in flight
        self._pending: str | None = None
        self._ended = 0.0
        self._shuffle = random.Random(0)
        self._next: list[str] = []  # the kinds of this pair's save points left
        self._latest: dict[str, Path] = {}  # each kind's last save, removed at its next

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Count the time since the last step's end to a save in flight, until published."""
        if not self._ended:
            return
        gap = time.perf_counter() - self._ended
        if self._pending is None:
            self.quiet.append(gap)
            return
        extra = gap - (statistics.median(self.quiet) if self.quiet else 0.0)
        if self.stall:
            self.stall[-1] += extra
        else:
            self.warm_up += extra
        if any(state.name == self._pending for state in find_training_states(self.directory)):
            self._pending = None

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Save every ``gap`` steps."""
        self.steps += 1
        if self.steps % self.gap == 0:
            self._save(trainer, f"state-{self.steps}")
        self._ended = time.perf_counter()

    def _save(self, trainer: Trainer, name: str) -> None:
        warm_up = self.steps == self.gap
        if warm_up:
            kind = "trainer"
        else:
            if not self._next:
                self._next = ["baseline", "trainer"]
                self._shuffle.shuffle(self._next)
            kind = self._next.pop(0)
        stale = self._latest.get(kind)
        if stale is not None:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
        if kind == "baseline":
            self._latest[kind] = self.directory / f"baseline-{name}.pt"
            self.baseline.append(baseline_save(trainer, self._latest[kind]))
            return
        self._latest[kind] = self.directory / name
        start = time.perf_counter()
        trainer.save_training_state(self._latest[kind], blocking=not self.background)
        seconds = time.perf_counter() - start
        if self.background:
            self._pending = name
        if warm_up:
            self.warm_up = seconds
        else:
            (self.stall if self.background else self.blocking).append(seconds)

    def pairs(self) -> tuple[list[float], list[float]]:
        """The trainer's and the baseline's times of the complete pairs."""
        own = self.stall if self.background else self.blocking
        count = min(len(own), len(self.baseline))
        return own[:count], self.baseline[:count]


def measure_size(parameters: float, pairs: int, directory: Path) -> dict[str, Any]:
    """Both runs at one model size (blocking and background saves), each with ``pairs`` pairs."""
    torch.manual_seed(0)
    probe = make_mlp(parameters)
    width = probe[0].in_features
    step_seconds = _step_seconds(probe, width)
    write_seconds = 3e-9 * sum(p.numel() for p in probe.parameters()) * 12  # ~3 s per GB
    gap = max(3, int(write_seconds / step_seconds) + 2)
    del probe
    results: dict[str, Any] = {}
    points = 1 + 2 * pairs  # a warm-up, then the pairs
    for background in (False, True):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        model = make_mlp(parameters)
        timed = TimedSaves(directory, gap, background)
        trainer = Trainer(
            model,
            nn.MSELoss(),
            torch.optim.AdamW(model.parameters(), lr=1e-4),
            callbacks=(timed,),
        )
        data = TensorDataset(
            torch.randn(gap * points + 2, width), torch.randn(gap * points + 2, width)
        )
        trainer.train(data, num_epochs=1, per_device_batch_size=1)
        results["background" if background else "blocking"] = timed
        del trainer, model
    blocking, background = results["blocking"], results["background"]
    parameter_count = sum(p.numel() for p in make_mlp(parameters).parameters())
    return {
        "parameters": parameter_count,
        "state_mb": 12 * parameter_count / 1e6,
        "baseline_s": summary(blocking.baseline + background.baseline),
        "blocking_s": summary(blocking.blocking),
        "background_stall_s": summary(background.stall),
        "first_background_stall_s": background.warm_up,
        "blocking_ratio": paired_ratio(*blocking.pairs()),
        "background_ratio": paired_ratio(*background.pairs()),
        "pairs": pairs,  # measured, after the warm-up
    }


def _step_seconds(model: nn.Module, width: int) -> float:
    inputs = torch.randn(1, width)
    start = time.perf_counter()
    model(inputs).sum().backward()
    return max(time.perf_counter() - start, 1e-3) * 1.5


def measure(quick: bool, only: list[str] | None = None, pairs: int | None = None) -> dict[str, Any]:
    """Every size's figures (``quick``: one small size, few pairs; ``only``: these sizes)."""
    torch.set_num_threads(1)
    sizes = QUICK_SIZES if quick else SIZES
    sizes = {name: count for name, count in sizes.items() if only is None or name in only}
    pairs = pairs or (2 if quick else 6)
    root = scratch_directory("bench-saving-", os.environ.get("BENCH_SAVE_DIR"))
    try:
        return {name: measure_size(count, pairs, root / name) for name, count in sizes.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def markdown(results: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| model (AdamW state) | torch.save + fsync | blocking save | ratio [95% CI] | "
        "stall, background save | ratio [95% CI] | stall, first background save |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in results.items():
        lines.append(
            f"| {name} ({row['state_mb']:.0f} MB) | {row['baseline_s']['median']:.2f} s | "
            f"{row['blocking_s']['median']:.2f} s | {_ratio(row['blocking_ratio'])} | "
            f"{row['background_stall_s']['median']:.3f} s | {_ratio(row['background_ratio'])} | "
            f"{row['first_background_stall_s']:.2f} s |"
        )
    return "\n".join(lines)


def _ratio(figure: dict[str, Any]) -> str:
    low, high = figure["ci95"]
    return f"{figure['median']:.2f} [{low:.2f}, {high:.2f}]"


def main() -> None:
    """Measure and print the table (and the JSON with ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), help="these sizes only")
    parser.add_argument("--pairs", type=int, help="pairs of save points per run, after a warm-up")
    args = parser.parse_args()
    results = measure(args.quick, args.sizes, args.pairs)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    print(markdown(results))


if __name__ == "__main__":
    main()
