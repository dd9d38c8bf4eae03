"""The immutable description of the current training or evaluation run."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = ["TrainerRunConfig"]


@dataclass(frozen=True)
class TrainerRunConfig:
    """The settings of the current ``train()`` or ``evaluate()`` call, fixed when it starts.

    The field names are those of pytorch-accelerated, so ported callbacks keep working. Counts of
    updates are per process: that is the unit a scheduler is stepped in, because every process
    steps its own scheduler once per optimizer update.

    Attributes:
        num_epochs: Epochs this run will execute (``max_num_train_steps`` may lower it).
        train_per_device_batch_size: Batch size of the train dataloader on each process.
        train_dl_kwargs: Keyword arguments the train dataloader was built with.
        eval_per_device_batch_size: Batch size of the eval dataloader on each process.
        eval_dl_kwargs: Keyword arguments the eval dataloader was built with (``{}`` without one).
        gradient_accumulation_steps: Micro-batches per optimizer update.
        gradient_clip_value: Clip each gradient element to this magnitude, or ``None``.
        max_grad_norm: Clip the global gradient norm to this value, or ``None``.
        train_total_batch_size: Samples per optimizer update across all processes.
        eval_total_batch_size: Samples per eval step across all processes.
        num_update_steps_per_epoch: Optimizer updates per epoch on each process.
        num_local_update_steps_per_epoch: Same as ``num_update_steps_per_epoch`` (kept for
            pytorch-accelerated code, where the two differed).
        total_num_update_steps: Optimizer updates this run performs on each process.
        train_dataloader_len: Batches per epoch in this process's train dataloader (0 in
            ``evaluate()``).
        max_num_train_steps: The limit passed to ``train()``, or ``None``.
        is_local_process_zero: Whether this is the main process of its node.
        is_world_process_zero: Whether this is the main process of the whole run.
        is_distributed: Whether more than one process takes part.
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.
        num_processes: Number of processes taking part.
    """

    num_epochs: int
    train_per_device_batch_size: int
    train_dl_kwargs: dict[str, Any]
    eval_per_device_batch_size: int
    eval_dl_kwargs: dict[str, Any]
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    max_grad_norm: float | None
    train_total_batch_size: int
    eval_total_batch_size: int
    num_update_steps_per_epoch: int
    num_local_update_steps_per_epoch: int
    total_num_update_steps: int
    train_dataloader_len: int
    max_num_train_steps: int | None
    is_local_process_zero: bool
    is_world_process_zero: bool
    is_distributed: bool
    mixed_precision: str
    num_processes: int

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a dict (shallow: samplers and generators are kept as they are).

        Returns:
            A new dict with one entry per field; the dataloader kwargs are copied.
        """
        result = {field.name: getattr(self, field.name) for field in fields(self)}
        result["train_dl_kwargs"] = dict(self.train_dl_kwargs)
        result["eval_dl_kwargs"] = dict(self.eval_dl_kwargs)
        return result
