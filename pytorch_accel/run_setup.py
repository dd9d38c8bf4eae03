"""Run set-up that ``train()`` does before the loop: seeding, determinism, scaling the LR.

``RunSetup`` holds the arguments of one ``train()`` call. ``apply_randomness`` runs first in
``train()``, before any dataset, dataloader or sampler draws a random number; ``finish`` runs
once the run config is known (it needs the global batch size), scales the optimizer's learning
rates and records the set-up in the run config. ``recorded`` is what a training state keeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from pytorch_accel._checks import fail
from pytorch_accel.failing_batches import FailingBatchGuard, SkipFailingBatches, skip_policy
from pytorch_accel.micro_batches import MicroBatchSplitter
from pytorch_accel.run_config import TrainerRunConfig

if TYPE_CHECKING:
    from pytorch_accel._entry_checks import TrainArguments
    from pytorch_accel._state import TrainerState

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "ChosenRates",
    "ResumeParts",
    "RunSetup",
    "bare_compiled_models",
    "optimizer_not_loaded",
    "recorded",
    "scale_learning_rates",
]

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
    def from_arguments(cls, arguments: TrainArguments) -> RunSetup:
        """Collect the set-up from the (checked) arguments of ``train()``."""
        names = [field.name for field in dataclasses.fields(cls)]
        values = {name: getattr(arguments, name) for name in names}
        policy = values["skip_failing_batches"]
        if policy is not None:  # an int means a SkipFailingBatches with that limit
            values["skip_failing_batches"] = skip_policy("Trainer.train", policy)
        return cls(**values)

    def guard_steps(self, state: TrainerState, num_processes: int) -> None:
        """Give ``state`` this run's guard of failing batches and splitter, if asked for.

        A trial of the batch-size search (``state.probing``) gets a probing splitter.
        """
        policy = self.skip_failing_batches
        state.failing_batches = None if policy is None else FailingBatchGuard(policy, num_processes)
        split = state.probing or self.on_oom == "split"
        state.micro_batches = (
            MicroBatchSplitter(num_processes, probe=state.probing) if split else None
        )

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
        """Scale the learning rates (if asked) and return ``config`` with the set-up recorded.

        Without ``auto_scale_lr``, rates an earlier call scaled are put back to the user's.
        """
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
def bare_compiled_models(accelerator: Accelerator) -> Iterator[None]:
    """Let ``accelerator.save_state``/``load_state`` see compiled models without the wrapper.

    accelerate saves the modules it was given: a model compiled by hand
    (``torch.compile(model)``, an ``OptimizedModule``) would be saved with ``_orig_mod.`` in
    every key, and such a state would not load into an uncompiled model (nor a state with clean
    keys into it). Inside the block the registered compiled models are replaced by the modules
    they wrap, which share their parameters; the registrations are put back afterwards.
    """
    registered = getattr(accelerator, "_models", None)
    if not isinstance(registered, list):
        yield
        return
    saved = list(registered)
    registered[:] = [getattr(model, "_orig_mod", model) for model in registered]
    try:
        yield
    finally:
        registered[:] = saved


@contextlib.contextmanager
def optimizer_not_loaded(accelerator: Accelerator, skip: bool) -> Iterator[None]:
    """Hide the optimizers from ``accelerator.load_state`` inside the block, if ``skip``.

    accelerate loads every optimizer it prepared; hidden, the trainer's optimizer keeps its
    state and may differ from the saved one (another type, other parameter groups).
    """
    registered = getattr(accelerator, "_optimizers", None)
    if not skip or not isinstance(registered, list):
        yield
        return
    saved = list(registered)
    registered.clear()
    try:
        yield
    finally:
        registered[:] = saved


class ChosenRates:
    """The learning rate the user chose for each parameter group, kept across ``train()`` calls.

    A run moves a group's ``lr`` (scaling, a scheduler, a callback); the rate it left is
    noted when it ends (``note_left``). At the next call, an ``lr`` that differs from it is a
    rate the user set in between, and becomes the group's chosen rate; otherwise the rate
    chosen before stays, however the run moved ``lr``. Groups are known by identity: a group
    replaced by loading an optimizer's state is new (``moved_to`` maps the groups by position
    where the same state was put back).
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
        """Note the rate each group has as a run ends (not the user's choice).

        Groups that are new by now (added during the run, or loaded by a resume) get the
        rate ``chosen`` finds in them.
        """
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
        """These rates for ``optimizer``'s groups, by position (after reloading its state).

        Empty before the first run; a group beyond the record is new.
        """
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

    The user's rate (``rates.chosen``: the ``lr`` set by hand since the last run, else the rate
    chosen before, never a rate a scheduler or an earlier scaling left) is kept in the group
    (``unscaled_lr``), so repeated ``train()`` calls never compound the factor. A scheduler's
    ``initial_lr`` is set too, so a scheduler created afterwards starts from the scaled rate.
    Without a base (no ``auto_scale_lr``), groups an earlier call scaled get the user's rate
    back (factor 1) and lose ``unscaled_lr``; the others are left as they are.

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
