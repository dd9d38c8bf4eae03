"""The training loops the benchmark compares, each training the same model on the same data.

Every loop is a function ``(dataset, batch_size, probe) -> None`` that trains one epoch and
calls ``probe()`` once per step, from its loss function (a ``ProbedLoss``): every loop calls
its loss once per step, so all loops are timed at the same point and the probe costs each of
them the same single call. (A probe in a trainer callback would charge the trainers a
listened step event that the hand-written loops do not pay.) Loops are built by factories so
that per-process objects (an ``Accelerator``, a ``Trainer``) are created once, outside the
timed region, as a user would.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import scratch_directory

Probe = Callable[[], None]
Loop = Callable[[TensorDataset, int, Probe], None]


def no_probe() -> None:
    """A probe that records nothing."""


class ProbedLoss:
    """The mean squared error, calling ``probe`` first: the loss function of every loop."""

    def __init__(self) -> None:
        self.probe: Probe = no_probe
        self._mse = nn.MSELoss()

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Call the probe, then return the loss."""
        self.probe()
        return self._mse(outputs, targets)  # type: ignore[no-any-return]


def make_mlp() -> nn.Module:
    """The tiny model: per-step time is dominated by framework overhead."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))


def make_cnn() -> nn.Module:
    """The medium model: about 20 ms per step of real compute on one CPU thread."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 1),
    )


def mlp_data(num_samples: int) -> TensorDataset:
    """Random 32-feature inputs whose target is their sum."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(num_samples, 32, generator=generator)
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))


def cnn_data(num_samples: int) -> TensorDataset:
    """Random 3x16x16 images whose target is their mean."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(num_samples, 3, 16, 16, generator=generator)
    return TensorDataset(inputs, inputs.mean(dim=(1, 2, 3)).unsqueeze(1))


def hand_written(model: nn.Module) -> Loop:
    """Plain PyTorch: DataLoader, forward, loss, backward, step, zero_grad."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_func = ProbedLoss()

    def run(dataset: TensorDataset, batch_size: int, probe: Probe) -> None:
        loss_func.probe = probe
        model.train()
        for inputs, targets in DataLoader(dataset, batch_size=batch_size, shuffle=True):
            loss = loss_func(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    return run


def accelerate_loop(model: nn.Module, accelerator: Any = None, pin_memory: bool = False) -> Loop:
    """The loop accelerate's documentation teaches, with its prepared objects.

    Args:
        model: The model to train.
        accelerator: The ``Accelerator`` to prepare with; ``Accelerator(cpu=True)`` if none.
        pin_memory: Whether the dataloader pins its batches (for a GPU).
    """
    from accelerate import Accelerator

    accelerator = accelerator or Accelerator(cpu=True)
    prepared_model, optimizer = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=1e-3)
    )
    loss_func = ProbedLoss()

    def run(dataset: TensorDataset, batch_size: int, probe: Probe) -> None:
        loss_func.probe = probe
        prepared_model.train()
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=pin_memory)
        loader = accelerator.prepare(loader)
        for inputs, targets in loader:
            loss = loss_func(prepared_model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator._dataloaders.clear()  # do not let repeated rounds accumulate loaders

    return run


def pytorch_accel_trainer(model: nn.Module, default_callbacks: bool) -> Loop:
    """``pytorch_accel.Trainer``, with the default callbacks or none."""
    from pytorch_accel import Trainer
    from pytorch_accel.trainer import DEFAULT_CALLBACKS

    loss_func = ProbedLoss()
    callbacks = DEFAULT_CALLBACKS if default_callbacks else ()
    trainer = Trainer(
        model, loss_func, torch.optim.SGD(model.parameters(), lr=1e-3), callbacks=callbacks
    )

    def run(dataset: TensorDataset, batch_size: int, probe: Probe) -> None:
        loss_func.probe = probe
        with quiet():
            trainer.train(dataset, num_epochs=1, per_device_batch_size=batch_size)

    return run


def pytorch_accel_step_logging(model: nn.Module, every_n_updates: int = 50) -> Loop:
    """``pytorch_accel.Trainer`` with the default callbacks and step-level logging.

    A ``TrackingCallback`` logs the step-level metrics every ``every_n_updates`` updates to
    its step CSV file (in a temporary directory) and the epoch metrics to its CSV file; no
    tracker, so that the row measures the logging machinery, not TensorBoard's writer.
    """
    from pytorch_accel import Trainer
    from pytorch_accel.callbacks import TrackingCallback
    from pytorch_accel.trainer import DEFAULT_CALLBACKS

    directory = scratch_directory("bench-step-logging-")
    tracking = TrackingCallback(
        log_with=(), csv_path=directory / "metrics.csv", log_every_n_updates=every_n_updates
    )
    loss_func = ProbedLoss()
    trainer = Trainer(
        model,
        loss_func,
        torch.optim.SGD(model.parameters(), lr=1e-3),
        callbacks=(*DEFAULT_CALLBACKS, tracking),
    )

    def run(dataset: TensorDataset, batch_size: int, probe: Probe) -> None:
        loss_func.probe = probe
        with quiet():
            trainer.train(dataset, num_epochs=1, per_device_batch_size=batch_size)

    return run


def pytorch_accelerated_trainer(model: nn.Module) -> Loop | None:
    """pytorch-accelerated's ``Trainer`` with its default callbacks, when it is installed."""
    try:
        from pytorch_accelerated import Trainer
    except ImportError:
        return None

    loss_func = ProbedLoss()
    trainer = Trainer(model, loss_func, torch.optim.SGD(model.parameters(), lr=1e-3))
    kwargs: dict[str, Any] = {"num_workers": 0, "pin_memory": False}

    def run(dataset: TensorDataset, batch_size: int, probe: Probe) -> None:
        loss_func.probe = probe
        with quiet():
            trainer.train(
                dataset,
                num_epochs=1,
                per_device_batch_size=batch_size,
                train_dataloader_kwargs=kwargs,
            )

    return run


@contextlib.contextmanager
def quiet() -> Any:
    """Swallow progress bars and prints, which a benchmark should not time."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
