"""A run's configuration: what ``train()`` was asked for, and the set-up it applies.

**The run config.** ``TrainerRunConfig`` is the immutable description of the current training
or evaluation run (``trainer.run_config``).

**The run set-up** that ``train()`` does before the loop: seeding, determinism, scaling the
learning rate (``RunSetup``). ``recorded`` is what a training state keeps of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sized
from dataclasses import dataclass, fields
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from pytorch_accel._checks import fail
from pytorch_accel.dataloaders import num_batches
from pytorch_accel.failing_batches import SkipFailingBatches, skip_policy

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "ChosenRates",
    "ResumeParts",
    "RunSetup",
    "TrainerRunConfig",
    "bare_compiled_models",
    "create_run_config",
    "optimizer_not_loaded",
    "recorded",
    "scale_learning_rates",
]


@dataclass(frozen=True)
class TrainerRunConfig:
    """The settings of the current ``train()`` or ``evaluate()`` call, fixed when it starts.

    The field names and order are those of pytorch-accelerated, so ported code keeps working
    (the fields it did not have come last, with defaults, derived from the update counts when
    a config is built by hand). Counts of updates are per process: the unit a scheduler is
    stepped in, as every process steps its own scheduler once per optimizer update.

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
        per_epoch = self.num_update_steps_per_epoch
        if self.train_dataloader_len is not None and self.train_dataloader_len < 0:
            batches = None if per_epoch is None else per_epoch * self.gradient_accumulation_steps
            object.__setattr__(self, "train_dataloader_len", batches)
        if self.total_num_update_steps < 0:
            total = _total_updates(per_epoch, self.num_epochs, self.max_num_train_steps)
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


def _total_updates(per_epoch: int | None, epochs: int | None, max_steps: int | None) -> int | None:
    """The updates of ``epochs`` epochs (if known), capped by ``max_steps`` (if given)."""
    total = None if per_epoch is None or epochs is None else per_epoch * epochs
    if max_steps is not None:
        total = max_steps if total is None else min(total, max_steps)
    return total


def _run_length(
    updates_per_epoch: int | None, num_epochs: int | None, max_num_train_steps: int | None
) -> tuple[int, int | None]:
    """The run's updates and epochs; ``train()`` checked that one of the limits is given."""
    total = _total_updates(updates_per_epoch, num_epochs, max_num_train_steps)
    assert total is not None
    if updates_per_epoch is not None and max_num_train_steps is not None:
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

    ``train_dataloader`` is this process's (``None`` in ``evaluate()``), ``dl_kwargs`` the
    arguments the train and eval dataloaders were built with (``{}`` for one not built).
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


CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""The cuBLAS workspace setting that makes cuBLAS deterministic (set unless already set)."""

UNSCALED_LR = "unscaled_lr"
"""The parameter-group key holding the learning rate before ``auto_scale_lr`` scaling."""

_RECORDED = (
    "seed",
    "seed_per_rank",
    "deterministic",
    "cudnn_benchmark",
    "auto_scale_lr",
    "lr_scale_factor",
)


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """The run set-up arguments of one ``train()`` call (see ``Trainer.train``).

    ``apply_randomness`` runs first in ``train()``, before anything draws a random number;
    ``finish`` once the run config is known (it needs the global batch size).

    Attributes:
        seed: Seed ``random``, NumPy and torch (all devices) with it, or ``None`` to leave them.
        seed_per_rank: Add the process index to the seed, so each process draws differently.
        deterministic: Turn on deterministic algorithms, cuDNN's deterministic mode and the
            cuBLAS workspace setting (``False`` leaves torch's settings as they are).
        cudnn_benchmark: Set ``torch.backends.cudnn.benchmark`` (``None``: leave it).
        auto_scale_lr: Scale the learning rates by the global batch size over this.
        skip_failing_batches: The policy for training batches that fail, or ``None``.
        on_oom: ``"split"``: on out-of-memory, more micro-batches of the same total.
    """

    seed: int | None = None
    seed_per_rank: bool = False
    deterministic: bool = False
    cudnn_benchmark: bool | None = None
    auto_scale_lr: int | None = None
    skip_failing_batches: SkipFailingBatches | None = None
    on_oom: str = "raise"

    @classmethod
    def from_arguments(cls, arguments: object) -> RunSetup:
        """Collect the set-up from the (checked) arguments of ``train()`` (``TrainArguments``)."""
        values = {field.name: getattr(arguments, field.name) for field in dataclasses.fields(cls)}
        policy = values["skip_failing_batches"]
        if policy is not None:  # an int means a SkipFailingBatches with that limit
            values["skip_failing_batches"] = skip_policy("Trainer.train", policy)
        return cls(**values)

    def apply_randomness(self, accelerator: Accelerator) -> None:
        """Set the determinism flags, then seed every generator (before anything draws)."""
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        if self.cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.seed is not None:
            seed = self.seed + (accelerator.process_index if self.seed_per_rank else 0)
            set_seed(seed)

    def finish(
        self, config: TrainerRunConfig, optimizer: torch.optim.Optimizer, rates: ChosenRates
    ) -> TrainerRunConfig:
        """Scale the learning rates (if asked) and return ``config`` with the set-up recorded."""
        factor = scale_learning_rates(
            optimizer, config.train_total_batch_size, self.auto_scale_lr, rates
        )
        values = {name: getattr(self, name) for name in _RECORDED[:-1]}
        return dataclasses.replace(config, **values, lr_scale_factor=factor)


@dataclasses.dataclass(frozen=True)
class ResumeParts:
    """Which parts of a training state a resumed ``train()`` loads besides weights and position.

    Attributes:
        optimizer: Load the optimizer's state (``False``: keep the trainer's optimizer as it is,
            e.g. a fresh one of another type, for fine-tuning from a training state).
        scheduler: Load the scheduler's state (``False``: the scheduler starts afresh).
    """

    optimizer: bool = True
    scheduler: bool = True


@contextlib.contextmanager
def _registered(
    accelerator: Accelerator, attribute: str, replace: Callable[[list[Any]], list[Any]]
) -> Iterator[None]:
    """Replace the accelerator's registered objects (``_models``, ...) inside the block."""
    registered = getattr(accelerator, attribute, None)
    if not isinstance(registered, list):
        yield
        return
    saved = list(registered)
    registered[:] = replace(saved)
    try:
        yield
    finally:
        registered[:] = saved


def bare_compiled_models(accelerator: Accelerator) -> contextlib.AbstractContextManager[None]:
    """Let ``accelerator.save_state``/``load_state`` see compiled models without the wrapper.

    accelerate saves the modules it was given: a model compiled by hand
    (``torch.compile(model)``, an ``OptimizedModule``) would be saved with ``_orig_mod.`` in
    every key, and such a state would not load into an uncompiled model (nor a state with clean
    keys into it). Inside the block the registered compiled models are replaced by the modules
    they wrap, which share their parameters; the registrations are put back afterwards.
    """
    return _registered(
        accelerator, "_models", lambda models: [getattr(m, "_orig_mod", m) for m in models]
    )


def optimizer_not_loaded(
    accelerator: Accelerator, skip: bool
) -> contextlib.AbstractContextManager[None]:
    """Hide the optimizers from ``accelerator.load_state`` inside the block, if ``skip``.

    accelerate loads every optimizer it prepared; hidden, the trainer's optimizer keeps its
    state and may differ from the saved one (another type, other parameter groups).
    """
    return _registered(accelerator, "_optimizers", lambda optimizers: [] if skip else optimizers)


class ChosenRates:
    """The learning rate the user chose for each parameter group, kept across ``train()`` calls.

    A run moves a group's ``lr`` (scaling, a scheduler, a callback); the rate it left is
    noted when it ends. At the next call, an ``lr`` that differs from it is a rate the user set
    in between, and becomes the group's chosen rate; otherwise the rate chosen before stays.
    Groups are known by identity: a group replaced by loading an optimizer's state is new.
    """

    def __init__(self) -> None:
        self._groups: list[tuple[dict[str, Any], float, float]] = []  # group, chosen, left

    def chosen(self, group: dict[str, Any]) -> float:
        """The rate the user chose for ``group``, unscaled and before any scheduler.

        A known group: its ``lr`` if the user changed it since the last run, else the rate
        chosen before. A new group: the unscaled rate an earlier scaling kept in it
        (``unscaled_lr``), else a scheduler's ``initial_lr``, else ``lr``.
        """
        current, known = float(group["lr"]), self._known(group)
        if known is None:
            return float(group.get(UNSCALED_LR, group.get("initial_lr", current)))
        chosen, left = known
        return current if current != left else chosen

    def start(self, optimizer: torch.optim.Optimizer, chosen: list[float]) -> None:
        """Keep each group's chosen rate as a run starts (its ``lr`` is set by then)."""
        groups = optimizer.param_groups
        self._groups = [
            (group, rate, float(group["lr"])) for group, rate in zip(groups, chosen, strict=True)
        ]

    def note_left(self, optimizer: torch.optim.Optimizer) -> None:
        """Note the rate each group has as a run ends (new groups: the rate ``chosen`` finds)."""
        groups = []
        for group in optimizer.param_groups:
            known = self._known(group)
            chosen = self.chosen(group) if known is None else known[0]
            groups.append((group, chosen, float(group["lr"])))
        self._groups = groups

    def _known(self, group: dict[str, Any]) -> tuple[float, float] | None:
        """The chosen rate and the rate left of a known group, or ``None``."""
        for known, chosen, left in self._groups:
            if known is group:
                return chosen, left
        return None

    def moved_to(self, optimizer: torch.optim.Optimizer) -> ChosenRates:
        """These rates for ``optimizer``'s groups, by position (after reloading its state)."""
        moved = ChosenRates()
        moved._groups = [
            (group, chosen, left)
            for (_, chosen, left), group in zip(self._groups, optimizer.param_groups, strict=False)
        ]
        return moved


def scale_learning_rates(
    optimizer: torch.optim.Optimizer,
    total_batch_size: int,
    base_batch_size: int | None,
    rates: ChosenRates,
) -> float:
    """Set each group's ``lr`` to the user's rate times ``total / base``; return the factor.

    The user's rate (``rates.chosen``, never a rate a scheduler or an earlier scaling left) is
    kept in the group (``unscaled_lr``), so repeated ``train()`` calls never compound the
    factor; a scheduler's ``initial_lr`` is set too. Without a base (no ``auto_scale_lr``),
    groups an earlier call scaled get the user's rate back and lose ``unscaled_lr``.

    Args:
        optimizer: The optimizer whose parameter groups are scaled.
        total_batch_size: Samples per optimizer update over all processes.
        base_batch_size: The batch size the learning rates were chosen for, or ``None``.
        rates: The rates the user chose, kept across calls (updated here).

    Returns:
        The factor ``total_batch_size / base_batch_size`` (1.0 without a base).

    Raises:
        ValueError: If the total batch size is unknown (a dataloader with a batch sampler).
    """
    if base_batch_size is not None and total_batch_size <= 0:
        fail(
            ValueError,
            "Trainer.train",
            "auto_scale_lr",
            base_batch_size,
            "None when the train batch size is unknown (a DataLoader with a batch_sampler)",
            "Scale the learning rates yourself, or build the DataLoader with batch_size=.",
        )
    factor = 1.0 if base_batch_size is None else total_batch_size / base_batch_size
    chosen = [rates.chosen(group) for group in optimizer.param_groups]
    for group, rate in zip(optimizer.param_groups, chosen, strict=True):
        if base_batch_size is not None:
            group[UNSCALED_LR] = rate
        elif group.pop(UNSCALED_LR, None) is None:
            continue  # never scaled: left as the last run left it (as in pytorch-accelerated)
        group["lr"] = rate * factor
        if "initial_lr" in group:
            group["initial_lr"] = rate * factor
    rates.start(optimizer, chosen)
    return factor


def recorded(config: TrainerRunConfig | None) -> dict[str, Any]:
    """The run set-up a training state records (from the run config)."""
    if config is None:
        return {}
    return {name: getattr(config, name) for name in _RECORDED}
