"""predict() in several processes: every sample once, in dataset order, as in one process."""

from __future__ import annotations

from typing import Any

import torch
from common import report_and_exit
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import PredictOutputsError, Trainer
from pytorch_accel.callbacks import TrainerCallback


class Stream(TrainerCallback):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_predict_step_end(
        self, trainer: Trainer, batch: Any, predictions: Any, **kwargs: Any
    ) -> None:
        self.sizes.append(len(predictions))


class Widening(Trainer):
    """Batch i's outputs have i + 1 times the columns (the same on every process), or a mean."""

    mean = False
    calls = 0

    def calculate_predict_batch(self, batch: Any) -> Any:
        self.calls += 1
        outputs = super().calculate_predict_batch(batch)
        return outputs.mean() if self.mean else outputs.repeat(1, self.calls)


def unconcatenated(model: nn.Module, inputs: torch.Tensor) -> dict[str, Any]:
    """What predict() keeps of outputs that cannot be concatenated, on this process."""
    trainer = Widening(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    try:
        trainer.predict(TensorDataset(inputs), per_device_batch_size=4)
    except PredictOutputsError as error:
        kept = [list(batch.shape) for batch in error.batches]
        firsts = torch.cat([batch[:, :2] for batch in error.batches])
    trainer.mean, trainer.calls = True, 0
    try:
        trainer.predict(TensorDataset(inputs), per_device_batch_size=4)
    except ValueError as error:
        refused = (trainer.calls, "0-d tensor" in str(error))
    with torch.no_grad():
        equal = bool(torch.allclose(firsts, model(inputs), atol=1e-6))
    return {"kept": kept, "equal": equal, "refused": refused}


class Ragged(Trainer):
    """Outputs repeated 1 to 3 times: widths differ between batches and between processes."""

    calls = 0

    def calculate_predict_batch(self, batch: Any) -> Any:
        self.calls += 1
        repeats = 1 + self.accelerator.process_index + self.calls % 2
        return super().calculate_predict_batch(batch).repeat(1, repeats)


def padded(model: nn.Module, inputs: torch.Tensor) -> dict[str, Any]:
    """predict(pad_value=...) of outputs whose widths differ across batches and processes."""
    trainer = Ragged(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    outputs = trainer.predict(TensorDataset(inputs), per_device_batch_size=4, pad_value=-1000.0)
    with torch.no_grad():
        reference = model(inputs)
    repeats = []
    for row, own in zip(outputs, reference, strict=True):
        count = int((row != -1000.0).sum()) // 2
        if torch.allclose(row[: 2 * count], own.repeat(count), atol=1e-6):
            repeats.append(count)
    return {"shape": list(outputs.shape), "repeats": sorted(set(repeats)), "rows": len(repeats)}


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    stream = Stream()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), (stream,))
    results: dict[str, Any] = {}
    for samples, batch in ((21, 4), (10, 4), (3, 4), (16, 4)):
        inputs = torch.arange(samples * 4, dtype=torch.float32).reshape(samples, 4) / 10
        with torch.no_grad():
            reference = model(inputs)  # the whole set in one process
        stream.sizes = []
        outputs = trainer.predict(TensorDataset(inputs), per_device_batch_size=batch)
        streamed = sum(stream.sizes)
        from_loader = trainer.predict(DataLoader(TensorDataset(inputs), batch_size=batch))
        results[f"{samples}x{batch}"] = {
            "shape": list(outputs.shape),
            "equal": bool(torch.allclose(outputs, reference, atol=1e-6)),
            "loader_equal": bool(torch.allclose(from_loader, reference, atol=1e-6)),
            "streamed": streamed,
        }
    results["unconcatenated"] = unconcatenated(model, torch.randn(21, 4))
    results["padded"] = padded(model, torch.randn(21, 4))
    report_and_exit(results)


if __name__ == "__main__":
    main()
