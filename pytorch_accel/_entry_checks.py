"""Checks of the arguments of the trainer's entry points: the constructor, train and evaluate.

Each failure names the entry point, the argument, the value received and the fix (see
``pytorch_accel._validation``), before anything is prepared or trained. The checks of the data
(datasets, streams, eval sets, dataloaders) live in ``_data_checks`` and are re-exported here.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accel._data_checks import (
    check_data,
    check_dataloader_settings,
    check_enough_samples,
    check_eval_data,
    check_has_batches,
    check_train_data,
    has_length,
    loader_settings,
    predict_dataloader,
)
from pytorch_accel._validation import (
    check_callable,
    check_mapping,
    check_non_negative_number,
    check_optimizer,
    check_positive_int,
    check_positive_number,
    fail,
)
from pytorch_accel.distributed import check_world_size
from pytorch_accel.dry_run import check_dry_run_arguments
from pytorch_accel.run_setup import check_run_setup_arguments
from pytorch_accel.tracking import RunHistory

if TYPE_CHECKING:
    from pytorch_accel.run_config import TrainerRunConfig
    from pytorch_accel.trainer import Trainer

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "check_accelerator",
    "check_constructor_arguments",
    "check_data",
    "check_dataloader_settings",
    "check_enough_samples",
    "check_eval_data",
    "check_evaluate_arguments",
    "check_has_batches",
    "check_loss_func",
    "check_train_arguments",
    "check_trainer_settings",
    "created_scheduler",
    "has_length",
    "loader_settings",
    "predict_dataloader",
    "suggest_arguments",
]


def check_constructor_arguments(
    model: object, loss_func: object, optimizer: object, callbacks: object, run_history: object
) -> None:
    """Check the arguments of ``Trainer(...)``."""
    where = "Trainer"
    if not isinstance(model, nn.Module):
        fail(TypeError, where, "model", model, "a torch.nn.Module", "Pass your model instance.")
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        fail(
            TypeError,
            where,
            "callbacks",
            callbacks,
            "an iterable of callbacks",
            "Pass callbacks=() for none, or leave it out for DEFAULT_CALLBACKS.",
        )
    check_callable(where, "loss_func", loss_func, "Pass e.g. torch.nn.CrossEntropyLoss().")
    fix = "Pass e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)."
    _check_optimizer_fits(model, check_optimizer(where, "optimizer", optimizer, fix))
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
    """Check the arguments of ``Trainer.train`` (its ``locals()``) and the trainer's settings."""
    where = "Trainer.train"
    check_trainer_settings(where, arguments["self"])
    _check_run_switches(where, arguments)
    check_train_data(where, arguments)
    check_positive_int(
        where, "gradient_accumulation_steps", arguments["gradient_accumulation_steps"]
    )
    _check_clipping(where, arguments["gradient_clip_value"], arguments["max_grad_norm"])
    check_callable(
        where,
        "create_scheduler_fn",
        arguments["create_scheduler_fn"],
        "Pass a function optimizer -> scheduler, e.g. functools.partial(StepLR, step_size=10).",
    )
    check_callable(where, "collate_fn", arguments["collate_fn"], "Pass a function or None.")
    check_run_setup_arguments(where, arguments)
    check_dry_run_arguments(where, arguments)


def _check_run_switches(where: str, arguments: Mapping[str, Any]) -> None:
    """Check ``reset_run_history`` and ``resume_from``."""
    if not isinstance(arguments["reset_run_history"], bool):
        fail(
            TypeError,
            where,
            "reset_run_history",
            arguments["reset_run_history"],
            "True or False",
            "Pass reset_run_history=False to continue the run history of earlier calls.",
        )
    resume_from = arguments["resume_from"]
    if resume_from is not None and not isinstance(resume_from, (str, os.PathLike)):
        fail(
            TypeError,
            where,
            "resume_from",
            resume_from,
            "a directory path, 'latest' or None",
            "Pass the directory of a training state, e.g. resume_from='states/updates-00001000'.",
        )


def _check_clipping(where: str, clip_value: object, max_norm: object) -> None:
    """Check ``gradient_clip_value`` and ``max_grad_norm``: positive, and not both."""
    check_positive_number(where, "gradient_clip_value", clip_value, allow_none=True)
    check_positive_number(where, "max_grad_norm", max_norm, allow_none=True)
    if clip_value is not None and max_norm is not None:
        fail(
            ValueError,
            where,
            "max_grad_norm",
            max_norm,
            "None when gradient_clip_value is set",
            "Clip either by value (gradient_clip_value) or by norm (max_grad_norm), not both.",
        )


def check_trainer_settings(where: str, trainer: Trainer) -> None:
    """Reject an entry point called during ``train()``, and bad trainer attributes.

    Checks ``progress_interval``, ``limit_train_batches`` and ``limit_eval_batches``.
    """
    if trainer.is_training:
        raise RuntimeError(
            f"{where}: called while train() is running (from a callback or hook?). It would "
            "replace the run's dataloaders and history. To evaluate during training, call "
            "trainer.run_eval_epoch(); train again after train() returns."
        )
    check_non_negative_number(
        where,
        "trainer.progress_interval",
        trainer.progress_interval,
        "Set trainer.progress_interval to seconds, e.g. 0.05, or 0 for every step.",
    )
    for name in ("limit_train_batches", "limit_eval_batches"):
        check_positive_int(where, f"trainer.{name}", getattr(trainer, name), allow_none=True)


def check_loss_func(
    where: str, trainer: Trainer, base: type, *, with_train: bool, with_eval: bool
) -> None:
    """Reject a ``loss_func`` that the default step methods in use cannot use.

    That is ``None``, or a loss with ``reduction="none"``, whose per-sample losses the
    default steps would neither back-propagate nor record as a mean.

    Args:
        where: The entry point.
        trainer: The trainer (its class tells which step methods are overridden).
        base: The ``Trainer`` class, whose step methods call ``loss_func``.
        with_train: Whether the training step runs.
        with_eval: Whether the evaluation step runs.
    """
    steps = ("calculate_train_batch_loss",) * with_train + (
        "calculate_eval_batch_loss",
    ) * with_eval
    defaults = [step for step in steps if getattr(type(trainer), step) is getattr(base, step)]
    loss_func, names = trainer.loss_func, " and ".join(defaults)
    if defaults and getattr(loss_func, "reduction", None) == "none":
        fail(
            ValueError,
            where,
            "Trainer's loss_func",
            loss_func,
            f"a loss that reduces to one value while {names} "
            f"{'is' if len(defaults) == 1 else 'are'} not overridden",
            "Use reduction='mean' (or 'sum'), or override the step methods to reduce the "
            "per-sample losses yourself.",
        )
    if loss_func is None and defaults:
        one = len(defaults) == 1
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
    dataset: object,
    per_device_batch_size: object,
    dataloader_kwargs: object,
    collate_fn: object,
    metric_prefix: object,
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
    check_eval_data(
        where,
        "dataset",
        dataset,
        per_device_batch_size=per_device_batch_size,
        dataloader_kwargs=dataloader_kwargs,
        collate_fn=collate_fn,
    )
    check_positive_int(where, "per_device_batch_size", per_device_batch_size, allow_none=True)
    check_mapping(where, "dataloader_kwargs", dataloader_kwargs)
    if not isinstance(metric_prefix, str):
        fail(
            TypeError,
            where,
            "metric_prefix",
            metric_prefix,
            "a string",
            "Pass e.g. metric_prefix='test_' (the loss is then recorded as 'test_loss').",
        )


def _check_optimizer_fits(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Reject a model with nothing to train, or an optimizer over another model's parameters."""
    own = {id(parameter) for parameter in model.parameters()}
    if not own:
        raise ValueError(
            f"Trainer: model must have parameters to train, got a {type(model).__name__} with "
            "none. Check that its layers are registered as submodules (attributes, or "
            "nn.ModuleList rather than a Python list)."
        )
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    if optimized and not any(id(parameter) in own for parameter in optimized):
        raise ValueError(
            f"Trainer: optimizer must be over the model's parameters, got a "
            f"{type(optimizer).__name__} none of whose {len(optimized)} parameters belongs to "
            "the model, so nothing would train. Build it from this model, e.g. "
            "torch.optim.AdamW(model.parameters())."
        )


def created_scheduler(factory: Any, optimizer: Any, run_config: TrainerRunConfig | None) -> Any:
    """Call ``create_scheduler_fn`` (placeholders resolved); check what it returned.

    Raises:
        TypeError: If it cannot be called with the optimizer.
        ValueError: If it returned ``None``, or a ``OneCycleLR`` shorter than the run.
    """
    where = "Trainer.train"
    try:
        scheduler = factory(optimizer)
    except TypeError as error:
        raise TypeError(
            f"{where}: create_scheduler_fn could not be called with the optimizer ({error}). "
            "It must take the optimizer as its one positional argument, e.g. "
            "functools.partial(StepLR, step_size=10)."
        ) from error
    if scheduler is None:
        fail(
            ValueError,
            where,
            "create_scheduler_fn's result",
            None,
            "a scheduler",
            "Return the scheduler from the function, e.g. lambda opt: StepLR(opt, 10).",
        )
    total = getattr(scheduler, "total_steps", None)
    needed = None if run_config is None else run_config.total_num_update_steps
    if isinstance(total, int) and needed is not None and total < needed:
        fail(
            ValueError,
            where,
            f"{type(scheduler).__name__}.total_steps",
            total,
            f"at least this run's {needed} optimizer updates",
            "It would fail at the update after its last step. Build it from placeholders, e.g. "
            "total_steps=TrainerPlaceholderValues.TOTAL_NUM_UPDATE_STEPS.",
        )
    return scheduler


def suggest_arguments(method: Callable[P, R]) -> Callable[P, R]:
    """Turn an unknown keyword argument of an entry point into a ``TypeError`` with a suggestion.

    ``train(batch_size=32)`` would fail with Python's generic message; this one names the
    closest argument (``per_device_batch_size``).
    """
    signature = inspect.signature(method)

    @functools.wraps(method)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        unknown = [name for name in kwargs if name not in signature.parameters]
        if unknown:
            known = [name for name in signature.parameters if name != "self"]
            close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.5)
            close = close or [name for name in known if unknown[0] in name][:1]
            hint = f" Did you mean {close[0]}?" if close else ""
            raise TypeError(
                f"Trainer.{method.__name__}: unknown argument {unknown[0]!r}.{hint} "
                f"The arguments are: {', '.join(known)}."
            )
        return method(*args, **kwargs)

    return checked
