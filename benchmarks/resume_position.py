"""Time to the first resumed step against the position in the pass: replayed and stateful streams.

A stream of 20,000 samples per pass, each costing about 0.1 ms to produce (a busy wait, as
decoding or tokenising would), batches of 20: a training state is saved at 10%, 50% and 90% of
the pass, then each is resumed and timed from the ``train()`` call to the end of the first
resumed step. The ``replayed`` stream has no position to save, so the resumed run loads the
batches already trained on again and drops them; the ``stateful`` one has ``state_dict`` and
``load_state_dict``, so the resume puts it at its saved position. Rounds interleave the
positions and streams; the ratios are paired within rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

from benchmarks import scratch_directory
from benchmarks.stats import paired_ratio, summary
from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.errors import StopTrainingError

BATCH = 20
POSITIONS = (0.1, 0.5, 0.9)
SAMPLE_COST_S = 1e-4


class CostlyStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """``length`` samples per pass, each after about 0.1 ms of work; no position to save."""

    def __init__(self, length: int) -> None:
        self.length, self.index = length, 0
        self.inputs = torch.linspace(-1, 1, 4 * 64).reshape(64, 4)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while self.index < self.length:
            index, self.index = self.index, self.index + 1
            end = time.perf_counter() + SAMPLE_COST_S
            while time.perf_counter() < end:
                pass
            sample = self.inputs[index % 64]
            yield sample, sample.sum(dim=0, keepdim=True)
        self.index = 0


class StatefulCostlyStream(CostlyStream):
    """``CostlyStream`` with its position (``state_dict`` and ``load_state_dict``)."""

    def state_dict(self) -> dict[str, Any]:
        """The position in the pass."""
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the pass from ``state``'s position."""
        self.index = int(state["index"])


STREAMS = {"replayed": CostlyStream, "stateful": StatefulCostlyStream}


class _SaveThenStop(TrainerCallback):
    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step, self.seen = path, step, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.step:
            trainer.save_training_state(self.path)
            raise StopTrainingError("")


class _FirstStep(TrainerCallback):
    """Notes when the first step of the resumed run ends, and stops the run there."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.at = time.perf_counter()
        raise StopTrainingError("")


def _train(stream: str, length: int, callback: TrainerCallback, resume: Path | None) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), (callback,)
    )
    trainer.train(
        STREAMS[stream](length),
        max_num_train_steps=2 * length // BATCH,
        per_device_batch_size=BATCH,
        resume_from=resume,
    )


def _time_to_first_step(stream: str, length: int, state: Path) -> float:
    first = _FirstStep()
    start = time.perf_counter()
    _train(stream, length, first, state)
    assert first.at is not None
    return first.at - start


def measure(quick: bool, length: int | None = None, rounds: int | None = None) -> dict[str, Any]:
    """Save a state at each position of each stream, then time resuming each, in rounds.

    Args:
        quick: A pass of 2,000 samples and 2 rounds instead of 20,000 and 5.
        length: Samples per pass, instead (for tests).
        rounds: Rounds, instead.
    """
    default_length, default_rounds = (2_000, 2) if quick else (20_000, 5)
    length, rounds = length or default_length, rounds or default_rounds
    steps = length // BATCH
    directory = scratch_directory("bench-resume-")
    states = {}
    for stream in STREAMS:
        for position in POSITIONS:
            path = directory / f"{stream}-{position}"
            _train(stream, length, _SaveThenStop(path, round(position * steps)), None)
            states[stream, position] = path
    seconds: dict[tuple[str, float], list[float]] = {key: [] for key in states}
    for _ in range(rounds):
        for key, path in states.items():
            seconds[key].append(_time_to_first_step(key[0], length, path))
    rows = []
    for (stream, position), values in seconds.items():
        rows.append(
            {
                "stream": stream,
                "position": position,
                "seconds": summary(values),
                "vs_first_position": paired_ratio(values, seconds[stream, POSITIONS[0]]),
                "vs_stateful": paired_ratio(values, seconds["stateful", position]),
            }
        )
    return {
        "name": f"Time to the first resumed step, a stream of {length:,} samples per pass "
        f"(about 0.1 ms each), batch {BATCH}, {rounds} rounds",
        "rows": rows,
    }
