"""Dry runs and overfit runs: ``train(dry_run=...)`` and ``train(overfit_batches=...)``.

A dry run calls ``train()`` again for one short epoch (a few batches of training and
evaluation, every callback enabled) inside ``trial_run``, then saves a training state and
loads it back. Each callback's files go where its ``outputs.RedirectsOutputs.redirect_outputs`` says
(with ``Trainer(output_dir=...)``, ``trainer.run_dir`` is a temporary directory meanwhile),
so nothing of the user's (checkpoints, states, records, history, weights) changes.

An overfit run trains on the first few batches of the train set only, in order, and evaluates
on the same batches (Lightning's ``overfit_batches``): a model that cannot drive that loss
down has a bug.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import random
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch.utils.data import Subset

from pytorch_accel._state import PreparedTrainer, fewer_batches
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.distributed import main_process_object
from pytorch_accel.outputs import redirect_outputs
from pytorch_accel.tracking import InMemoryRunHistory, get_logger

if TYPE_CHECKING:
    from pytorch_accel._state import Preparation, TrainerState
    from pytorch_accel.run_config import TrainArguments
    from pytorch_accel.run_directory import RunDirectory

__all__ = [
    "DRY_RUN_BATCHES",
    "Snapshot",
    "ToolTrainer",
    "run_dry_or_overfit",
    "trial_run",
]

DRY_RUN_BATCHES = 2
"""The batches of training and of evaluation that ``train(dry_run=True)`` runs."""


class ToolTrainer(PreparedTrainer, Protocol):
    """A trainer as the tools see it: its public surface and the run state they set aside."""

    _state: TrainerState
    _preparation: Preparation
    _run_directory: RunDirectory | None


def run_dry_or_overfit(trainer: ToolTrainer, arguments: TrainArguments) -> bool:
    """Run ``train()`` as a dry or overfit run if its (checked) arguments ask; say if it did.

    A dry run leaves nothing of the user's changed; an overfit run trains and evaluates on
    the first ``overfit_batches`` batches of the train set, in order.
    """
    if arguments.dry_run:
        num_batches = DRY_RUN_BATCHES if arguments.dry_run is True else int(arguments.dry_run)
        with trial_run(trainer, num_batches) as directory:
            settings = arguments.replace(
                num_epochs=1,
                resume_from=None,
                dry_run=False,
                resume_optimizer=True,
                resume_scheduler=True,
            )
            trainer.train(**settings.as_kwargs())
            trainer.save_training_state(directory / "training_state")
            trainer.load_training_state(directory / "training_state")
            names = trainer.run_history.get_metric_names()
        get_logger().info(f"Dry run passed: {names} recorded.")
        return True
    if arguments.overfit_batches is None:
        return False
    batch_size = arguments.per_device_batch_size or 8
    processes = trainer.accelerator.num_processes
    dataset = arguments.train_dataset
    subset = Subset(
        dataset, range(min(len(dataset), arguments.overfit_batches * batch_size * processes))
    )
    loader_kwargs = {**(arguments.train_dataloader_kwargs or {}), "shuffle": False}
    settings = arguments.replace(
        train_dataset=subset,
        eval_dataset=subset,
        train_dataloader_kwargs=loader_kwargs,
        overfit_batches=None,
    )
    trainer.train(**settings.as_kwargs())
    return True


@contextlib.contextmanager
def trial_run(trainer: ToolTrainer, num_batches: int) -> Iterator[Path]:
    """Run what is inside on a few batches, then put everything of the user's back.

    Inside, at most ``num_batches`` batches per epoch, a fresh run history and every
    callback's files in a temporary directory (yielded, deleted on exit): each callback's
    ``redirect_outputs`` gets ``<directory>/callbacks/<index>-<class name>``. On exit the
    trainer is as it was (``Snapshot``, the history and the limits).
    """
    callbacks = trainer.callback_handler.callbacks
    history = trainer.run_history
    chosen_rates = trainer._state.chosen_rates
    run_updates = trainer.global_num_updates
    try:
        with Snapshot.taken(trainer), contextlib.ExitStack() as stack:
            stack.enter_context(fewer_batches(trainer, num_batches))
            directory = stack.enter_context(_temporary_directory(trainer))
            if trainer._run_directory is not None:
                stack.enter_context(trainer._run_directory.set_aside(directory / "run", callbacks))
            for index, callback in enumerate(callbacks):
                if isinstance(callback, TrainerCallback):
                    own = directory / "callbacks" / f"{index}-{type(callback).__name__}"
                    stack.enter_context(redirect_outputs(callback, own))
            trainer.dry_run_dir = directory
            trainer.run_history = InMemoryRunHistory()
            yield directory
    finally:
        trainer.dry_run_dir = None
        trainer._state.chosen_rates = chosen_rates.moved_to(trainer.optimizer)
        # num_updates tells the dry run's updates, as before; the run's count is as it was
        trainer._state.updates_before = run_updates - trainer._state.num_updates
        trainer.run_history = history


@dataclasses.dataclass
class Snapshot:
    """What a trial changes in a trainer, copied before it and put back after it, exactly.

    The one way the package puts a trainer back: dry runs, the trials of the batch-size search
    and the learning-rate sweep all run inside ``Snapshot.taken``. Weights and optimizer state
    are copied to the CPU (no device memory); gradients stay where they are. The scheduler
    object is kept too (``train()`` replaces it), with its state.
    """

    model: dict[str, Any]
    optimizer: dict[str, Any]
    scheduler: Any
    scheduler_state: dict[str, Any] | None
    scaler: dict[str, Any] | None
    grads: list[torch.Tensor | None]
    modes: list[bool]
    random: tuple[Any, ...]

    @classmethod
    def take(cls, trainer: ToolTrainer) -> Snapshot:
        """Copy what a trial may change in ``trainer``."""
        model, scheduler, scaler = (
            _bare_model(trainer),
            trainer.scheduler,
            trainer.accelerator.scaler,
        )
        state_dict = getattr(scheduler, "state_dict", None)
        return cls(
            model=_copied_to_cpu(model.state_dict()),
            optimizer=_copied_to_cpu(trainer.optimizer.state_dict()),
            scheduler=scheduler,
            scheduler_state=None if state_dict is None else copy.deepcopy(state_dict()),
            scaler=None if scaler is None else copy.deepcopy(scaler.state_dict()),
            grads=[None if p.grad is None else p.grad.detach().clone() for p in model.parameters()],
            modes=[module.training for module in model.modules()],
            random=_random_states(),
        )

    def restore(self, trainer: ToolTrainer) -> None:
        """Put everything back in ``trainer``, in place."""
        model = _bare_model(trainer)
        with torch.no_grad():
            model.load_state_dict(self.model)
        trainer.optimizer.load_state_dict(self.optimizer)
        trainer.scheduler = self.scheduler
        if self.scheduler_state is not None:
            self.scheduler.load_state_dict(self.scheduler_state)
        if self.scaler is not None:
            trainer.accelerator.scaler.load_state_dict(self.scaler)
        for parameter, grad in zip(model.parameters(), self.grads, strict=True):
            parameter.grad = grad
        for module, training in zip(model.modules(), self.modes, strict=True):
            module.training = training
        _set_random_states(self.random)

    @classmethod
    @contextlib.contextmanager
    def taken(cls, trainer: ToolTrainer) -> Iterator[Snapshot]:
        """Take a snapshot of ``trainer``; put it back when the block ends, however it ends."""
        snapshot = cls.take(trainer)
        try:
            yield snapshot
        finally:
            snapshot.restore(trainer)


@contextlib.contextmanager
def _temporary_directory(trainer: ToolTrainer) -> Iterator[Path]:
    """A new directory under the system's temporary one, the same path on every process."""
    name = main_process_object(f"pytorch-accel-dry-run-{uuid.uuid4().hex}")
    directory = Path(tempfile.gettempdir()) / name
    try:
        yield directory
    finally:
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            shutil.rmtree(directory, ignore_errors=True)


def _bare_model(trainer: ToolTrainer) -> torch.nn.Module:
    """The model without distributed or ``torch.compile`` wrappers (its keys do not change)."""
    return trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)  # type: ignore[no-any-return]


def _copied_to_cpu(value: Any) -> Any:
    """A deep copy of ``value`` with every tensor copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: _copied_to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied_to_cpu(item) for item in value)
    return copy.deepcopy(value)


def _random_states() -> tuple[Any, ...]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_random_states(states: tuple[Any, ...]) -> None:
    python, numpy_state, cpu, cuda = states
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
