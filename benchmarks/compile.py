"""A compiled model's speed through the trainer: ``python -m benchmarks.compile``.

The same model, compiled with ``torch.compile`` (inductor), trained by a hand-written loop
around ``torch.compile(model)`` and by the ``Trainer`` with accelerate's dynamo plugin
(``Accelerator(dynamo_backend="inductor")``, what ``accelerate launch --dynamo_backend
inductor`` sets), with the eager hand-written loop for reference. Same method as
``benchmarks.run``: one thread, interleaved rounds in a new order each round (round 0, which
compiles, is a warm-up), per-step CPU time as the median of each round, and ratios paired
within a round against the hand-compiled loop, with a 95% interval of their median.

Results go to ``benchmarks/results/compile.md`` and ``compile.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from benchmarks import fresh, loops, run, stats

BASELINE = "hand-compiled loop"


def hand_compiled(model: nn.Module) -> loops.Loop:
    """The hand-written loop of ``benchmarks.loops`` around ``torch.compile(model)``."""
    return loops.hand_written(torch.compile(model))


def trainer_compiled(model: nn.Module) -> loops.Loop:
    """``pytorch_accel.Trainer`` (no callbacks) with accelerate's dynamo plugin, inductor."""
    from accelerate import Accelerator

    from pytorch_accel import Trainer

    class CompilingTrainer(Trainer):
        def _create_accelerator(self) -> Accelerator:
            return Accelerator(cpu=True, dynamo_backend="inductor")

    loss_func = loops.ProbedLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = CompilingTrainer(model, loss_func, optimizer, callbacks=())

    def train(dataset: TensorDataset, batch_size: int, probe: loops.Probe) -> None:
        loss_func.probe = probe
        with loops.quiet():
            trainer.train(dataset, num_epochs=1, per_device_batch_size=batch_size)

    return train


def measure(workload: run.Workload) -> dict[str, list[float]]:
    """Per-round median step times of each loop; round 0 (compilation) is left out."""
    built = {
        BASELINE: hand_compiled(workload.make_model()),
        "pytorch-accel, dynamo plugin": trainer_compiled(workload.make_model()),
        "hand-written, eager": loops.hand_written(workload.make_model()),
    }
    dataset = workload.make_data(workload.steps * workload.batch_size)
    samples: dict[str, list[float]] = {name: [] for name in built}
    order = list(built)
    shuffler = random.Random(0)
    for round_index in range(workload.rounds + 1):
        shuffler.shuffle(order)
        for name in order:
            per_step, _ = run.time_epoch(built[name], dataset, workload.batch_size)
            if round_index > 0:
                samples[name].append(per_step)
    return samples


def summarise(samples: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Each loop's median step time and its ratio to the hand-compiled loop, paired by round."""
    base = samples[BASELINE]
    rows = []
    for name, values in samples.items():
        ratios = [own / ref for own, ref in zip(values, base, strict=True)]
        rows.append(
            {
                "loop": name,
                "per_step_us": statistics.median(values) * 1e6,
                "ratio": statistics.median(ratios),
                "ratio_ci95": stats.median_interval(ratios),
            }
        )
    return rows


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table per workload."""
    lines = [f"Machine: {results['machine']}", ""]
    for key in WORKLOADS:
        if key not in results:
            continue
        lines += [
            f"### {results[key]['name']}",
            "",
            "| Loop | CPU µs per step | Ratio to the hand-compiled loop (95% interval) |",
            "| --- | ---: | --- |",
        ]
        for row in results[key]["rows"]:
            low, high = row["ratio_ci95"]
            lines.append(
                f"| {row['loop']} | {row['per_step_us']:.0f} | "
                f"{row['ratio']:.3f} ({low:.3f} to {high:.3f}) |"
            )
        lines.append("")
    return "\n".join(lines)


WORKLOADS = {
    "tiny": run.Workload("tiny MLP, batch 32", loops.make_mlp, loops.mlp_data, 32, 60, 30),
    "medium": run.Workload("medium CNN, batch 32", loops.make_cnn, loops.cnn_data, 32, 16, 15),
}


def main(argv: list[str] | None = None) -> None:
    """Measure the chosen workloads and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="fewer rounds, for a smoke test")
    args = parser.parse_args(argv)
    run.run_with_tuned_malloc("benchmarks.compile")
    torch.set_num_threads(1)
    results: dict[str, Any] = {"machine": fresh.machine_description()}
    for key in args.workloads:
        workload = WORKLOADS[key]
        if args.quick:
            workload.rounds = 3
        print(f"measuring {workload.name}: {workload.rounds} rounds", flush=True)
        results[key] = {"name": workload.name, "rows": summarise(measure(workload))}
    run.RESULTS.mkdir(exist_ok=True)
    (run.RESULTS / "compile.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (run.RESULTS / "compile.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
