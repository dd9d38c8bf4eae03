"""The immutable description of the current training or evaluation run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sized
from dataclasses import dataclass, fields
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType

from pytorch_accel.dataloaders import num_batches

__all__ = ["TrainerRunConfig", "create_run_config"]


@dataclass(frozen=True)
class TrainerRunConfig:
    """The settings of the current ``train()`` or ``evaluate()`` call, fixed when it starts.

    The field names and order are those of pytorch-accelerated, so ported code keeps working
    (the three fields it did not have come last, with defaults derived from the others when a
    config is built by hand: ``max_grad_norm`` ``None``, ``total_num_update_steps`` and
    ``train_dataloader_len`` from the update counts). Counts of
    updates are per process: that is the unit a scheduler is stepped in, because every process
    steps its own scheduler once per optimizer update.

    Attributes:
        num_epochs: Epochs this run will execute (``max_num_train_steps`` may lower it);
            ``None`` for a run counted only in updates over data without a length.
        train_per_device_batch_size: Batch size of the train dataloader on each process.
        train_dl_kwargs: Keyword arguments the train dataloader was built with.
        eval_per_device_batch_size: Batch size of the eval dataloader on each process.
        eval_dl_kwargs: Keyword arguments the eval dataloader was built with (``{}`` without one).
        gradient_accumulation_steps: Micro-batches per optimizer update.
        gradient_clip_value: Clip each gradient element to this magnitude, or ``None``.
        max_grad_norm: Clip the global gradient norm to this value, or ``None``.
        train_total_batch_size: Samples per optimizer update across all processes.
        eval_total_batch_size: Samples per eval step across all processes.
        num_update_steps_per_epoch: Optimizer updates per epoch on each process (``None``
            when the train data has no length, an ``IterableDataset``).
        num_local_update_steps_per_epoch: Same as ``num_update_steps_per_epoch`` (kept for
            pytorch-accelerated code, where the two differed).
        total_num_update_steps: Optimizer updates this run performs on each process.
        train_dataloader_len: Batches per epoch in this process's train dataloader (0 in
            ``evaluate()``, ``None`` when it has no length).
        max_num_train_steps: The limit passed to ``train()``, or ``None``.
        is_local_process_zero: Whether this is the main process of its node.
        is_world_process_zero: Whether this is the main process of the whole run.
        is_distributed: Whether more than one process takes part.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        num_processes: Number of processes taking part.
        eval_every_n_epochs: The eval sets are evaluated after every this many epochs of the
            run, and after its last.
        sanity_eval_batches: Batches of each eval set evaluated before the first training
            epoch, to check the evaluation (0: none).
        seed: The seed ``train(seed=...)`` applied (before the process index with
            ``seed_per_rank``), or ``None``.
        seed_per_rank: Whether each process was seeded with ``seed + process_index``.
        deterministic: Whether ``train(deterministic=True)`` turned on deterministic mode.
        cudnn_benchmark: What ``train(cudnn_benchmark=...)`` set, or ``None`` (left as it was).
        auto_scale_lr: The base batch size the learning rates were scaled from (``train(
            auto_scale_lr=...)``), or ``None``.
        lr_scale_factor: ``train_total_batch_size / auto_scale_lr`` (1.0 without scaling).
    """

    num_epochs: int | None
    train_per_device_batch_size: int
    train_dl_kwargs: dict[str, Any]
    eval_per_device_batch_size: int
    eval_dl_kwargs: dict[str, Any]
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    train_total_batch_size: int
    eval_total_batch_size: int
    num_update_steps_per_epoch: int | None
    num_local_update_steps_per_epoch: int | None
    max_num_train_steps: int | None
    is_local_process_zero: bool
    is_world_process_zero: bool
    is_distributed: bool
    mixed_precision: str
    num_processes: int
    max_grad_norm: float | None = None
    total_num_update_steps: int = -1
    train_dataloader_len: int | None = -1
    eval_every_n_epochs: int = 1
    sanity_eval_batches: int = 0
    seed: int | None = None
    seed_per_rank: bool = False
    deterministic: bool = False
    cudnn_benchmark: bool | None = None
    auto_scale_lr: int | None = None
    lr_scale_factor: float = 1.0

    def __post_init__(self) -> None:
        """Derive the fields pytorch-accelerated did not have, when a config is built by hand."""
        per_epoch, num_epochs = self.num_update_steps_per_epoch, self.num_epochs
        if self.train_dataloader_len is not None and self.train_dataloader_len < 0:
            batches = None if per_epoch is None else per_epoch * self.gradient_accumulation_steps
            object.__setattr__(self, "train_dataloader_len", batches)
        if self.total_num_update_steps < 0:
            total = None if per_epoch is None or num_epochs is None else per_epoch * num_epochs
            if self.max_num_train_steps is not None:
                total = min(total or self.max_num_train_steps, self.max_num_train_steps)
            object.__setattr__(self, "total_num_update_steps", -1 if total is None else total)

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a new dict; samplers and generators are kept, dl kwargs copied."""
        result = {field.name: getattr(self, field.name) for field in fields(self)}
        result["train_dl_kwargs"] = dict(self.train_dl_kwargs)
        result["eval_dl_kwargs"] = dict(self.eval_dl_kwargs)
        return result


def _num_batches(train_dataloader: Sized | None, limit: int | None) -> int | None:
    """Batches per epoch: ``None`` for a dataloader without a length (and no limit)."""
    batches = 0 if train_dataloader is None else num_batches(train_dataloader)
    if batches is None:  # an IterableDataset's dataloader
        return limit
    return batches if limit is None else min(batches, limit)


def _run_length(
    updates_per_epoch: int | None, num_epochs: int | None, max_num_train_steps: int | None
) -> tuple[int, int | None]:
    """The run's updates and epochs; ``train()`` checked that one of the limits is given."""
    if updates_per_epoch is None:  # a stream: counted in updates (train() required the limit)
        assert max_num_train_steps is not None
        return max_num_train_steps, num_epochs
    total = max_num_train_steps if num_epochs is None else updates_per_epoch * num_epochs
    assert total is not None
    if max_num_train_steps is not None:
        total = min(total, max_num_train_steps)
        num_epochs = math.ceil(total / updates_per_epoch) if updates_per_epoch else 0
    return total, num_epochs


def create_run_config(
    accelerator: Accelerator,
    train_dataloader: Sized | None,
    limit_train_batches: int | None,
    dl_kwargs: tuple[Mapping[str, Any], Mapping[str, Any]],
    *,
    num_epochs: int | None,
    gradient_accumulation_steps: int = 1,
    max_num_train_steps: int | None = None,
    gradient_clip_value: float | None = None,
    max_grad_norm: float | None = None,
    eval_every_n_epochs: int = 1,
    sanity_eval_batches: int = 0,
) -> TrainerRunConfig:
    """Describe a run from its prepared dataloaders and the arguments of ``train()``.

    ``train_dataloader`` is this process's prepared train dataloader (``None`` in
    ``evaluate()``), ``limit_train_batches`` the trainer's, ``dl_kwargs`` the arguments the
    train and eval dataloaders were built with (``{}`` for one not built); the keyword
    arguments are ``train()``'s (``max_num_train_steps`` may lower ``num_epochs``).
    """
    batches = _num_batches(train_dataloader, limit_train_batches)
    train_dl_kwargs, eval_dl_kwargs = dl_kwargs
    updates_per_epoch = None
    if batches is not None:
        updates_per_epoch = math.ceil(batches / gradient_accumulation_steps)
    total_updates, num_epochs = _run_length(updates_per_epoch, num_epochs, max_num_train_steps)
    train_batch = train_dl_kwargs.get("batch_size") or 0
    eval_batch = eval_dl_kwargs.get("batch_size") or train_batch
    num_processes = accelerator.num_processes
    return TrainerRunConfig(
        num_epochs=num_epochs,
        train_per_device_batch_size=train_batch,
        train_dl_kwargs=dict(train_dl_kwargs),
        eval_per_device_batch_size=eval_batch,
        eval_dl_kwargs=dict(eval_dl_kwargs),
        gradient_accumulation_steps=gradient_accumulation_steps,
        gradient_clip_value=gradient_clip_value,
        max_grad_norm=max_grad_norm,
        train_total_batch_size=train_batch * num_processes * gradient_accumulation_steps,
        eval_total_batch_size=eval_batch * num_processes,
        num_update_steps_per_epoch=updates_per_epoch,
        num_local_update_steps_per_epoch=updates_per_epoch,
        total_num_update_steps=total_updates,
        train_dataloader_len=batches,
        max_num_train_steps=max_num_train_steps,
        is_local_process_zero=accelerator.is_local_main_process,
        is_world_process_zero=accelerator.is_main_process,
        is_distributed=accelerator.distributed_type != DistributedType.NO,
        mixed_precision=str(accelerator.mixed_precision),
        num_processes=num_processes,
        eval_every_n_epochs=eval_every_n_epochs,
        sanity_eval_batches=sanity_eval_batches,
    )
