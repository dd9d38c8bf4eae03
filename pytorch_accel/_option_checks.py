"""Checks of optional features: run set-up, clipping, resuming, dry runs, run names, accelerate.

Entries of ``_entry_checks.TRAIN_CHECKS``, which runs a check only when one of its arguments
differs from its default (defaults are valid), so a run that uses none of these features
reads none of them; ``created_scheduler``, the check of what ``create_scheduler_fn``
returned; and ``check_accelerator_kwargs``, ``Trainer(accelerator_kwargs=...)``'s.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, parse_flag_from_env
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel._checks import (
    check_bool,
    check_choice,
    check_mapping,
    check_number,
    check_positive_int,
    fail,
)
from pytorch_accel.distributed import fsdp_requested, needs_cpu_distributed
from pytorch_accel.failing_batches import skip_policy
from pytorch_accel.micro_batches import ON_OOM, ON_OOM_FIX

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer
    from pytorch_accel.run_config import TrainArguments, TrainerRunConfig

__all__ = [
    "check_accelerator_kwargs",
    "check_clipping",
    "check_dry_run",
    "check_resume",
    "check_run_name",
    "check_run_setup",
    "created_scheduler",
]


def check_run_name(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Accept ``None``, or one directory name for a trainer with an ``output_dir``."""
    run_name = arguments.run_name
    if run_name is None:
        return
    if not isinstance(run_name, str) or run_name in ("", "..") or Path(run_name).name != run_name:
        kind = ValueError if isinstance(run_name, str) else TypeError
        fix = "Pass e.g. run_name='baseline': the run's directory is <output_dir>/<run_name>."
        fail(kind, where, "run_name", run_name, "a directory name (no '/') or None", fix)
    if trainer.run_dir is None:
        fix = "Create the trainer with Trainer(..., output_dir='runs'): runs are named under it."
        fail(ValueError, where, "run_name", run_name, "None without Trainer(output_dir=...)", fix)


def check_clipping(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Check ``gradient_clip_value`` and ``max_grad_norm``: positive, not both, by norm on FSDP."""
    fsdp = trainer.accelerator.distributed_type == DistributedType.FSDP
    clip_value, max_norm = arguments.gradient_clip_value, arguments.max_grad_norm
    for name, value in (("gradient_clip_value", clip_value), ("max_grad_norm", max_norm)):
        expected, fix = "a positive number or None", f"Pass {name} > 0, or None to disable."
        check_number(where, name, value, strict=True, allow_none=True, expected=expected, fix=fix)
    if clip_value is not None and max_norm is not None:
        fail(
            ValueError,
            where,
            "max_grad_norm",
            max_norm,
            "None when gradient_clip_value is set",
            "Clip either by value (gradient_clip_value) or by norm (max_grad_norm), not both.",
        )
    if clip_value is not None and fsdp:
        fail(
            ValueError,
            where,
            "gradient_clip_value",
            clip_value,
            "None under FSDP",
            "FSDP cannot clip sharded gradients by value; clip by norm instead: "
            f"train(max_grad_norm={clip_value}), which is right under sharding.",
        )


def check_run_setup(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Check the run set-up arguments of ``train()``: seeding, determinism, LR scaling, skips."""
    seed = arguments.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        fail(TypeError, where, "seed", seed, "an int or None", "Pass e.g. seed=42.")
    if seed is not None and not 0 <= seed < 2**32 - 2**16:
        fail(
            ValueError,
            where,
            "seed",
            seed,
            f"in [0, {2**32 - 2**16})",
            "NumPy takes 32-bit seeds (and seed_per_rank adds the process index).",
        )
    for name, value in (
        ("seed_per_rank", arguments.seed_per_rank),
        ("deterministic", arguments.deterministic),
    ):
        check_bool(where, name, value, expected="True or False", fix=f"Pass {name}=True.")
    benchmark = arguments.cudnn_benchmark
    expected = "True, False or None"
    check_bool(
        where, "cudnn_benchmark", benchmark, allow_none=True, expected=expected, fix="Pass True."
    )
    if benchmark and arguments.deterministic:
        fail(
            ValueError,
            where,
            "cudnn_benchmark",
            benchmark,
            "False or None with deterministic=True",
            "cuDNN's benchmark picks algorithms by timing, which is not deterministic.",
        )
    if arguments.seed_per_rank and arguments.seed is None:
        fail(ValueError, where, "seed_per_rank", True, "False without a seed", "Pass seed=...")
    check_positive_int(where, "auto_scale_lr", arguments.auto_scale_lr, allow_none=True)
    if arguments.skip_failing_batches is not None:
        skip_policy(where, arguments.skip_failing_batches)
    check_choice(where, "on_oom", arguments.on_oom, ON_OOM, ON_OOM_FIX)
    if arguments.on_oom == "split" and arguments.skip_failing_batches is not None:
        fail(
            ValueError,
            where,
            "on_oom",
            "split",
            "'raise' with skip_failing_batches",
            "Both would handle a failing step: split it on out-of-memory, or skip it; pass one.",
        )


def check_resume(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Check ``resume_from``, and ``resume_optimizer``/``_scheduler`` (False only to resume)."""
    if not isinstance(arguments.resume_from, (str, os.PathLike, type(None))):
        fail(
            TypeError,
            where,
            "resume_from",
            arguments.resume_from,
            "a directory path, 'latest' or None",
            "Pass the directory of a training state, e.g. resume_from='states/updates-00001000'.",
        )
    for name, value in (
        ("resume_optimizer", arguments.resume_optimizer),
        ("resume_scheduler", arguments.resume_scheduler),
    ):
        check_bool(where, name, value, expected="True or False", fix=f"Pass {name}=False.")
        if not value and arguments.resume_from is None:
            fail(
                ValueError,
                where,
                name,
                value,
                "True without resume_from",
                "It chooses what a resumed run loads: pass resume_from=..., or leave it out.",
            )


def check_dry_run(where: str, arguments: TrainArguments, trainer: Trainer) -> None:
    """Check ``dry_run`` and ``overfit_batches``."""
    dry_run = arguments.dry_run
    if not isinstance(dry_run, bool):
        check_positive_int(where, "dry_run", dry_run)
    overfit = arguments.overfit_batches
    check_positive_int(where, "overfit_batches", overfit, allow_none=True)
    if dry_run and overfit is not None:
        fail(
            ValueError,
            where,
            "overfit_batches",
            overfit,
            "None with dry_run",
            "Run one of them: a dry run checks the pipeline, an overfit run trains.",
        )
    for kind, fix in (
        (DataLoader, "Pass the dataset: the overfit run builds its own unshuffled subset of it."),
        (
            IterableDataset,
            "A stream has no first batches to come back to: overfit a map-style dataset.",
        ),
    ):
        if overfit is not None and isinstance(arguments.train_dataset, kind):
            article = "an" if kind is IterableDataset else "a"
            expected = f"None when train_dataset is {article} {kind.__name__}"
            fail(ValueError, where, "overfit_batches", overfit, expected, fix)


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
    if not callable(getattr(scheduler, "step", None)):
        fail(
            TypeError,
            where,
            "create_scheduler_fn's result",
            scheduler,
            "a scheduler (an object with a step() method)",
            "Return a scheduler built on the optimizer it receives, e.g. "
            "functools.partial(StepLR, step_size=10).",
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


def check_accelerator_kwargs(where: str, accelerator_kwargs: object) -> None:
    """Accept ``None`` or a mapping of ``accelerate.Accelerator`` argument names to values.

    Also refuses DeepSpeed asked for by the environment (``ACCELERATE_USE_DEEPSPEED``) on
    the CPU, and an FSDP version accelerate does not implement (``FSDP_VERSION`` under
    ``ACCELERATE_USE_FSDP``): ``Trainer()`` calls it when ``accelerator_kwargs`` is given or
    either is asked for by the environment.
    """
    check_mapping(where, "accelerator_kwargs", accelerator_kwargs)
    kwargs: Mapping[Any, Any] = accelerator_kwargs or {}  # type: ignore[assignment]
    known = sorted(set(inspect.signature(Accelerator.__init__).parameters) - {"self"})
    for name in kwargs:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1)
            fail(
                TypeError,
                where,
                "accelerator_kwargs",
                {name: "..."},
                "a mapping of accelerate.Accelerator's arguments",
                (f"Did you mean {close[0]!r}? " if close else "")
                + "See accelerate.Accelerator for its arguments (mixed_precision, "
                "kwargs_handlers, fsdp_plugin, ...).",
            )
    _check_deepspeed_request(where, kwargs)
    if getattr(kwargs.get("dataloader_config"), "use_stateful_dataloader", False):
        from pytorch_accel._checkpointing.streams import check_stateful_dataloader_request

        check_stateful_dataloader_request(where, kwargs)
    _refuse_accelerate_trackers(where, kwargs)
    _check_fsdp_version(kwargs.get("fsdp_plugin"))


def _refuse_accelerate_trackers(where: str, kwargs: Mapping[Any, Any]) -> None:
    """Refuse ``log_with``: the trainer never logs through accelerate's trackers (issue 41)."""
    log_with = kwargs.get("log_with")
    if log_with is not None and log_with != [] and log_with != ():
        fail(
            ValueError,
            where,
            "accelerator_kwargs['log_with']",
            log_with,
            "left out (the trainer sends nothing to the Accelerator's trackers)",
            "Name the trackers in the TrackingCallback instead, e.g. callbacks=("
            f"*DEFAULT_CALLBACKS, TrackingCallback(log_with={log_with!r}, logging_dir=...)); "
            "see docs/trackers.md.",
        )


def _check_deepspeed_request(where: str, kwargs: Mapping[Any, Any]) -> None:
    """Refuse DeepSpeed where accelerate would drop it (CPU processes) or cannot run it (no CUDA).

    accelerate switches to DeepSpeed only on GPUs; with ``cpu=True`` (the trainer's default
    when several processes run on a machine without GPUs) the request would become DDP.
    """
    requested = (
        kwargs.get("deepspeed_plugin") is not None
        or kwargs.get("deepspeed_plugins") is not None
        or parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")
    )
    cpu = bool(kwargs.get("cpu", needs_cpu_distributed())) or parse_flag_from_env(
        "ACCELERATE_USE_CPU"
    )
    if requested and (cpu or not torch.cuda.is_available()):
        raise ValueError(
            f"{where}: DeepSpeed was asked for (deepspeed_plugin in accelerator_kwargs, or "
            "ACCELERATE_USE_DEEPSPEED=true from `accelerate launch --use_deepspeed`) but this "
            "run is on the CPU (no CUDA GPU, or cpu=True / ACCELERATE_USE_CPU), where "
            "accelerate cannot run DeepSpeed and would silently train with DDP. Shard on the "
            "CPU with FSDP instead: accelerator_kwargs={'fsdp_plugin': "
            "FullyShardedDataParallelPlugin(fsdp_version=2)}, or launch on CUDA GPUs."
        )


_FSDP_VERSIONS = (1, 2)
"""The FSDP versions accelerate implements (``FullyShardedDataParallelPlugin.fsdp_version``)."""


def _check_fsdp_version(fsdp_plugin: object) -> None:
    """Refuse an FSDP version accelerate does not implement, before it fails obscurely."""
    if fsdp_plugin is not None:
        version, name = getattr(fsdp_plugin, "fsdp_version", 1), "fsdp_plugin.fsdp_version"
    elif fsdp_requested():
        version, name = os.environ.get("FSDP_VERSION", "1"), "FSDP_VERSION"
        version = int(version) if version.strip().isdigit() else version
    else:
        return
    if version not in _FSDP_VERSIONS:
        fail(
            ValueError,
            "Trainer",
            f"accelerator_kwargs: {name}",
            version,
            "1 or 2 (the FSDP versions accelerate implements)",
            "Pass FullyShardedDataParallelPlugin(fsdp_version=2) for FSDP2 (or 1 for FSDP1).",
        )
