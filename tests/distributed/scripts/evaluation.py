"""Exact eval loss and gathered-prediction metrics on eval sets that do not divide evenly."""

from __future__ import annotations

from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback


class AccuracyCallback(TrainerCallback):
    """The documented torchmetrics pattern."""

    def __init__(self) -> None:
        self.metric = MulticlassAccuracy(num_classes=3, average="micro")
        self.seen = 0

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.metric.to(trainer.device)

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        predictions = trainer.gather_for_metrics(batch_output["model_outputs"].argmax(dim=-1))
        targets = trainer.gather_for_metrics(batch[1])
        self.seen += len(targets)
        self.metric.update(predictions, targets)

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.run_history.update_metric("accuracy", self.metric.compute().item())
        trainer.run_history.update_metric("samples_seen", self.seen)
        self.metric.reset()
        self.seen = 0


def classification_data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(samples)
    return TensorDataset(
        torch.randn(samples, 4, generator=generator),
        torch.randint(0, 3, (samples,), generator=generator),
    )


def evaluate(samples: int, batch_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(AccuracyCallback(),),
    )
    dataset = classification_data(samples)
    trainer.evaluate(dataset, per_device_batch_size=batch_size)
    inputs, targets = dataset.tensors
    with torch.no_grad():
        logits = model(inputs)
    history = trainer.run_history
    return {
        "loss": history.get_latest_metric("evaluation_loss"),
        "expected_loss": nn.functional.cross_entropy(logits, targets).item(),
        "accuracy": history.get_latest_metric("evaluation_accuracy"),
        "expected_accuracy": (logits.argmax(-1) == targets).float().mean().item(),
        "samples_seen": history.get_latest_metric("evaluation_samples_seen"),
        "eval_batches": len(trainer.eval_dataloader),
    }


def main() -> None:
    report_and_exit(
        {
            f"{samples}x{batch}": evaluate(samples, batch)
            for samples, batch in ((21, 4), (10, 4), (3, 4), (16, 4))
        }
    )


if __name__ == "__main__":
    main()
