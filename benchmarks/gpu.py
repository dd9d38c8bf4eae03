"""GPU mode of the benchmark: ``python -m benchmarks.gpu`` on a machine with CUDA.

For each workload and precision (fp32, bf16, fp16) it builds a hand-written loop, the loop
accelerate's documentation teaches and ``pytorch_accel.Trainer`` with the default callbacks,
then trains and evaluates with each in interleaved rounds (round 0 is a warm-up). Every loop
calls the same probe from its loss function, once per step; the probe times steps 2..N with
CUDA events and switches ``torch.cuda.set_sync_debug_mode("warn")`` on for them, so every
host synchronisation inside those steps (loading included) is counted, with the Python line
that caused the first one. In fp32 and bf16 no loop may synchronise (the program exits with
status 1, after writing its results, if one does; the hand-written loops are held to the same
rule, so a sync there means the check itself is off). In fp16 a gradient scaler reads on the
host whether the gradients overflowed, once per update, by design; those syncs are reported.
``tests/test_cuda.py`` checks the trainer in ``"error"`` mode, which raises at the sync.

Results: a Markdown table printed and written, with the raw figures, to ``--out``
(``benchmarks/results/gpu.md`` and ``gpu.json`` by default).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import fresh, loops
from benchmarks.run import Workload

RESULTS = Path(__file__).parent / "results"
PRECISIONS = ("no", "bf16", "fp16")
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_SYNC_WARNING = "synchronizing CUDA operation"


class SteadyState:
    """A probe that times steps 2..N with CUDA events and has torch warn of host syncs in them.

    It records an event at every call (recording does not synchronise), so each step's time is
    known and the median ignores the odd step that a hypervisor or a collection slowed down.
    """

    def __init__(self, steps: int) -> None:
        self.steps, self.calls = steps, 0
        self.events: list[torch.cuda.Event] = []

    def __call__(self) -> None:
        """Record a step boundary; check for syncs from step 2 until the last step."""
        self.calls += 1
        if self.calls == 2:
            torch.cuda.set_sync_debug_mode("warn")
        elif self.calls == self.steps:
            torch.cuda.set_sync_debug_mode("default")
        if self.calls >= 2:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    def milliseconds_per_step(self) -> float:
        """The median milliseconds per steady-state step (synchronises once, after the epoch)."""
        torch.cuda.synchronize()
        steps = [a.elapsed_time(b) for a, b in itertools.pairwise(self.events)]
        return float(statistics.median(steps))


@dataclass
class Phase:
    """The loops of one phase (train or eval) of one precision, by name."""

    name: str
    loops: dict[str, loops.Loop]


def _autocast(precision: str) -> contextlib.AbstractContextManager[Any]:
    dtype = _AUTOCAST_DTYPES.get(precision)
    return torch.autocast("cuda", dtype=dtype) if dtype else contextlib.nullcontext()


def _cuda_batches(
    dataset: TensorDataset, batch_size: int, shuffle: bool
) -> Iterator[list[torch.Tensor]]:
    """Pinned batches copied to the GPU without blocking, as a careful loop does."""
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, pin_memory=True):
        yield [tensor.to("cuda", non_blocking=True) for tensor in batch]


def hand_written(model: nn.Module, precision: str) -> tuple[loops.Loop, loops.Loop]:
    """Plain PyTorch: autocast around the forward pass, a gradient scaler in fp16."""
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    loss_func = loops.ProbedLoss()

    def train(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        model.train()
        for inputs, targets in _cuda_batches(dataset, batch_size, shuffle=True):
            with _autocast(precision):
                outputs = model(inputs)
            loss = loss_func(outputs.float(), targets)
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad()

    def evaluate(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        model.eval()
        total = torch.zeros((), device="cuda")
        with torch.no_grad():
            for inputs, targets in _cuda_batches(dataset, batch_size, shuffle=False):
                with _autocast(precision):
                    outputs = model(inputs)
                total += loss_func(outputs.float(), targets) * len(inputs)
        total.item()  # the epoch's one read, after the timed steps

    return train, evaluate


def pytorch_accel_trainer(model: nn.Module) -> tuple[loops.Loop, loops.Loop]:
    """``pytorch_accel.Trainer`` with the default callbacks: ``train`` and ``evaluate``."""
    from pytorch_accel import Trainer

    loss_func = loops.ProbedLoss()
    trainer = Trainer(model, loss_func, torch.optim.SGD(model.parameters(), lr=1e-3))

    def train(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        with loops.quiet():
            trainer.train(dataset, num_epochs=1, per_device_batch_size=batch_size)

    def evaluate(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        with loops.quiet():
            trainer.evaluate(dataset, per_device_batch_size=batch_size)

    return train, evaluate


def _gpu_accelerator(precision: str) -> Any:
    """The accelerator of accelerate's loop: ``precision``, batches copied without blocking."""
    from accelerate import Accelerator, DataLoaderConfiguration

    config = DataLoaderConfiguration(non_blocking=True)
    return Accelerator(mixed_precision=precision, dataloader_config=config)


def build_phases(make_model: Callable[[], nn.Module], precision: str) -> list[Phase]:
    """Every loop of one precision, each with its own copy of the model."""
    hand_train, hand_eval = hand_written(make_model(), precision)
    trainer_train, trainer_eval = pytorch_accel_trainer(make_model())
    return [
        Phase(
            "train",
            {
                "hand-written": hand_train,
                "accelerate loop": loops.accelerate_loop(
                    make_model(), _gpu_accelerator(precision), pin_memory=True
                ),
                "pytorch-accel, default callbacks": trainer_train,
            },
        ),
        Phase(
            "eval", {"hand-written": hand_eval, "pytorch-accel, default callbacks": trainer_eval}
        ),
    ]


@dataclass
class Sample:
    """One timed epoch: steady-state milliseconds per step and host syncs per step."""

    milliseconds: float
    syncs: float
    first_sync: str | None


def time_loop(loop: loops.Loop, dataset: TensorDataset, batch_size: int, steps: int) -> Sample:
    """Time one epoch of ``loop`` and count the host syncs of its steady-state steps."""
    probe = SteadyState(steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop(dataset, batch_size, probe)
    if probe.calls != steps:
        raise RuntimeError(f"the loop called its loss {probe.calls} times in {steps} steps")
    syncs = [warning for warning in caught if _SYNC_WARNING in str(warning.message)]
    first = f"{syncs[0].filename}:{syncs[0].lineno}" if syncs else None
    return Sample(probe.milliseconds_per_step(), len(syncs) / (steps - 2), first)


WORKLOADS = (
    Workload("tiny MLP, batch 32", loops.make_mlp, loops.mlp_data, 32, 100, 15),
    Workload("medium CNN, batch 32", loops.make_cnn, loops.cnn_data, 32, 100, 15),
    Workload("medium CNN, batch 512", loops.make_cnn, loops.cnn_data, 512, 100, 15),
)


def measure(workload: Workload, precision: str) -> list[dict[str, Any]]:
    """Interleaved rounds of every loop of one precision; one summary row per loop."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # a new precision per call
    GradientState._reset_state()
    os.environ["ACCELERATE_MIXED_PRECISION"] = precision  # as `accelerate launch` passes it
    steps = workload.steps
    dataset = workload.make_data(steps * workload.batch_size)
    rows = []
    for phase in build_phases(workload.make_model, precision):
        samples: dict[str, list[Sample]] = {name: [] for name in phase.loops}
        for round_index in range(workload.rounds + 1):
            for name, loop in phase.loops.items():
                sample = time_loop(loop, dataset, workload.batch_size, steps)
                if round_index:
                    samples[name].append(sample)
        rows += summarise(workload.name, precision, phase.name, samples)
    return rows


def summarise(
    workload: str, precision: str, phase: str, samples: dict[str, list[Sample]]
) -> list[dict[str, Any]]:
    """Median milliseconds per step, and the extra microseconds paired with the hand loop."""
    base = [sample.milliseconds for sample in samples["hand-written"]]
    rows = []
    for name, values in samples.items():
        own = [sample.milliseconds for sample in values]
        extra = [(mine - ref) * 1e3 for mine, ref in zip(own, base, strict=True)]
        rows.append(
            {
                "workload": workload,
                "precision": "fp32" if precision == "no" else precision,
                "phase": phase,
                "loop": name,
                "ms_per_step": statistics.median(own),
                "extra_us": statistics.median(extra),
                "extra_us_range": (min(extra), max(extra)),
                "syncs_per_step": max(sample.syncs for sample in values),
                "first_sync": next((s.first_sync for s in values if s.first_sync), None),
            }
        )
    return rows


def markdown(machine: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """Render the rows as one Markdown table."""
    lines = [
        f"{machine['gpu']}; Python {machine['python']}, torch {machine['torch']}. "
        "Steady-state steps timed with CUDA events; medians of the per-round median step over "
        "interleaved rounds; "
        "extra = paired against the hand-written loop (min-max over rounds).",
        "",
        "| workload | precision | phase | loop | ms per step | extra per step (µs) "
        "| host syncs per step |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for row in rows:
        low, high = row["extra_us_range"]
        lines.append(
            f"| {row['workload']} | {row['precision']} | {row['phase']} | {row['loop']} "
            f"| {row['ms_per_step']:.3f} | {row['extra_us']:+.1f} ({low:+.1f} to {high:+.1f}) "
            f"| {row['syncs_per_step']:g} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Time every workload, precision and loop on the GPU; fail on a sync in fp32 or bf16."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="steps per epoch (default 100)")
    parser.add_argument("--rounds", type=int, help="timed rounds per loop (default 15)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.gpu needs a CUDA device")
    machine = {**fresh.machine_description(), "gpu": torch.cuda.get_device_name()}
    rows = []
    for workload in WORKLOADS:
        workload = dataclasses.replace(
            workload,
            steps=args.steps or workload.steps,
            rounds=args.rounds or workload.rounds,
        )
        for precision in PRECISIONS:
            print(f"measuring {workload.name}, {precision}", flush=True)
            rows += measure(workload, precision)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    table = markdown(machine, rows)
    (args.out / "gpu.md").write_text(table)
    print(table)
    unexpected = [row for row in rows if row["precision"] != "fp16" and row["syncs_per_step"]]
    for row in unexpected:
        print(
            f"host sync in {row['loop']} ({row['workload']}, {row['precision']}, "
            f"{row['phase']}), first at {row['first_sync']}",
            file=sys.stderr,
        )
    if unexpected:
        sys.exit(1)


if __name__ == "__main__":
    main()
