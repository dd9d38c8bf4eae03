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
from pytorch_accel.run_config import TrainerRunConfig

if TYPE_CHECKING:
    from pytorch_accel._entry_checks import TrainArguments

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
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
    """

    seed: int | None = None
    seed_per_rank: bool = False
    deterministic: bool = False
    cudnn_benchmark: bool | None = None
    auto_scale_lr: int | None = None
    skip_failing_batches: SkipFailingBatches | None = None

    @classmethod
    def from_arguments(cls, arguments: TrainArguments) -> RunSetup:
        """Collect the set-up from the (checked) arguments of ``train()``."""
        names = [field.name for field in dataclasses.fields(cls)]
        values = {name: getattr(arguments, name) for name in names}
        policy = values["skip_failing_batches"]
        if policy is not None:  # an int means a SkipFailingBatches with that limit
            values["skip_failing_batches"] = skip_policy("Trainer.train", policy)
        return cls(**values)

    def failing_batch_guard(self, num_processes: int) -> FailingBatchGuard | None:
        """A new guard for this run's training batches, if a policy was given."""
        policy = self.skip_failing_batches
        return None if policy is None else FailingBatchGuard(policy, num_processes)

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
        self, config: TrainerRunConfig, optimizer: torch.optim.Optimizer
    ) -> TrainerRunConfig:
        """Scale the learning rates (if asked) and return ``config`` with the set-up recorded."""
        factor = 1.0
        if self.auto_scale_lr is not None:
            factor = scale_learning_rates(
                optimizer, config.train_total_batch_size, self.auto_scale_lr
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


def scale_learning_rates(
    optimizer: torch.optim.Optimizer, total_batch_size: int, base_batch_size: int
) -> float:
    """Set each group's ``lr`` to its unscaled value times ``total / base``; return the factor.

    The unscaled value is kept in the group (``unscaled_lr``, from ``initial_lr`` if a scheduler
    recorded one, else ``lr``) the first time, and every later call scales that value again, so
    repeated ``train()`` calls never compound the factor. A scheduler's ``initial_lr`` is
    scaled too, so a scheduler created afterwards starts from the scaled rate.

    Args:
        optimizer: The optimizer whose parameter groups are scaled.
        total_batch_size: Samples per optimizer update over all processes.
        base_batch_size: The batch size the learning rates were chosen for.

    Returns:
        The factor ``total_batch_size / base_batch_size``.

    Raises:
        ValueError: If the total batch size is unknown (a dataloader with a batch sampler).
    """
    if total_batch_size <= 0:
        fail(
            ValueError,
            "Trainer.train",
            "auto_scale_lr",
            base_batch_size,
            "None when the train batch size is unknown (a DataLoader with a batch_sampler)",
            "Scale the learning rates yourself, or build the DataLoader with batch_size=.",
        )
    factor = total_batch_size / base_batch_size
    for group in optimizer.param_groups:
        unscaled = float(group.setdefault(UNSCALED_LR, group.get("initial_lr", group["lr"])))
        group["lr"] = unscaled * factor
        if "initial_lr" in group:
            group["initial_lr"] = unscaled * factor
    return factor


def recorded(config: TrainerRunConfig | None) -> dict[str, Any]:
    """The run set-up a training state records (from the run config)."""
    if config is None:
        return {}
    return {name: getattr(config, name) for name in _RECORDED}
