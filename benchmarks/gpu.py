"""GPU mode of the benchmark: ``python -m benchmarks.gpu`` on a machine with CUDA.

For each workload it trains one warm-up epoch, then times a steady-state epoch with CUDA
events, with ``torch.cuda.set_sync_debug_mode("error")`` switched on from the second step to
the last one: any host synchronisation inside a step raises, naming the operation. The
hand-written loop runs under the same rule, so a failure there means the check itself is off.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import loops


def hand_written(model: nn.Module, device: torch.device) -> loops.Loop:
    """Plain PyTorch on the GPU: pinned batches copied without blocking."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_func = loops.ProbedLoss()

    def run(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        for inputs, targets in DataLoader(dataset, batch_size=batch_size, pin_memory=True):
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            loss_func(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()

    return run


class SteadyState:
    """A probe that times steps 2..N with CUDA events and forbids host syncs between them."""

    def __init__(self, steps: int) -> None:
        self.steps, self.calls = steps, 0
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def __call__(self) -> None:
        """Start timing and sync checking at step 2, stop them at the last step."""
        self.calls += 1
        if self.calls == 2:
            self.start.record()
            torch.cuda.set_sync_debug_mode("error")
        elif self.calls == self.steps:
            torch.cuda.set_sync_debug_mode("default")
            self.end.record()

    def milliseconds_per_step(self) -> float:
        """The steady-state milliseconds per step (synchronises once, after the epoch)."""
        torch.cuda.synchronize()
        return float(self.start.elapsed_time(self.end)) / (self.steps - 2)


def measure(make_model: Any, make_data: Any, steps: int, rounds: int) -> dict[str, float]:
    """Median milliseconds per steady-state step of each loop, over interleaved rounds."""
    device = torch.device("cuda")
    built = {
        "hand-written": hand_written(make_model().to(device), device),
        "pytorch-accel, default callbacks": loops.pytorch_accel_trainer(make_model(), True),
    }
    dataset = make_data(steps * 32)
    samples: dict[str, list[float]] = {name: [] for name in built}
    for round_index in range(rounds + 1):
        for name, loop in built.items():
            probe = SteadyState(steps)
            loop(dataset, 32, probe)
            if round_index:
                samples[name].append(probe.milliseconds_per_step())
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    """Print the steady-state milliseconds per step on the GPU; fail on any host sync."""
    if not torch.cuda.is_available():
        sys.exit("benchmarks.gpu needs a CUDA device")
    for name, make_model, make_data in (
        ("tiny MLP", loops.make_mlp, loops.mlp_data),
        ("medium CNN", loops.make_cnn, loops.cnn_data),
    ):
        results = measure(make_model, make_data, steps=50, rounds=5)
        print(name, {loop: f"{ms:.3f} ms/step" for loop, ms in results.items()})


if __name__ == "__main__":
    main()
