"""Checks of ``train()``'s optional features: run set-up, clipping, resuming, dry runs, run names.

Entries of ``_entry_checks.TRAIN_CHECKS``, which runs a check only when one of its arguments
differs from its default (defaults are valid), so a run that uses none of these features
reads none of them; and ``created_scheduler``, the check of what ``create_scheduler_fn``
returned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate.utils import DistributedType
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel._checks import (
    check_bool,
    check_choice,
    check_number,
    check_positive_int,
    fail,
)
from pytorch_accel.failing_batches import skip_policy
from pytorch_accel.micro_batches import ON_OOM, ON_OOM_FIX

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike as Trainer
    from pytorch_accel.run_config import TrainArguments, TrainerRunConfig

__all__ = [
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
