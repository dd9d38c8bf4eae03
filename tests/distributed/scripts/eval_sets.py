"""Several named eval sets in several processes: each equals evaluating the set alone, exactly."""

from __future__ import annotations

from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics.regression import MeanAbsoluteError

from pytorch_accel import Trainer
from pytorch_accel.callbacks import MetricsCallback


def regression_data(samples: int, seed: int, scale: float = 1.0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 4, generator=generator) * scale
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))


def direct(model: nn.Module, dataset: TensorDataset) -> dict[str, float]:
    """The loss and metric of the whole set, computed in this process alone."""
    inputs, targets = dataset.tensors
    with torch.no_grad():
        outputs = model(inputs)
    return {
        "loss": nn.functional.mse_loss(outputs, targets).item(),
        "mae": (outputs - targets).abs().mean().item(),
    }


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    metrics = MetricsCallback(MeanAbsoluteError(), name="mae")
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), (metrics,))
    sets = {"val": regression_data(21, 1), "ood": regression_data(10, 2, scale=3.0)}
    trainer.train(regression_data(32, 0), 2, eval_dataset=sets, per_device_batch_size=4)
    history = trainer.run_history
    unwrapped = trainer.get_model()
    results: dict[str, Any] = {}
    for name, dataset in sets.items():
        alone = trainer.evaluate(dataset, per_device_batch_size=4)
        results[name] = {
            "recorded_loss": history.get_metric_values(f"{name}_eval_loss_epoch")[-1],
            "recorded_mae": history.get_metric_values(f"{name}_mae")[-1],
            "alone_loss": alone["evaluation_loss"],
            "alone_mae": alone["evaluation_mae"],
            "direct": direct(unwrapped, dataset),
        }
    both = trainer.evaluate(sets, per_device_batch_size=4, metric_prefix="both_")
    results["both"] = both
    report_and_exit(results)


if __name__ == "__main__":
    main()
