"""The trainer's default dataloader against fixed worker settings, on three kinds of data.

``python -m benchmarks.loaders`` (the ``loaders`` suite of ``make bench``). Each kind of data
is trained on by one ``Trainer`` (no callbacks but the defaults) for one epoch per
``train()`` call, with ``num_workers`` left to the trainer's default and fixed at 0, 1 and
2 (persistent workers), in interleaved rounds (a new random order each round, one process,
one thread for the loop). A call's wall time includes starting the workers: they are started
by each ``train()`` call. Each setting is paired within rounds against the best fixed setting
(the one with the lowest median).

- **tensors**: an in-memory dataset of tensors that is not a ``TensorDataset`` (a ``Dataset``
  whose ``__getitem__`` indexes tensors), the tiny MLP, batch 32, 64 steps;
- **text**: tokenised text as a list of dicts of tensors (``input_ids``, ``attention_mask``,
  ``labels``, 64 tokens), collated into dict batches, a small one-layer transformer language
  model, batch 8, 32 steps;
- **images**: PNGs (32x32) written to a folder and decoded with PIL and torchvision's
  ``ToTensor`` and ``Normalize`` in ``__getitem__``, the medium CNN classifier, batch 32,
  16 steps.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks import loops, pipelines, scratch_directory
from benchmarks.stats import paired_ratio

FIXED = (0, 1, 2)
DEFAULT = "trainer default"


class InMemory(Dataset[Any]):
    """Tensors in memory behind a plain ``Dataset`` (what ``TensorDataset`` does, unnamed)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def tokenised_text(samples: int, length: int = 64, vocabulary: int = 512) -> list[dict[str, Any]]:
    """Tokenised text as a tokenizer leaves it: one dict of tensors per sample."""
    generator = torch.Generator().manual_seed(0)
    items = []
    for _ in range(samples):
        ids = torch.randint(0, vocabulary, (length,), generator=generator)
        items.append({"input_ids": ids, "attention_mask": torch.ones(length), "labels": ids})
    return items


class TinyLanguageModel(nn.Module):
    """Embedding, one transformer layer, and a head: logits per token."""

    def __init__(self, vocabulary: int = 512, width: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 2 * width, batch_first=True)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits for every token."""
        hidden = self.layer(self.embedding(input_ids), src_key_padding_mask=attention_mask == 0)
        return self.head(hidden)  # type: ignore[no-any-return]


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every token."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


Kind = tuple[Callable[[], nn.Module], Callable[..., Any], Dataset[Any] | list[Any], int]


KINDS = ("tensors", "text", "images")


def kinds(quick: bool, chosen: tuple[str, ...] = KINDS) -> dict[str, Kind]:
    """The kinds of data: (model builder, loss, dataset, batch size) by name."""
    scale = 4 if quick else 1
    built: dict[str, Kind] = {}
    if "tensors" in chosen:
        mlp_data = loops.mlp_data(32 * 64 // scale)
        built["tensors"] = (loops.make_mlp, nn.MSELoss(), InMemory(*mlp_data.tensors), 32)
    if "text" in chosen:
        built["text"] = (TinyLanguageModel, token_loss, tokenised_text(8 * 32 // scale), 8)
    if "images" in chosen:
        folder = pipelines.image_folder(scratch_directory("bench-loaders-"), 512 // scale, 32)
        dataset = pipelines.image_dataset(folder)
        built["images"] = (pipelines.make_classifier, nn.CrossEntropyLoss(), dataset, 32)
    return built


def settings() -> dict[str, dict[str, Any] | None]:
    """The loader settings compared: the trainer's default, then fixed worker counts."""
    fixed: dict[str, dict[str, Any] | None] = {
        f"num_workers={count}": {"num_workers": count} for count in FIXED
    }
    return {DEFAULT: None, **fixed}


def one_call(kind: Kind, loader_kwargs: dict[str, Any] | None) -> tuple[float, int]:
    """Wall seconds of one ``train()`` call, and the number of workers it used."""
    from pytorch_accel import Trainer

    make_model, loss, dataset, batch_size = kind
    torch.manual_seed(0)
    model = make_model()
    trainer = Trainer(model, loss, torch.optim.SGD(model.parameters(), lr=1e-3))
    start = time.perf_counter()
    with loops.quiet():
        trainer.train(
            dataset,
            num_epochs=1,
            per_device_batch_size=batch_size,
            train_dataloader_kwargs=loader_kwargs,
        )
    seconds = time.perf_counter() - start
    config = trainer.run_config
    return seconds, 0 if config is None else int(config.train_dl_kwargs.get("num_workers", 0))


def measure(
    quick: bool, rounds: int | None = None, chosen: tuple[str, ...] = KINDS
) -> dict[str, Any]:
    """Every kind under every setting; each paired against the kind's best fixed setting."""
    torch.set_num_threads(1)
    rounds = rounds or (3 if quick else 10)
    built = kinds(quick, chosen)
    compared = settings()
    times: dict[tuple[str, str], list[float]] = {
        (kind, name): [] for kind in built for name in compared
    }
    workers: dict[str, int] = {}
    order = list(times)
    shuffler = random.Random(0)
    for round_index in range(rounds + 1):  # round 0 is a warm-up
        shuffler.shuffle(order)
        for kind, name in order:
            seconds, used = one_call(built[kind], compared[name])
            if name == DEFAULT:
                workers[kind] = used
            if round_index > 0:
                times[kind, name].append(seconds)
    rows = []
    for kind in built:
        fixed = [name for name in compared if name != DEFAULT]
        best = min(fixed, key=lambda name: statistics.median(times[kind, name]))
        for name in compared:
            setting = f"{name} ({workers[kind]} workers)" if name == DEFAULT else name
            rows.append(
                {
                    "data": kind,
                    "setting": setting + (" (best fixed)" if name == best else ""),
                    "per_call_ms": statistics.median(times[kind, name]) * 1e3,
                    "vs_best": paired_ratio(times[kind, name], times[kind, best]),
                }
            )
    return {
        "name": "Dataloader settings, one train() call of one epoch (wall time, workers started "
        "by each call)",
        "rounds": rounds,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    """Measure and print the table; ``--out`` also writes the figures as JSON."""
    from benchmarks import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and batches")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = measure(args.quick, args.rounds, tuple(args.kinds))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    print("\n".join(report.suites_markdown({"loaders": results})))


if __name__ == "__main__":
    main()
