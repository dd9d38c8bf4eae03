"""One process of a paired benchmark in a process group: ``torchrun ... -m benchmarks.worker``.

Every process builds the same loops (``benchmarks.pipelines``) in the same order, then runs
interleaved rounds, after a barrier before each loop, so the processes run each loop together,
as in a real job. Round 0 is a warm-up. Process 0 writes every loop's per-round figures as JSON.

- **Order.** The rounds cycle through the rows of a Williams design (a balanced Latin square,
  with its mirror for an odd number of loops) over the loops in a random order fixed by a
  seed, the same on every process, in whole cycles (the rounds asked for, rounded up): over a
  cycle each loop runs once at each position in a round and once right after each other loop.
  A shuffled order left position and carry-over effects (what the previous loop left in the
  allocator, the caches and gloo's threads) to chance, and 20 rounds are too few for chance
  to even them out: the hand-written control read +11.5 ms per call against its identical
  twin.
- **Per batch.** The wall time between two probes (with several processes a step includes
  waiting for the slowest one, which is a real cost), the median of the call's gaps after
  ``WARM_UP_BATCHES``.
- **Fixed cost per call.** The time before the first probe and after the last one, less one
  batch (the first batch's loading and forward and the last one's backward and step make up
  one), plus how much the first gap exceeds the median: a call's start shows there too (the
  hand-written loop's first gradient all-reduce waits for the process that left the barrier
  last, where a trainer's loader waits at its random-state broadcast, before the first
  probe). The former estimate, the call's wall time less its number of batches times the
  median, also summed every batch's deviation from the median: on this shared machine tens
  of ms either way, a noise several times as wide as the fixed cost.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks import loops, pipelines, remove_scratch_directories, scratch_directory

WARM_UP_BATCHES = 2
Groups = dict[str, dict[str, pipelines.Run]]  # group -> loop name -> loop; the first is the base


def build(suite: str, scale: float) -> Groups:
    """The loops of ``suite``, grouped by what they are paired against (first of each group)."""
    world = pipelines.world_size()
    if suite == "train":
        return {"training": _training(int(16 * scale), world)}
    if suite == "inference":
        return _inference(int(16 * scale), world)
    if suite == "images":
        return {"image folder": _images(int(256 * scale))}
    raise ValueError(f"benchmarks.worker: unknown suite {suite!r}; use train, inference, images.")


def _training(steps: int, world: int) -> dict[str, pipelines.Run]:
    data = pipelines.regression_data(32 * steps * world)
    make = loops.make_cnn
    return {
        "hand-written DDP": pipelines.hand_written_train(make(), data, 32),
        "hand-written DDP (control)": pipelines.hand_written_train(make(), data, 32),
        "pytorch-accel, default callbacks": pipelines.trainer_train(
            make(), data, 32, pipelines.default_callbacks()
        ),
        "pytorch-accel, + preemption handling": pipelines.trainer_train(
            make(), data, 32, pipelines.default_callbacks(preemption=True)
        ),
    }


def _inference(batches: int, world: int) -> Groups:
    data = pipelines.regression_data(64 * batches * world)
    make = loops.make_cnn
    groups: Groups = {}
    for kind, hand_written in (
        ("evaluate", pipelines.hand_written_evaluate),
        ("predict", pipelines.hand_written_predict),
    ):
        groups[kind] = {
            f"hand-written {kind}": hand_written(make(), data, 64),
            f"hand-written {kind} (control)": hand_written(make(), data, 64),
            f"pytorch-accel {kind}": pipelines.trainer_inference(
                make(), data, 64, predict=kind == "predict"
            ),
        }
    return groups


def _images(num_images: int) -> dict[str, pipelines.Run]:
    root = pipelines.image_folder(scratch_directory("bench-images-"), num_images, 16)
    data = pipelines.image_dataset(root)
    make = pipelines.make_classifier
    return {
        "hand-written, careful loader": pipelines.hand_written_images(make(), data, 32),
        "hand-written, careful loader (control)": pipelines.hand_written_images(make(), data, 32),
        "pytorch-accel, default loader": pipelines.trainer_images(make(), data, 32),
    }


def time_call(run: pipelines.Run) -> tuple[float, float, float]:
    """Return (median seconds per batch, fixed seconds, whole seconds) of one call."""
    stamps: list[float] = []
    if pipelines.world_size() > 1:
        dist.barrier()
    start = time.perf_counter()
    run(lambda: stamps.append(time.perf_counter()))
    end = time.perf_counter()
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    per_batch = statistics.median(gaps[WARM_UP_BATCHES:] or gaps)
    outside = (stamps[0] - start) + (end - stamps[-1]) - per_batch
    start_up = gaps[0] - per_batch if gaps else 0.0
    return per_batch, outside + start_up, end - start


def balanced_orders(names: list[str], seed: int = 0) -> list[list[str]]:
    """The rows of a Williams design over ``names`` (shuffled by ``seed``): one cycle of rounds.

    Each name is at each position once per cycle and follows each other name once (twice
    as many rows, the mirrored ones, when the number of names is odd).
    """
    shuffled = list(names)
    random.Random(seed).shuffle(shuffled)
    count = len(shuffled)
    first = [0]  # 0, 1, n-1, 2, n-2, ...
    for index in range(1, count):
        first.append((index + 1) // 2 if index % 2 else count - index // 2)
    rows = [[shuffled[(position + shift) % count] for position in first] for shift in range(count)]
    if count % 2:
        rows += [list(reversed(row)) for row in rows]
    return rows


def measure(groups: Groups, rounds: int) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Interleaved rounds of every loop of every group, in balanced orders; round 0 warms up."""
    flat: dict[str, tuple[str, Callable[[pipelines.Probe], None]]] = {
        name: (group, run) for group, runs in groups.items() for name, run in runs.items()
    }
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        group: {name: {"per_batch": [], "fixed": [], "whole": []} for name in runs}
        for group, runs in groups.items()
    }
    orders = balanced_orders(list(flat))  # the same on every process
    if rounds >= len(orders):  # whole cycles (a quick run keeps its few rounds)
        rounds = -(-rounds // len(orders)) * len(orders)
    for round_index in range(rounds + 1):
        for name in orders[(round_index - 1) % len(orders)]:
            group, run = flat[name]
            per_batch, fixed, whole = time_call(run)
            if round_index > 0:
                sample = samples[group][name]
                sample["per_batch"].append(per_batch)
                sample["fixed"].append(fixed)
                sample["whole"].append(whole)
    return samples


def main(argv: list[str] | None = None) -> None:
    """Build the suite's loops, measure them, and write process 0's figures to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0, help="data size, 1 = the default")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState(cpu=True)  # the gloo group the trainers and the DDP loops share
    samples = measure(build(args.suite, args.scale), args.rounds)
    if int(os.environ.get("RANK", "0")) == 0:
        args.out.write_text(json.dumps(samples))
    if pipelines.world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()
    # End without finalising the interpreter: a gloo worker thread may still release tensors
    # then, when it can no longer take the GIL, which aborts the process (see
    # tests/distributed/scripts/common.py). Everything was written and flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    remove_scratch_directories()
    os._exit(0)


if __name__ == "__main__":
    main()
