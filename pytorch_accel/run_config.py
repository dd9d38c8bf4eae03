"""A run's configuration: the arguments of ``train()``, bound once, and what they describe.

**The arguments.** ``Trainer.train``'s signature and its docstring's Args section declare them,
once; ``TrainArguments`` is one call's arguments bound to that signature (read-only, by name),
which the checks (``_entry_checks``), the set-up below and the run config read.

**The run config.** ``TrainerRunConfig`` is the immutable description of the current training
or evaluation run (``trainer.run_config``): the fields that are ``train()`` arguments are copied
from them, the others derived from the prepared dataloaders and the accelerator.

**The run set-up** that ``train()`` does before the loop: seeding, determinism, scaling the
learning rate. ``recorded`` is what a training state keeps of it.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sized
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, set_seed

from pytorch_accel._checks import fail
from pytorch_accel.dataloaders import num_batches
from pytorch_accel.distributed import effective_mixed_precision

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "ChosenRates",
    "TrainArguments",
    "TrainerRunConfig",
    "apply_randomness",
    "create_run_config",
    "recorded",
    "scale_learning_rates",
]


class TrainArguments(Mapping[str, Any]):
    """The arguments of one ``train()`` call, bound to its signature: read-only, by name.

    Built by ``bind`` from the call's parameters, so ``Trainer.train``'s signature is the one
    list of them; read as attributes (``arguments.num_epochs``) or as a mapping.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = MappingProxyType(dict(values))

    @classmethod
    def bind(cls, method: Callable[..., Any], call: Mapping[str, Any]) -> TrainArguments:
        """Bind the parameters of ``method`` (all but ``self``) to their values in ``call``.

        ``call`` is the method's ``locals()`` as its body starts.
        """
        names = inspect.signature(method).parameters
        return cls({name: call[name] for name in names if name != "self"})

    def __getattr__(self, name: str) -> Any:
        """The argument ``name``."""
        if name.startswith("_"):  # not an argument (and ``_values`` itself, before __init__)
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"TrainArguments({dict(self._values)!r})"

    def replace(self, **changes: Any) -> TrainArguments:
        """These arguments with ``changes`` (names of arguments only)."""
        unknown = set(changes) - set(self._values)
        if unknown:
            raise TypeError(f"TrainArguments.replace: no argument named {sorted(unknown)[0]!r}")
        return TrainArguments({**self._values, **changes})

    def as_kwargs(self) -> dict[str, Any]:
        """The arguments by name, to call ``train(**...)`` again (values not copied)."""
        return dict(self._values)


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
    arguments: Mapping[str, Any] = MappingProxyType({"num_epochs": 1}),
) -> TrainerRunConfig:
    """Describe a run from its prepared dataloaders and the arguments of ``train()``.

    ``train_dataloader`` is this process's (``None`` in ``evaluate()``), ``dl_kwargs`` the
    arguments the train and eval dataloaders were built with (``{}`` for one not built).
    The fields named as ``train()`` arguments are copied from ``arguments`` (a
    ``TrainArguments``; by default ``evaluate()``'s: one epoch), the others derived.
    """
    given = {f.name: arguments[f.name] for f in fields(TrainerRunConfig) if f.name in arguments}
    accumulation = given.setdefault("gradient_accumulation_steps", 1)
    given.setdefault("gradient_clip_value", None)
    max_steps = given.setdefault("max_num_train_steps", None)
    batches = _num_batches(train_dataloader, limit_train_batches)
    train_dl_kwargs, eval_dl_kwargs = dl_kwargs
    updates_per_epoch = None if batches is None else math.ceil(batches / accumulation)
    total_updates, num_epochs = _run_length(updates_per_epoch, given["num_epochs"], max_steps)
    train_batch = train_dl_kwargs.get("batch_size") or 0
    eval_batch = eval_dl_kwargs.get("batch_size") or train_batch
    num_processes = accelerator.num_processes
    given.update(
        num_epochs=num_epochs,
        train_per_device_batch_size=train_batch,
        train_dl_kwargs=dict(train_dl_kwargs),
        eval_per_device_batch_size=eval_batch,
        eval_dl_kwargs=dict(eval_dl_kwargs),
        train_total_batch_size=train_batch * num_processes * accumulation,
        eval_total_batch_size=eval_batch * num_processes,
        num_update_steps_per_epoch=updates_per_epoch,
        num_local_update_steps_per_epoch=updates_per_epoch,
        total_num_update_steps=total_updates,
        train_dataloader_len=batches,
        is_local_process_zero=accelerator.is_local_main_process,
        is_world_process_zero=accelerator.is_main_process,
        is_distributed=accelerator.distributed_type != DistributedType.NO,
        mixed_precision=effective_mixed_precision(accelerator),
        num_processes=num_processes,
    )
    return TrainerRunConfig(**given)


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
"""The run set-up a training state records (fields of the run config)."""


def apply_randomness(arguments: TrainArguments, accelerator: Accelerator) -> None:
    """Set ``train()``'s determinism flags, then seed every generator (before anything draws)."""
    if arguments.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if arguments.cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = arguments.cudnn_benchmark
    if arguments.seed is not None:
        set_seed(arguments.seed + (accelerator.process_index if arguments.seed_per_rank else 0))


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
