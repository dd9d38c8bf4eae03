"""Checks of the arguments of the trainer's entry points, and of the data they take.

The entry points are ``Trainer(...)`` and ``train`` (its arguments bound once, a
``TrainArguments``, and checked by the table ``TRAIN_CHECKS``, one entry per argument);
``evaluate``'s and ``predict``'s are in ``_inference_checks``. Each failure comes before
anything is prepared or trained, built from the value checks of ``_checks``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, parse_flag_from_env
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel._checks import (
    check_bool,
    check_callable,
    check_count,
    check_mapping,
    check_number,
    check_optimizer,
    check_positive_int,
    check_sized_dataset,
    fail,
)
from pytorch_accel._dict_batches import may_be_dict_batches
from pytorch_accel._option_checks import (
    check_accelerator_kwargs,
    check_clipping,
    check_dry_run,
    check_resume,
    check_run_name,
    check_run_setup,
    created_scheduler,
)
from pytorch_accel.dataloaders import named_eval_sets, num_batches
from pytorch_accel.distributed import check_world_size, fsdp_requested
from pytorch_accel.run_config import TrainArguments
from pytorch_accel.tracking import RunHistory

if TYPE_CHECKING:
    from pytorch_accel._state import TrainerState
    from pytorch_accel.protocols import TrainerLike as Trainer

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "TRAIN_CHECKS",
    "check_accelerator",
    "check_constructor_arguments",
    "check_data",
    "check_dataloader_settings",
    "check_eval_data",
    "check_has_batches",
    "check_loss_func",
    "check_train_arguments",
    "check_train_dataloader",
    "check_trainer_settings",
    "checked_train_arguments",
    "created_scheduler",
    "suggest_arguments",
]


def check_constructor_arguments(
    model: object,
    loss_func: object,
    optimizer: object,
    callbacks: object,
    run_history: object,
    accelerator_kwargs: object,
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
    if (
        accelerator_kwargs is not None
        or parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")
        or fsdp_requested()
    ):
        check_accelerator_kwargs(where, accelerator_kwargs)  # else nothing there to refuse


def check_accelerator(accelerator: Accelerator) -> None:
    """Check the accelerator: the launcher's processes, accumulation left to the trainer, FSDP1."""
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
    fsdp = accelerator.distributed_type == DistributedType.FSDP
    plugin = accelerator.state.fsdp_plugin if fsdp else None
    if plugin is not None and plugin.fsdp_version == 1 and not plugin.use_orig_params:
        fail(
            ValueError,
            "Trainer",
            "FullyShardedDataParallelPlugin(use_orig_params=...)",
            plugin.use_orig_params,
            "True under FSDP version 1",
            "The trainer's optimizer is created before the model is wrapped, and FSDP1 "
            "without the original parameters never connects it (accelerate issue 3256): "
            "pass FullyShardedDataParallelPlugin(fsdp_version=2) (or use_orig_params=True), "
            "or set FSDP_VERSION=2 (or FSDP_USE_ORIG_PARAMS=true) with "
            "`accelerate launch --use_fsdp`.",
        )


def checked_train_arguments(trainer: Trainer, base: Any, call: Mapping[str, Any]) -> TrainArguments:
    """Bind ``base.train``'s parameters to ``call`` (its ``locals()``), check them, return them.

    A mapping of training sets first becomes one dataset and its batch sampler (``mixing``,
    imported only then).
    """
    arguments = TrainArguments.bind(base.train, call)
    if isinstance(arguments.train_dataset, Mapping):
        from pytorch_accel.mixing import mix_training_sets

        arguments = mix_training_sets(trainer, arguments)
    check_train_arguments(trainer, base, arguments)
    return arguments


def check_train_arguments(trainer: Trainer, base: type, arguments: TrainArguments) -> None:
    """Check the arguments of ``Trainer.train`` (``TRAIN_CHECKS``) and the trainer's settings.

    ``base`` is the ``Trainer`` class, whose step methods ``trainer``'s class may override.
    """
    where, a = "Trainer.train", arguments
    check_trainer_settings(where, trainer)
    parameters = inspect.signature(base.train).parameters  # type: ignore[attr-defined]
    done: list[TrainCheck] = []
    for check in TRAIN_CHECKS.values():  # a check of several arguments runs once
        if check not in done:
            done.append(check)
            names = [name for name, listed in TRAIN_CHECKS.items() if listed is check]
            if not all(_at_default(a[name], parameters[name].default) for name in names):
                check(where, a, trainer)  # a default is valid: unchecked, a feature's checks
    with_eval = a.eval_dataset is not None
    eval_sets = named_eval_sets(where, "eval_dataset", a.eval_dataset) if with_eval else {}
    data = [a.train_dataset, *eval_sets.values()]
    check_loss_func(where, trainer, base, data, a.collate_fn, with_train=True, with_eval=with_eval)


def check_trainer_settings(where: str, trainer: Trainer) -> None:
    """Reject an entry point called during ``train()``, and bad trainer attributes."""
    if trainer.is_training:
        raise RuntimeError(
            f"{where}: called while train() is running (from a callback or hook?). It would "
            "replace the run's dataloaders and history. To evaluate during training, call "
            "trainer.run_eval_epoch(); train again after train() returns."
        )
    check_number(
        where,
        "trainer.progress_interval",
        trainer.progress_interval,
        fix="Set trainer.progress_interval to seconds, e.g. 0.05, or 0 for every step.",
    )
    for name in ("limit_train_batches", "limit_eval_batches"):
        check_positive_int(where, f"trainer.{name}", getattr(trainer, name), allow_none=True)


def check_loss_func(
    where: str,
    trainer: Trainer,
    base: type,
    data: Iterable[Any],
    collate_fn: object,
    *,
    with_train: bool,
    with_eval: bool,
) -> None:
    """Reject a ``loss_func`` that the default step methods in use cannot use.

    That is a loss with ``reduction="none"``, whose per-sample losses the default steps would
    neither back-propagate nor record as a mean; or ``None``, unless the batches are dicts
    (the default steps then take the loss from the model's output, as Hugging Face models
    compute it). The steps in use are the training and evaluation steps asked for that
    ``trainer``'s class does not override (``base``: the ``Trainer`` class); the first sample
    of each of ``data``, collated with ``collate_fn``, tells the batches' layout.
    """
    steps = ("calculate_train_batch_loss",) * with_train
    steps += ("calculate_eval_batch_loss",) * with_eval
    defaults = [step for step in steps if getattr(type(trainer), step) is getattr(base, step)]
    loss_func, names, one = trainer.loss_func, " and ".join(defaults), len(defaults) == 1
    if defaults and getattr(loss_func, "reduction", None) == "none":
        fail(
            ValueError,
            where,
            "Trainer's loss_func",
            loss_func,
            f"a loss that reduces to one value while {names} {'is' if one else 'are'} not "
            "overridden",
            "Use reduction='mean' (or 'sum'), or override the step methods to reduce the "
            "per-sample losses yourself.",
        )
    if (
        loss_func is None
        and defaults
        and not all(may_be_dict_batches(each, collate_fn) for each in data)
    ):
        fail(
            TypeError,
            where,
            "Trainer's loss_func",
            None,
            f"a callable while {names} {'is' if one else 'are'} not overridden and the "
            "batches are not dicts",
            f"Pass a loss function to Trainer(...), or override {'that' if one else 'those'} "
            f"step method{'' if one else 's'} (with dict batches, the model's output may "
            "carry its own 'loss', as Hugging Face models' do).",
        )


def _at_default(value: object, default: object) -> bool:
    """Whether an argument is its default: the same value of one type (``0`` is not ``False``)."""
    return value is default or (type(value) is type(default) and value == default)


def _check_train_data(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Check ``train()``'s data: the sets, the run's length, no loader settings for loaders."""
    check_data(where, "train_dataset", arguments.train_dataset, streams=True)
    _check_run_length(where, arguments)
    common = {
        "per_device_batch_size": arguments.per_device_batch_size,
        "collate_fn": arguments.collate_fn,
    }
    check_dataloader_settings(
        where,
        arguments.train_dataset,
        data_name="train_dataset",
        train_dataloader_kwargs=arguments.train_dataloader_kwargs,
        **common,
    )
    if arguments.eval_dataset is not None:
        check_eval_data(
            where,
            "eval_dataset",
            arguments.eval_dataset,
            eval_dataloader_kwargs=arguments.eval_dataloader_kwargs,
            **common,
        )


def check_eval_data(where: str, name: str, data: object, **settings: object) -> list[Any]:
    """Check one eval set, or a mapping of named ones, and their loader ``settings``; list them."""
    sets = named_eval_sets(where, name, data)
    for set_name, one in sets.items():
        label = name if set_name is None else f"{name}[{set_name!r}]"
        if one is None:
            fail(TypeError, where, label, None, "a dataset", "Pass a dataset or remove the set.")
        check_data(where, label, one)
        check_dataloader_settings(where, one, data_name=label, **settings)
    return list(sets.values())


def check_train_dataloader(train_dl: DataLoader[Any], num_processes: int) -> None:
    """Check a run's train dataloader: one batch per process at least; workers over a stream.

    Several workers over an ``IterableDataset`` are legal (a stream that shards by
    ``torch.utils.data.get_worker_info()`` is right), but a stream that does not trains every
    sample once per worker, silently: that gets a warning.
    """
    workers, batch_size = train_dl.num_workers, train_dl.batch_size
    if isinstance(train_dl.dataset, IterableDataset):
        if workers > 1:
            warnings.warn(
                f"Trainer.train: the train dataloader reads an IterableDataset with num_workers="
                f"{workers}: each worker iterates the whole stream, so every sample is trained "
                f"{workers} times per pass unless the dataset's __iter__ shards by "
                "torch.utils.data.get_worker_info(). Shard it, or use num_workers=0 or 1.",
                UserWarning,
                stacklevel=2,
            )
        return
    num_samples = len(train_dl.dataset)  # type: ignore[arg-type]
    if batch_size is not None and num_samples < batch_size * num_processes:
        fail(
            ValueError,
            "Trainer.train",
            "train_dataset",
            f"<{num_samples} samples>",
            f"at least one batch per process ({batch_size} x {num_processes} processes)",
            f"Lower per_device_batch_size to at most {max(1, num_samples // num_processes)}.",
        )


def check_has_batches(where: str, state: TrainerState, **dl_kwargs: Mapping[str, Any]) -> None:
    """Reject prepared dataloaders that yield no batch on this process (an empty epoch).

    ``dl_kwargs``: each dataloader's arguments, by their argument's name (``train...``: the
    train dataloader's).
    """
    for name, kwargs in dl_kwargs.items():
        train = "train" in name
        loaders = [state.train_dataloader] if train else state.eval_dataloaders.values()
        if any(loader is not None and num_batches(loader) == 0 for loader in loaders):
            fail(
                ValueError,
                where,
                name,
                dict(kwargs),
                "settings that give at least one batch per process",
                "Check batch_sampler, drop_last and the batch size against the dataset size.",
            )


def check_data(where: str, name: str, data: object, *, streams: bool = False) -> None:
    """Accept a map-style dataset, or a ``DataLoader`` over one (or streams, if ``streams``)."""
    dataset = data.dataset if isinstance(data, DataLoader) else data
    if streams and isinstance(dataset, IterableDataset):
        return
    label = f"{name}.dataset (of the DataLoader)" if isinstance(data, DataLoader) else name
    check_sized_dataset(where, label, dataset)


def _check_run_length(where: str, arguments: TrainArguments) -> None:
    """Require ``num_epochs`` or ``max_num_train_steps``; the latter for data without length."""
    num_epochs, max_steps = arguments.num_epochs, arguments.max_num_train_steps
    check_positive_int(where, "num_epochs", num_epochs, allow_none=True)
    check_positive_int(where, "max_num_train_steps", max_steps, allow_none=True)
    if max_steps is not None:
        return
    train = arguments.train_dataset
    if isinstance(train.dataset if isinstance(train, DataLoader) else train, IterableDataset):
        fail(
            ValueError,
            where,
            "max_num_train_steps",
            None,
            "a positive int when train_dataset has no length (an IterableDataset)",
            "Pass max_num_train_steps=N: a run over a stream is counted in optimizer updates "
            "(num_epochs, if given, caps the passes through it).",
        )
    if num_epochs is None:
        fail(
            ValueError,
            where,
            "num_epochs",
            None,
            "a positive int when max_num_train_steps is not given",
            "Pass num_epochs=N, or max_num_train_steps=N for a run counted in updates.",
        )


def check_dataloader_settings(
    where: str, data: object, *, data_name: str = "the data", **settings: object
) -> None:
    """Reject the ``settings`` that build a dataloader when ``data`` is already a ``DataLoader``."""
    if not isinstance(data, DataLoader):
        return
    for name, value in settings.items():
        if value is not None:
            fail(
                ValueError,
                where,
                name,
                value,
                f"None when {data_name} is a DataLoader",
                "Build the DataLoader with it, or pass the dataset instead of a DataLoader.",
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


def suggest_arguments(method: Callable[P, R]) -> Callable[P, R]:
    """Turn an unknown keyword argument of an entry point into a ``TypeError`` with a suggestion.

    ``train(batch_size=32)`` names the closest argument, ``per_device_batch_size``.
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


TrainCheck = Callable[[str, "TrainArguments", "Trainer"], None]
"""A check of ``train()``'s arguments: ``check(where, arguments, trainer)`` raises if bad."""


def _one(check: Callable[..., None], name: str, *args: Any, **options: Any) -> TrainCheck:
    """The check of one argument's value alone: ``check(where, name, value, *args, **options)``."""
    return lambda where, arguments, trainer: check(where, name, arguments[name], *args, **options)


TRAIN_CHECKS: dict[str, TrainCheck] = {
    "reset_run_history": _one(
        check_bool,
        "reset_run_history",
        expected="True or False",
        fix="Pass reset_run_history=False to continue the run history of earlier calls.",
    ),
    "resume_from": check_resume,
    "resume_optimizer": check_resume,
    "resume_scheduler": check_resume,
    "train_dataset": _check_train_data,
    "num_epochs": _check_train_data,
    "max_num_train_steps": _check_train_data,
    "eval_dataset": _check_train_data,
    "eval_every_n_epochs": _one(check_positive_int, "eval_every_n_epochs"),
    "sanity_eval_batches": _one(check_count, "sanity_eval_batches", minimum=0, resolved=True),
    "per_device_batch_size": _one(check_positive_int, "per_device_batch_size", allow_none=True),
    "train_dataloader_kwargs": _one(check_mapping, "train_dataloader_kwargs"),
    "eval_dataloader_kwargs": _one(check_mapping, "eval_dataloader_kwargs"),
    "gradient_accumulation_steps": _one(check_positive_int, "gradient_accumulation_steps"),
    "gradient_clip_value": check_clipping,
    "max_grad_norm": check_clipping,
    "create_scheduler_fn": _one(
        check_callable,
        "create_scheduler_fn",
        "Pass a function optimizer -> scheduler, e.g. functools.partial(StepLR, step_size=10).",
    ),
    "collate_fn": _one(check_callable, "collate_fn", "Pass a function or None."),
    "run_name": check_run_name,
    "seed": check_run_setup,
    "seed_per_rank": check_run_setup,
    "deterministic": check_run_setup,
    "cudnn_benchmark": check_run_setup,
    "auto_scale_lr": check_run_setup,
    "skip_failing_batches": check_run_setup,
    "on_oom": check_run_setup,
    "dry_run": check_dry_run,
    "overfit_batches": check_dry_run,
}
"""The checks of ``train()``'s arguments, one entry per argument, run in this order.

A check of several arguments (their combinations, or data and its loader settings) is listed
under each and runs once, where it is first listed; a test fails when an argument of
``Trainer.train`` has no entry.
"""
