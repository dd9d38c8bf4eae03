"""The loops of the multi-process, evaluation, prediction and input-pipeline benchmarks.

Every loop is a function ``(probe) -> None`` that runs once over its data and calls ``probe()``
once per batch: training loops from their loss function (``loops.ProbedLoss``), evaluation
and prediction loops from a forward pre-hook of their model. Each hand-written loop is what a
careful user writes with plain PyTorch: ``DistributedDataParallel`` and a
``DistributedSampler`` with several processes, ``torch.no_grad()`` and one ``all_gather`` per
batch to predict, one all-reduce of the loss sum per evaluation. They run inside a process
group (``benchmarks.worker``) where every process builds the same loops in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from benchmarks import loops, scratch_directory

Probe = Callable[[], None]
Run = Callable[[Probe], None]


def world_size() -> int:
    """Processes in the group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _loader(
    dataset: Dataset[Any], batch_size: int, shuffle: bool, **kwargs: Any
) -> DataLoader[Any]:
    """A plain loader, sharded with a ``DistributedSampler`` when there are several processes."""
    if world_size() == 1:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, **kwargs)
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, shuffle=shuffle)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)


def _wrapped(model: nn.Module) -> nn.Module:
    if world_size() == 1:
        return model
    return nn.parallel.DistributedDataParallel(model)


def hand_written_train(model: nn.Module, dataset: Dataset[Any], batch_size: int) -> Run:
    """Plain PyTorch training (DDP with several processes): one epoch per call."""
    ddp = _wrapped(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_func = loops.ProbedLoss()
    loader = _loader(dataset, batch_size, shuffle=True)
    epochs = [0]

    def run(probe: Probe) -> None:
        loss_func.probe = probe
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epochs[0])
        epochs[0] += 1
        ddp.train()
        for inputs, targets in loader:
            loss = loss_func(ddp(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    return run


def trainer_train(
    model: nn.Module, dataset: Dataset[Any], batch_size: int, callbacks: tuple[Any, ...]
) -> Run:
    """``pytorch_accel.Trainer.train`` for one epoch per call, with ``callbacks``."""
    from pytorch_accel import Trainer

    loss_func = loops.ProbedLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = Trainer(model, loss_func, optimizer, callbacks=callbacks)

    def run(probe: Probe) -> None:
        loss_func.probe = probe
        with loops.quiet():
            trainer.train(dataset, num_epochs=1, per_device_batch_size=batch_size)

    return run


def default_callbacks(preemption: bool = False) -> tuple[Any, ...]:
    """The default callbacks, plus preemption handling (no saves) if asked."""
    from pytorch_accel.callbacks import DEFAULT_CALLBACKS, SaveTrainingStateCallback

    if not preemption:
        return tuple(DEFAULT_CALLBACKS)
    save_dir = scratch_directory("bench-preemption-")
    return (*DEFAULT_CALLBACKS, SaveTrainingStateCallback(save_dir, save_at_end=False))


class _Probed:
    """A forward pre-hook that calls the current probe: one call per batch."""

    def __init__(self, model: nn.Module) -> None:
        self.probe: Probe = loops.no_probe
        model.register_forward_pre_hook(lambda *args: self.probe())


def hand_written_evaluate(model: nn.Module, dataset: Dataset[Any], batch_size: int) -> Run:
    """``no_grad`` evaluation: the loss sum on the device, all-reduced once at the end."""
    hook = _Probed(model)
    loader = _loader(dataset, batch_size, shuffle=False)
    mse = nn.MSELoss(reduction="sum")

    def run(probe: Probe) -> None:
        hook.probe = probe
        model.eval()
        total, count = torch.zeros(()), 0
        with torch.no_grad():
            for inputs, targets in loader:
                total += mse(model(inputs), targets)
                count += len(inputs)
        if world_size() > 1:
            dist.all_reduce(total)
        float(total) / (count * world_size())

    return run


def hand_written_predict(model: nn.Module, dataset: Dataset[Any], batch_size: int) -> Run:
    """``no_grad`` prediction: each batch's outputs gathered from every process, then joined."""
    hook = _Probed(model)
    loader = _loader(dataset, batch_size, shuffle=False)

    def run(probe: Probe) -> None:
        hook.probe = probe
        model.eval()
        outputs = []
        with torch.no_grad():
            for inputs, _ in loader:
                batch = model(inputs)
                if world_size() > 1:
                    parts = [torch.empty_like(batch) for _ in range(world_size())]
                    dist.all_gather(parts, batch)
                    batch = torch.cat(parts)
                outputs.append(batch)
        torch.cat(outputs)

    return run


def trainer_inference(
    model: nn.Module, dataset: Dataset[Any], batch_size: int, predict: bool
) -> Run:
    """``Trainer.evaluate`` (or ``Trainer.predict``) with the default callbacks."""
    from pytorch_accel import Trainer
    from pytorch_accel.callbacks import DEFAULT_CALLBACKS

    hook = _Probed(model)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=1e-3),
        callbacks=DEFAULT_CALLBACKS,
    )

    def run(probe: Probe) -> None:
        hook.probe = probe
        with loops.quiet():
            if predict:
                trainer.predict(dataset, per_device_batch_size=batch_size)
            else:
                trainer.evaluate(dataset, per_device_batch_size=batch_size)

    return run


def image_folder(root: Path, num_images: int, size: int = 32) -> Path:
    """Write a 2-class image folder of random PNGs (``num_images`` in all) under ``root``."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for index in range(num_images):
        folder = root / f"class{index % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = torch.randint(0, 256, (size, size, 3), generator=generator, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"{index}.png")
    return root


def image_dataset(root: Path) -> Dataset[Any]:
    """An ``ImageFolder`` with the examples' transforms (to tensor, normalise)."""
    from torchvision import datasets, transforms  # type: ignore[import-untyped]

    transform = transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))]
    )
    folder: Dataset[Any] = datasets.ImageFolder(str(root), transform=transform)
    return folder


def make_classifier() -> nn.Module:
    """The medium CNN with a 2-class head."""
    model = loops.make_cnn()
    assert isinstance(model, nn.Sequential)
    model[-1] = nn.Linear(64, 2)
    return model


def hand_written_images(model: nn.Module, dataset: Dataset[Any], batch_size: int) -> Run:
    """A careful plain loop over an image folder: 2 epochs per call, a new loader per call.

    Workers: one per spare CPU (at most 4), persistent across the epochs of the call, memory
    pinned only for a GPU, the default prefetching (2 batches per worker).
    """
    workers = max(0, min(4, (os.cpu_count() or 1) // world_size() - 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_func = _ProbedCrossEntropy()
    ddp = _wrapped(model)

    def run(probe: Probe) -> None:
        loss_func.probe = probe
        loader = _loader(
            dataset,
            batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
        )
        ddp.train()
        for epoch in range(2):
            if isinstance(loader.sampler, DistributedSampler):
                loader.sampler.set_epoch(epoch)
            for inputs, targets in loader:
                loss = loss_func(ddp(inputs), targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()

    return run


def trainer_images(model: nn.Module, dataset: Dataset[Any], batch_size: int) -> Run:
    """``Trainer.train`` for 2 epochs per call, with its default dataloader settings."""
    from pytorch_accel import Trainer
    from pytorch_accel.callbacks import DEFAULT_CALLBACKS

    loss_func = _ProbedCrossEntropy()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = Trainer(model, loss_func, optimizer, callbacks=DEFAULT_CALLBACKS)

    def run(probe: Probe) -> None:
        loss_func.probe = probe
        with loops.quiet():
            trainer.train(dataset, num_epochs=2, per_device_batch_size=batch_size)

    return run


class _ProbedCrossEntropy:
    """Cross-entropy that calls ``probe`` first."""

    def __init__(self) -> None:
        self.probe: Probe = loops.no_probe
        self._loss = nn.CrossEntropyLoss()

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.probe()
        return self._loss(outputs, targets)  # type: ignore[no-any-return]


def regression_data(num_samples: int) -> TensorDataset:
    """The medium model's data: random 3x16x16 images whose target is their mean."""
    return loops.cnn_data(num_samples)
