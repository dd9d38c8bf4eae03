"""Checks of the arguments of the trainer's entry points: the constructor, train and evaluate.

Each failure names the entry point, the argument, the value received and the fix (see
``pytorch_accel._validation``), before anything is prepared or trained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel._validation import (
    check_callable,
    check_mapping,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
    check_sized_dataset,
    fail,
)
from pytorch_accel.distributed import check_world_size
from pytorch_accel.tracking import RunHistory

__all__ = [
    "check_accelerator",
    "check_constructor_arguments",
    "check_enough_samples",
    "check_evaluate_arguments",
    "check_has_batches",
    "check_loss_func",
    "check_progress_interval",
    "check_train_arguments",
]


def check_constructor_arguments(
    model: object, loss_func: object, optimizer: object, run_history: object
) -> None:
    """Check the arguments of ``Trainer(...)``."""
    where = "Trainer"
    if not isinstance(model, nn.Module):
        fail(TypeError, where, "model", model, "a torch.nn.Module", "Pass your model instance.")
    check_callable(where, "loss_func", loss_func, "Pass e.g. torch.nn.CrossEntropyLoss().")
    if not isinstance(optimizer, torch.optim.Optimizer):
        fail(
            TypeError,
            where,
            "optimizer",
            optimizer,
            "a torch.optim.Optimizer",
            "Pass e.g. torch.optim.AdamW(model.parameters(), lr=1e-3).",
        )
    if run_history is not None and not isinstance(run_history, RunHistory):
        fail(
            TypeError,
            where,
            "run_history",
            run_history,
            "a RunHistory or None",
            "Pass e.g. InMemoryRunHistory(), or leave it out.",
        )


def check_accelerator(accelerator: Accelerator) -> None:
    """Check that the accelerator matches the launcher and leaves accumulation to the trainer."""
    check_world_size(accelerator.num_processes)
    if accelerator.gradient_accumulation_steps != 1:
        fail(
            ValueError,
            "Trainer._create_accelerator",
            "gradient_accumulation_steps",
            accelerator.gradient_accumulation_steps,
            "1 on the Accelerator",
            "The trainer accumulates itself: pass train(gradient_accumulation_steps=N) and "
            "leave the Accelerator's (and ACCELERATE_GRADIENT_ACCUMULATION_STEPS) at 1.",
        )


def check_train_arguments(arguments: Mapping[str, Any]) -> None:
    """Check the arguments of ``Trainer.train`` (its ``locals()``)."""
    where = "Trainer.train"
    check_sized_dataset(where, "train_dataset", arguments["train_dataset"])
    if arguments["eval_dataset"] is not None:
        check_sized_dataset(where, "eval_dataset", arguments["eval_dataset"])
    for name in ("num_epochs", "per_device_batch_size", "gradient_accumulation_steps"):
        check_positive_int(where, name, arguments[name])
    check_positive_int(
        where, "max_num_train_steps", arguments["max_num_train_steps"], allow_none=True
    )
    for name in ("gradient_clip_value", "max_grad_norm"):
        check_positive_number(where, name, arguments[name], allow_none=True)
    if arguments["gradient_clip_value"] is not None and arguments["max_grad_norm"] is not None:
        fail(
            ValueError,
            where,
            "max_grad_norm",
            arguments["max_grad_norm"],
            "None when gradient_clip_value is set",
            "Clip either by value (gradient_clip_value) or by norm (max_grad_norm), not both.",
        )
    check_callable(
        where,
        "create_scheduler_fn",
        arguments["create_scheduler_fn"],
        "Pass a function optimizer -> scheduler, e.g. functools.partial(StepLR, step_size=10).",
    )
    check_callable(where, "collate_fn", arguments["collate_fn"], "Pass a function or None.")
    for name in ("train_dataloader_kwargs", "eval_dataloader_kwargs"):
        check_mapping(where, name, arguments[name])


def check_progress_interval(where: str, progress_interval: object) -> None:
    """Reject a ``trainer.progress_interval`` that is not a number of seconds >= 0."""
    check_non_negative_number(
        where,
        "trainer.progress_interval",
        progress_interval,
        "Set trainer.progress_interval to seconds, e.g. 0.05, or 0 for every step.",
    )


def check_enough_samples(train_dl: DataLoader[Any], num_samples: int, num_processes: int) -> None:
    """Reject a train set smaller than one batch per process."""
    batch_size = train_dl.batch_size
    if batch_size is not None and num_samples < batch_size * num_processes:
        fail(
            ValueError,
            "Trainer.train",
            "train_dataset",
            f"<{num_samples} samples>",
            f"at least one batch per process ({batch_size} x {num_processes} processes)",
            f"Lower per_device_batch_size to at most {max(1, num_samples // num_processes)}.",
        )


def check_has_batches(train_dataloader: DataLoader[Any], dl_kwargs: Mapping[str, Any]) -> None:
    """Reject a prepared train dataloader that yields no batch on this process."""
    if len(train_dataloader) == 0:
        fail(
            ValueError,
            "Trainer.train",
            "train_dataloader_kwargs",
            dict(dl_kwargs),
            "settings that give at least one batch per process",
            "Check batch_sampler, drop_last and the batch size against the dataset size.",
        )


def check_loss_func(where: str, loss_func: object, default_steps: list[str]) -> None:
    """Reject ``loss_func=None`` while ``default_steps`` (step methods that call it) are used."""
    if loss_func is None and default_steps:
        one = len(default_steps) == 1
        names = " and ".join(default_steps)
        fail(
            TypeError,
            where,
            "Trainer's loss_func",
            None,
            f"a callable while {names} {'is' if one else 'are'} not overridden",
            f"Pass a loss function to Trainer(...), or override {'that' if one else 'those'} "
            f"step method{'' if one else 's'}.",
        )


def check_evaluate_arguments(
    dataset: object, per_device_batch_size: object, dataloader_kwargs: object
) -> None:
    """Check the arguments of ``Trainer.evaluate`` (``dataset`` after its default is applied)."""
    where = "Trainer.evaluate"
    if dataset is None:
        fail(
            ValueError,
            where,
            "dataset",
            None,
            "a dataset",
            "Pass evaluate(dataset=...), or call train(..., eval_dataset=...) first.",
        )
    check_sized_dataset(where, "dataset", dataset)
    check_positive_int(where, "per_device_batch_size", per_device_batch_size)
    check_mapping(where, "dataloader_kwargs", dataloader_kwargs)
