"""A Hugging Face model with dict batches in several processes, through the default steps.

The same run in one process with a batch the size of all processes' batches together gives
the same weights (DDP averages equal-sized per-process means).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torchmetrics
from common import max_difference, report_and_exit
from helpers import TokenDataset, make_tiny_bert
from torch.utils.data import DataLoader

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, MetricsCallback


def main() -> None:
    data, eval_data = TokenDataset(32), TokenDataset(12, seed=1)
    model = make_tiny_bert()
    reference = copy.deepcopy(model)
    accuracy = MetricsCallback(torchmetrics.classification.MulticlassAccuracy(2, average="micro"))
    trainer = Trainer(
        model, None, torch.optim.SGD(model.parameters(), lr=0.1), (*DEFAULT_CALLBACKS, accuracy)
    )
    per_device = 4
    trainer.train(
        data,
        num_epochs=2,
        eval_dataset=eval_data,
        per_device_batch_size=per_device,
        train_dataloader_kwargs={"shuffle": False},
    )
    logits = trainer.predict(eval_data, per_device_batch_size=3)

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference.train()
    for _ in range(2):
        for batch in DataLoader(data, batch_size=per_device * trainer.accelerator.num_processes):
            reference(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    reference.eval()
    with torch.no_grad():
        expected = reference(**eval_data[slice(0, 12)]).logits  # type: ignore[index]
    results: dict[str, Any] = {
        "difference_to_one_process": max_difference(trainer.get_model(), reference),
        "logits_shape": list(logits.shape),
        "logits_difference": (logits - expected).abs().max().item(),
        "accuracy": trainer.run_history.get_latest_metric("multiclass_accuracy"),
        "eval_loss": trainer.run_history.get_latest_metric("eval_loss_epoch"),
    }
    report_and_exit(results)


if __name__ == "__main__":
    main()
