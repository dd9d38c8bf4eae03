"""What a trainer holds for its runs: ``TrainerState`` and what accelerate prepared.

**``TrainerState``**: everything that changes while a trainer runs, in one object. The loop
(``pytorch_accel._loop``) writes it; the trainer's public properties and the code that saves a
training state read it.

**``Preparation``**: the model and the optimizer are prepared once each (again only when they
were replaced, or when parameters were unfrozen under DistributedDataParallel); each run's
dataloaders are prepared afresh and the previous run's are dropped from the accelerator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel._batches import ItemWeighting
from pytorch_accel._resumable import ResumableLoader, make_resumable
from pytorch_accel.dataloaders import default_dataloader_kwargs, loader_settings, named_eval_sets
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.failing_batches import skip_policy
from pytorch_accel.protocols import TrainerLike
from pytorch_accel.run_config import (
    ChosenRates,
    TrainArguments,
    TrainerRunConfig,
    create_run_config,
    scale_learning_rates,
)
from pytorch_accel.schedulers.stepping import SchedulerStepping
from pytorch_accel.tracking import LoggedMetrics, LossTracker

if TYPE_CHECKING:
    from pytorch_accel._checkpointing.resume import Position, ResumePoint
    from pytorch_accel._checkpointing.staging import PendingSave
    from pytorch_accel.plugins.failing_batches import FailingBatchGuard
    from pytorch_accel.plugins.micro_batches import MicroBatchSplitter

__all__ = ["Preparation", "PreparedTrainer", "TrainerState", "fewer_batches"]


class PreparedTrainer(TrainerLike, Protocol):
    """A trainer as its preparation sees it: its public surface and its dataloaders' arguments."""

    _train_dl_kwargs: dict[str, Any]
    _eval_dl_kwargs: dict[str, Any]


@contextlib.contextmanager
def fewer_batches(trainer: TrainerLike, num_batches: int, *, train: bool = True) -> Iterator[None]:
    """Run at most ``num_batches`` batches per eval epoch (and train epoch) inside the block.

    The one mechanism for fewer batches is the trainer's ``limit_eval_batches`` and
    ``limit_train_batches``, read as each epoch starts; this lowers them (a lower limit already
    set is kept) and puts them back after the block. The sanity evaluation and dry runs use it;
    ``LimitBatchesCallback`` (and ``PYTORCH_ACCEL_LIMIT_BATCHES``, which adds it) and
    ``LimitEvalStepsCallback`` set the same attributes.
    """
    kept = trainer.limit_train_batches, trainer.limit_eval_batches
    lowered = [num_batches if limit is None else min(limit, num_batches) for limit in kept]
    try:
        if train:
            trainer.limit_train_batches = lowered[0]
        trainer.limit_eval_batches = lowered[1]
        yield
    finally:
        trainer.limit_train_batches, trainer.limit_eval_batches = kept


class TrainerState:
    """What changes during a trainer's runs: counters, position, stop, prepared dataloaders.

    The trainer's properties of the same names document most attributes; the others:

    Attributes:
        step: Training micro-batches done in the current epoch (before the step's end event,
            so that a stop raised there still counts the step).
        num_updates: Optimizer updates so far in the current ``train()``: the one update count
            (``Trainer.num_updates``; ``Trainer.global_num_updates`` adds ``updates_before``).
        updates_before: Optimizer updates of the earlier ``train()`` calls of the same run
            (those that continued it with ``reset_run_history=False``); 0 in a new run.
        savable: Where a training state may be saved now: ``"step"`` (between steps),
            ``"epoch"`` (between epochs), ``"end"`` (after the last epoch) or ``None``.
        stop_request: A ``StopTrainingError`` raised on this process that the processes have
            not agreed on yet.
        agreed_stop: The stop every process agreed on and is unwinding with.
        resume: The resume point the current run has yet to enter, if any.
        pass_random_state: The CPU random state at the start of the current pass through a
            train dataloader that resumes by replaying its batches.
        resumable: The controls of a train dataloader that can resume mid-epoch, if it can.
        item_weighting: The token-exact weighting of the accumulation windows.
        failing_batches: The guard of ``train(skip_failing_batches=...)``, if asked for.
        micro_batches: The splitter of ``train(on_oom="split")`` (or of a batch-size search's
            trial), if asked for.
        probing: Whether ``train()`` runs a trial of the batch-size search.
        sanity_checking: Whether the eval epochs are the sanity check before training.
        chosen_rates: The learning rates the user chose, kept across runs (``auto_scale_lr``).
        pending_save: A training state being written in the background, if any.
        eval_batch_size: ``evaluate()``'s and ``predict()``'s default per-device batch size:
            the last ``train()``'s (8 before any).
    """

    def __init__(self) -> None:
        self.epoch_index = 0
        self.finished_epochs = 0
        self.step = 0
        self.eval_step = 0
        self.num_updates = 0
        self.updates_before = 0
        self.eval_batch_size = 8
        self.running = False
        self.savable: Literal["step", "epoch", "end"] | None = None
        self.stop_request: StopTrainingError | None = None
        self.agreed_stop: StopTrainingError | None = None
        self.stopped_by: StopTrainingError | None = None
        self.grad_norm: torch.Tensor | None = None
        self.resume: ResumePoint | None = None
        self.resumed_from: Path | None = None
        self.pass_random_state: torch.Tensor | None = None
        self.train_dataloader: DataLoader[Any] | None = None
        self.eval_dataloaders: dict[str | None, DataLoader[Any]] = {}
        self.eval_set: str | None = None
        self.resumable: ResumableLoader | None = None
        self.train_loss_tracker = LossTracker()
        self.eval_loss_tracker = LossTracker()
        self.item_weighting = ItemWeighting()
        self.logged = LoggedMetrics()
        self.failing_batches: FailingBatchGuard | None = None
        self.micro_batches: MicroBatchSplitter | None = None
        self.probing = False
        self.eval_metric_name = "eval_loss_epoch"
        self.sanity_checking = False
        self.chosen_rates = ChosenRates()
        self.scheduler_stepping = SchedulerStepping()  # the run's, set when the loop starts
        self.pending_save: PendingSave | None = None

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None:
        """The eval dataloader of the set being evaluated, else of the first set (or ``None``)."""
        loaders = self.eval_dataloaders
        if self.eval_set in loaders:  # no truth test: that would ask each loader its length
            return loaders[self.eval_set]
        return next(iter(loaders.values()), None)

    def start_counting(self, continue_run: bool) -> None:
        """Start a ``train()`` call's update count at 0; carry the run's count on, or restart it."""
        self.updates_before = self.updates_before + self.num_updates if continue_run else 0
        self.num_updates = 0

    def restore_counts(self, saved: Mapping[str, Any]) -> None:
        """Set the update count and the run's earlier updates to a saved trainer state's."""
        self.num_updates = int(saved["num_updates"])
        self.updates_before = int(saved.get("updates_before", 0))  # 0: saved before it existed

    def position(self, where: str) -> Position:
        """Return where the loop is, as the point a run resumed from a save there continues.

        Raises:
            RuntimeError: Inside ``train()`` anywhere but between steps or between epochs.
        """
        from pytorch_accel._checkpointing.resume import Position

        if not self.running or self.savable == "end":
            return Position(self.finished_epochs, 0, in_run=False)
        if self.savable == "step":
            return Position(self.epoch_index, self.step, in_run=True)
        if self.savable == "epoch":
            return Position(self.epoch_index + 1, 0, in_run=True)
        raise RuntimeError(
            f"{where}: a training state can only be saved between steps: call it from "
            "on_train_step_end or on_training_run_epoch_end, or outside train()."
        )

    def guard_steps(self, arguments: TrainArguments, num_processes: int) -> None:
        """Set the run's step guards: failing batches, micro-batches (probing in a trial)."""
        skip = arguments.skip_failing_batches  # an int: the limit of a SkipFailingBatches
        policy = None if skip is None else skip_policy("Trainer.train", skip)
        self.failing_batches = self.micro_batches = None
        if policy is not None:  # the step guards are plugins, imported when asked for
            from pytorch_accel.plugins.failing_batches import FailingBatchGuard

            self.failing_batches = FailingBatchGuard(policy, num_processes)
        if self.probing or arguments.on_oom == "split":
            from pytorch_accel.plugins.micro_batches import MicroBatchSplitter

            self.micro_batches = MicroBatchSplitter(num_processes, probe=self.probing)

    def poll_save(self) -> None:
        """At a step boundary: complete the save written in the background if it is written."""
        if self.pending_save is not None and self.pending_save.poll():
            self.pending_save = None

    def end_save(self, failed: bool = False) -> None:
        """Wait for the save written in the background and complete it (``failed``: abandon)."""
        pending, self.pending_save = self.pending_save, None
        if pending is not None and failed:
            pending.abandon()
        elif pending is not None:
            pending.wait()


class Preparation:
    """The accelerate-prepared objects of one trainer (its dataloaders: in ``state``).

    Attributes:
        direct_optimizer: The optimizer inside accelerate's wrapper when calling it directly is
            equivalent (see ``_direct_optimizer``), else ``None``.
    """

    def __init__(self, accelerator: Accelerator, state: TrainerState) -> None:
        self._accelerator = accelerator
        self._state = state
        self._prepared: tuple[object, object] = (None, None)
        self._trainable_when_wrapped: tuple[bool, ...] = ()
        self.direct_optimizer: torch.optim.Optimizer | None = None
        self._building: dict[str, Any] = {}  # the overrides of the dataloader being built

    @property
    def has_model(self) -> bool:
        """Whether a model and an optimizer were prepared."""
        return self._prepared != (None, None)

    @contextlib.contextmanager
    def prepared(
        self,
        trainer: PreparedTrainer,
        train_dl: DataLoader[Any] | None,
        eval_dls: Mapping[str | None, DataLoader[Any]],
    ) -> Iterator[None]:
        """Prepare the model and optimizer (once each) and the dataloaders of a run in the block.

        The previous run's dataloaders are forgotten. When the block ends, the worker processes
        the dataloaders still hold are shut down: torchdata's ``StatefulDataLoader`` (and any
        loader with ``persistent_workers``) keeps its iterator, so a pass that the update budget,
        a stop or ``limit_eval_batches`` ended midway would keep its workers, and the threads
        feeding them, for as long as the trainer lives; later runs would fork their workers from
        a process running those threads, which can deadlock the child. A later pass starts new
        workers.
        """
        self.prepare_model_and_optimizer(trainer)
        state = self._state
        previous = (state.train_dataloader, *state.eval_dataloaders.values())
        _forget_dataloaders(self._accelerator, *previous)
        state.resumable, state.eval_set = None, None
        state.train_dataloader = None if train_dl is None else self._prepare_train(train_dl)
        state.eval_dataloaders = {name: self._prepare(dl) for name, dl in eval_dls.items()}
        try:
            yield
        finally:
            for dataloader in (state.train_dataloader, *state.eval_dataloaders.values()):
                _release_workers(dataloader)

    def build_dataloaders(
        self, trainer: PreparedTrainer, arguments: TrainArguments
    ) -> tuple[DataLoader[Any], dict[str | None, DataLoader[Any]]]:
        """Return a run's dataloaders: those the user built, or built by ``trainer``'s hooks."""
        a, batch_size = arguments, arguments.per_device_batch_size or 8
        trainer._train_dl_kwargs = {}
        train_dl = _adopt(trainer, "train", a.train_dataset)
        if train_dl is None:
            with self._overrides(a.train_dataloader_kwargs):
                train_dl = trainer.create_train_dataloader(batch_size, a.train_dataloader_kwargs)
        evals = self.build_eval_dataloaders(
            trainer, a.eval_dataset, batch_size, a.eval_dataloader_kwargs
        )
        return train_dl, evals

    def build_eval_dataloaders(
        self,
        trainer: PreparedTrainer,
        evaluation: Any,
        batch_size: int,
        eval_kwargs: Mapping[str, Any] | None,
    ) -> dict[str | None, DataLoader[Any]]:
        """One dataloader per eval set (``{}`` for none), adopted or built.

        While a set's dataloader is built, ``eval_dataset`` is that set (for an overridden
        ``create_eval_dataloader``); afterwards it is what was passed.
        """
        trainer._eval_dl_kwargs, trainer.eval_dataset = {}, None
        if evaluation is None:
            return {}
        loaders: dict[str | None, DataLoader[Any]] = {}
        first_kwargs: dict[str, Any] | None = None
        for name, data in named_eval_sets("Trainer", "eval_dataset", evaluation).items():
            loader = _adopt(trainer, "eval", data)
            if loader is None:
                with self._overrides(eval_kwargs):
                    loader = trainer.create_eval_dataloader(batch_size, eval_kwargs)
            loaders[name] = loader
            first_kwargs = trainer._eval_dl_kwargs if first_kwargs is None else first_kwargs
        trainer._eval_dl_kwargs = first_kwargs or {}
        if None not in loaders:
            trainer.eval_dataset = evaluation
        return loaders

    def default_dl_kwargs(
        self,
        dataset: Any,
        batch_size: int,
        *,
        shuffle: bool,
        collate_fn: Callable[..., Any] | None,
    ) -> dict[str, Any]:
        """Return the default ``DataLoader`` arguments for this machine's processes and device.

        While ``build_dataloaders`` builds a loader whose overrides name ``num_workers``, the
        dataset is not read to choose a default that would be overridden anyway.
        """
        return default_dataloader_kwargs(
            dataset,
            batch_size,
            shuffle=shuffle,
            # the processes on this machine (LOCAL_WORLD_SIZE, if launched)
            num_local_processes=int(
                os.environ.get("LOCAL_WORLD_SIZE", self._accelerator.num_processes)
            ),
            device=self._accelerator.device,
            collate_fn=collate_fn,
            read_items="num_workers" not in self._building,
        )

    @contextlib.contextmanager
    def _overrides(self, kwargs: Mapping[str, Any] | None) -> Iterator[None]:
        """Make ``kwargs`` the overrides of the loader being built, inside the block."""
        self._building = dict(kwargs or {})
        try:
            yield
        finally:
            self._building = {}

    def training_run_config(
        self, trainer: PreparedTrainer, arguments: TrainArguments
    ) -> TrainerRunConfig:
        """Describe a ``train()`` run over its prepared dataloaders, and finish its set-up.

        (Scale the learning rates; keep the failing-batch guard and micro-batch splitter.)
        """
        state, accelerator = self._state, self._accelerator
        dl_kwargs = (trainer._train_dl_kwargs, trainer._eval_dl_kwargs)
        config = create_run_config(
            accelerator, state.train_dataloader, trainer.limit_train_batches, dl_kwargs, arguments
        )
        base, total = arguments.auto_scale_lr, config.train_total_batch_size
        factor = scale_learning_rates(trainer.optimizer, total, base, state.chosen_rates)
        state.guard_steps(arguments, accelerator.num_processes)
        return dataclasses.replace(config, lr_scale_factor=factor)

    def prepare_model_and_optimizer(self, trainer: TrainerLike) -> None:
        """Prepare ``trainer.model`` and ``trainer.optimizer``, each once, and assign them back."""
        accelerator = self._accelerator
        model_ready = trainer.model is self._prepared[0] and not self._trainable_set_changed()
        optimizer_ready = trainer.optimizer is self._prepared[1]
        if not model_ready and not optimizer_ready:
            model = _forget_model(accelerator, trainer.model)
            trainer.model, trainer.optimizer = accelerator.prepare(model, trainer.optimizer)
        elif not model_ready:
            trainer.model = accelerator.prepare(_forget_model(accelerator, trainer.model))
        elif not optimizer_ready:
            trainer.optimizer = accelerator.prepare(trainer.optimizer)
        self._prepared = (trainer.model, trainer.optimizer)
        self.direct_optimizer = _direct_optimizer(accelerator, trainer.optimizer)
        self._trainable_when_wrapped = _trainable_flags(trainer.model)

    @contextlib.contextmanager
    def prepared_for_prediction(self, dataloader: DataLoader[Any]) -> Iterator[DataLoader[Any]]:
        """Shard a prediction dataloader for the duration of the block, then forget it."""
        prepared = self._prepare(dataloader)
        try:
            yield prepared
        finally:
            _forget_dataloaders(self._accelerator, prepared)

    def _prepare_train(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        """Prepare the train dataloader as one that can resume mid-epoch, where accelerate can.

        A map-style dataset skips by index; a stream that can save its position records it;
        any other stream replays its pass.
        """
        prepared = self._prepare(dataloader)
        resumable = self._state.resumable = make_resumable(prepared)
        if resumable is None:
            from pytorch_accel._checkpointing.streams import track_stream_position

            track_stream_position(prepared)
            return prepared
        registered = getattr(self._accelerator, "_dataloaders", None)
        if isinstance(registered, list):  # accelerate's save_state looks at the loaders it knows
            registered[:] = [resumable.dataloader if dl is prepared else dl for dl in registered]
        return resumable.dataloader  # type: ignore[no-any-return]

    def _prepare(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        """Shard the dataloader across processes; move batches only if the device is not the CPU.

        Placing CPU batches on the CPU is a no-op that costs accelerate about 10 µs per batch.
        """
        placement = self._accelerator.device.type != "cpu"
        return self._accelerator.prepare_data_loader(dataloader, device_placement=placement)  # type: ignore[no-any-return]

    def _trainable_set_changed(self) -> bool:
        """Whether parameters were (un)frozen since DistributedDataParallel wrapped the model.

        It only synchronises the parameters that required gradients when it was built.
        """
        wrapped = self._prepared[0]
        if not isinstance(wrapped, nn.parallel.DistributedDataParallel):
            return False
        return _trainable_flags(wrapped) != self._trainable_when_wrapped


def _forget_dataloaders(accelerator: Accelerator, *dataloaders: object) -> None:
    """Drop a finished run's dataloaders from the accelerator, so repeated runs do not leak."""
    registered = getattr(accelerator, "_dataloaders", None)
    if isinstance(registered, list):
        registered[:] = [dl for dl in registered if all(dl is not old for old in dataloaders)]


def _release_workers(dataloader: object) -> None:
    """Shut down the workers of the iterator a dataloader keeps (``Preparation.prepared``)."""
    inner: Any = getattr(dataloader, "base_dataloader", dataloader)
    shutdown = getattr(getattr(inner, "_iterator", None), "_shutdown_workers", None)
    if shutdown is None:  # no kept iterator, or one without workers
        return
    shutdown()
    inner._iterator = None
    if getattr(inner, "_initial_iter_for_state_dict", False):  # torchdata's own flag
        inner._initial_iter_for_state_dict = False


def _forget_model(accelerator: Accelerator, model: nn.Module) -> nn.Module:
    """Unregister a wrapped model from the accelerator and return the bare module to re-wrap."""
    registered = getattr(accelerator, "_models", None)
    if isinstance(registered, list):
        registered[:] = [known for known in registered if known is not model]
    return accelerator.unwrap_model(model)  # type: ignore[no-any-return]


def _trainable_flags(model: nn.Module) -> tuple[bool, ...]:
    return tuple(parameter.requires_grad for parameter in model.parameters())


_FORWARDING_TYPES = frozenset(
    getattr(DistributedType, name)
    for name in (
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_MUSA",
        "MULTI_SDAA",
        "MULTI_XPU",
        "MULTI_HPU",
    )
    if hasattr(DistributedType, name)
)
"""Distributed types for which accelerate's optimizer wrapper and ``backward`` only forward."""


def _direct_optimizer(accelerator: Accelerator, optimizer: object) -> torch.optim.Optimizer | None:
    """Return the optimizer inside accelerate's wrapper if calling it directly is equivalent.

    ``AcceleratedOptimizer.step``/``zero_grad`` and ``Accelerator.backward`` do work only with
    a gradient scaler (fp16), on XLA, DeepSpeed or Megatron, with LOMO optimizers, or with the
    accelerator's own gradient accumulation (which the trainer keeps at 1). Otherwise they
    forward to ``optimizer.step()``, ``optimizer.zero_grad()`` and ``loss.backward()``, at a
    cost of about 100 µs per step; the trainer then calls those directly.
    """
    inner = getattr(optimizer, "optimizer", None)
    forwarding = (
        isinstance(inner, torch.optim.Optimizer)
        and not type(inner).__module__.startswith("lomo_optim")
        and accelerator.scaler is None
        and accelerator.distributed_type in _FORWARDING_TYPES
        and accelerator.gradient_accumulation_steps == 1
        and accelerator.gradient_state.sync_gradients
    )
    return inner if forwarding else None


def _adopt(trainer: PreparedTrainer, role: str, data: Any) -> DataLoader[Any] | None:
    """Set the trainer's ``<role>_dataset`` from ``data``; return ``data`` if a DataLoader."""
    loader = data if isinstance(data, DataLoader) else None
    setattr(trainer, f"{role}_dataset", data if loader is None else loader.dataset)
    settings = {} if loader is None else loader_settings(loader)
    setattr(trainer, f"_{role}_dl_kwargs", settings)
    return loader
