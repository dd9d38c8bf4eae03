"""Token-exact accumulation in several processes: the windows equal one large batch.

Each process's micro-batches hold different numbers of tokens; with ``num_items_in_batch``
in the batches, the run's weights equal one process training on a large batch of every
process's micro-batches of a window together (the mean over all their tokens), with and
without gradient accumulation, for a hand-written module and a tiny GPT-2.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from common import max_difference, report_and_exit
from helpers import (
    TinyTokenModel,
    VariableLengthTokens,
    counting_collate,
    large_batch_loop,
    make_tiny_gpt2,
)
from torch import nn
from torch.utils.data import default_collate

from pytorch_accel import Trainer


def train(model: nn.Module, data: Any, accumulation: int, collate_fn: Any) -> Trainer:
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.train(
        data,
        num_epochs=2,
        per_device_batch_size=2,
        gradient_accumulation_steps=accumulation,
        collate_fn=collate_fn,
        train_dataloader_kwargs={"shuffle": False},
    )
    return trainer


def difference(make: Any, accumulation: int, shift: bool, collate: Any = None) -> float:
    data = VariableLengthTokens(16)
    processes = int(os.environ["WORLD_SIZE"])
    window = 2 * processes * accumulation  # every process's micro-batches of one window
    reference = large_batch_loop(make(), data, window_samples=window, num_epochs=2)
    trainer = train(make(), data, accumulation, collate or counting_collate(shift))
    return max_difference(trainer.get_model(), reference)


def all_reduces(collate: Any) -> int:
    """The all-reduces one accumulated run issues (2 epochs of 2 windows)."""
    calls = []
    original = torch.distributed.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    torch.distributed.all_reduce = counted
    try:
        train(TinyTokenModel(), VariableLengthTokens(16), 2, collate)
    finally:
        torch.distributed.all_reduce = original
    return len(calls)


def eval_loss_error() -> float:
    """The relative error of a token-weighted eval loss over 13 samples (a repeated one)."""
    data = VariableLengthTokens(13, seed=3)
    model = TinyTokenModel()
    with torch.no_grad():
        expected = float(model(**default_collate([data[i] for i in range(13)]))["loss"])
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())
    metrics = trainer.evaluate(data, per_device_batch_size=2, collate_fn=counting_collate())
    loss = float(metrics["evaluation_loss"])
    return abs(loss - expected) / expected


def main() -> None:
    results: dict[str, Any] = {
        "eval_loss_error": eval_loss_error(),
        "extra_all_reduces": all_reduces(counting_collate()) - all_reduces(default_collate),
        "accumulated": difference(TinyTokenModel, 2, shift=False),
        "one_batch_per_update": difference(TinyTokenModel, 1, shift=False),
        "gpt2_accumulated": difference(make_tiny_gpt2, 2, shift=True),
        "uncounted": difference(TinyTokenModel, 2, shift=False, collate=default_collate),
    }
    report_and_exit(results)


if __name__ == "__main__":
    main()
