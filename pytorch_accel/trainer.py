"""The ``Trainer``: a training loop on accelerate, customised by step methods and callbacks.

The loop, top to bottom (see ``pytorch_accel.events`` for the events it fires):

    train()
      _run_training            training run level: start, epochs, stop handling, end
        _train_epochs          for each epoch: train epoch, eval epoch, run-epoch end
          _train_batches       for each batch: one train step level
            _train_step        forward, backward, and the update at a window's end
              _update          clip, optimizer step, scheduler step, zero_grad
          _run_eval_epoch      eval epoch level
            _eval_batches      for each batch: one eval step level

Every level fires its start and end events through ``Trainer._run_level``, so the two
cannot drift apart, including when a ``StopTrainingError``
ends the run early.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, slice_tensors
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel._validation import (
    check_callable,
    check_mapping,
    check_non_negative_number,
    check_positive_int,
    check_positive_number,
    check_sized_dataset,
    fail,
)
from pytorch_accel.accumulation import AccumulationPlan
from pytorch_accel.batch_iteration import epoch_batches
from pytorch_accel.callbacks._rng import training_rng_preserved
from pytorch_accel.callbacks.base import StopTrainingError
from pytorch_accel.callbacks.defaults import DEFAULT_CALLBACKS
from pytorch_accel.callbacks.handler import CallbackHandler, CallbackLike
from pytorch_accel.callbacks.limit_batches import (
    LimitBatchesCallback,
    limit_batches_from_environment,
)
from pytorch_accel.checkpoint import atomic_save, load_checkpoint_file
from pytorch_accel.dataloaders import default_dataloader_kwargs, merge_dataloader_kwargs
from pytorch_accel.distributed import StopAgreement, check_world_size, needs_cpu_distributed
from pytorch_accel.placeholders import (
    TrainerPlaceholderValues,
    contains_placeholder,
    replace_trainer_placeholder_values,
)
from pytorch_accel.progress_events import ProgressEvents
from pytorch_accel.resumable_loader import RandomStates, ResumableLoader, make_resumable
from pytorch_accel.resume import (
    CheckpointedTrainerState,
    Position,
    ResumePoint,
    callback_states,
    gradients,
    restore_callback_states,
    restore_gradients,
)
from pytorch_accel.run_config import TrainerRunConfig
from pytorch_accel.tracking import InMemoryRunHistory, LossTracker, RunHistory
from pytorch_accel.training_state import (
    TrainingStateError,
    latest_training_state,
    load_pickled,
    publish,
    rank_state_name,
    temporary_directory,
    verify_training_state,
    write_manifest,
)

__all__ = [
    "DEFAULT_CALLBACKS",
    "Trainer",
    "TrainerPlaceholderValues",
    "replace_trainer_placeholder_values",
]

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class _Level(NamedTuple):
    """One level of the loop: its hooks, its events and what a stop does to it.

    ``on_stop``: ``"propagate"`` (a step: it does not complete), ``"close"`` (an epoch: fire
    the end, then let the stop unwind) or ``"handle"`` (a run: announce the stop, then end).
    """

    start_hook: str | None
    start_event: str
    end_hook: str | None
    end_event: str
    on_stop: Literal["propagate", "close", "handle"]


_TRAINING_RUN = _Level(
    "training_run_start",
    "on_training_run_start",
    "training_run_end",
    "on_training_run_end",
    "handle",
)
_EVALUATION_RUN = _Level(
    "evaluation_run_start",
    "on_evaluation_run_start",
    "evaluation_run_end",
    "on_evaluation_run_end",
    "handle",
)
_TRAIN_EPOCH = _Level(
    "train_epoch_start", "on_train_epoch_start", "train_epoch_end", "on_train_epoch_end", "close"
)
_EVAL_EPOCH = _Level(
    "eval_epoch_start", "on_eval_epoch_start", "eval_epoch_end", "on_eval_epoch_end", "close"
)
_TRAIN_STEP = _Level(None, "on_train_step_start", None, "on_train_step_end", "propagate")
_EVAL_STEP = _Level(None, "on_eval_step_start", None, "on_eval_step_end", "propagate")
# a step whose two events nobody listens to runs without its level: there is nothing to fire
_TRAIN_STEP_EVENTS = frozenset({_TRAIN_STEP.start_event, _TRAIN_STEP.end_event})
_EVAL_STEP_EVENTS = frozenset({_EVAL_STEP.start_event, _EVAL_STEP.end_event})


class Trainer:
    """Trains a model with a loss function and an optimizer, on whatever accelerate provides.

    Run the same script with ``python train.py`` or ``accelerate launch train.py``: the
    ``accelerate.Accelerator`` (created once per trainer by ``_create_accelerator``)
    handles devices, distributed wrappers and mixed precision. Customise by overriding the
    step methods, or with callbacks.

    Args:
        model: The model to train.
        loss_func: Called as ``loss_func(model_outputs, targets)`` by the default step methods.
        optimizer: An optimizer over the model's parameters.
        callbacks: Callback instances or classes; defaults to ``DEFAULT_CALLBACKS``.
        run_history: Where metrics are recorded; a new ``InMemoryRunHistory`` by default.

    Attributes:
        limit_train_batches: Use at most this many batches of each training epoch (``None``:
            all). Read when ``train()`` starts, so the run config, placeholders and the last
            accumulation window follow it. For quick debug runs; see ``LimitBatchesCallback``.
        limit_eval_batches: Use at most this many batches of each evaluation epoch, read when
            the epoch starts.
        progress_interval: Seconds below which the progress events (``on_train_progress``,
            ``on_eval_progress``) double the steps between them, 0.05 by default; 0 fires them
            after every step. Read when each epoch starts.

    Example:
        ```python
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1))
        trainer.train(train_dataset, num_epochs=3, eval_dataset=eval_dataset)
        ```
    """

    custom_events: ClassVar[tuple[str, ...]] = ()
    """Extra event names this trainer fires (registered with its callback handler)."""

    def __init__(
        self,
        model: nn.Module,
        loss_func: Callable[..., torch.Tensor] | None,
        optimizer: torch.optim.Optimizer,
        callbacks: Iterable[CallbackLike] = DEFAULT_CALLBACKS,
        run_history: RunHistory | None = None,
    ) -> None:
        _check_constructor_arguments(model, loss_func, optimizer, run_history)
        self.model = model
        self.loss_func = loss_func
        self.optimizer = optimizer
        self.callback_handler = self._create_callback_handler(callbacks)
        self.run_history: RunHistory = run_history or InMemoryRunHistory()
        self._accelerator = self._create_accelerator()
        _check_accelerator(self._accelerator)
        self._stop_agreement = StopAgreement() if self._accelerator.num_processes > 1 else None
        self._prepared: tuple[object, object] = (None, None)
        self._direct_optimizer: torch.optim.Optimizer | None = None
        self._trainable_when_wrapped: tuple[bool, ...] = ()
        self.scheduler: Any = None
        self.create_scheduler_fn: SchedulerFactory | None = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self.run_config: TrainerRunConfig | None = None
        self._train_dataloader: DataLoader[Any] | None = None
        self._eval_dataloader: DataLoader[Any] | None = None
        self._train_dl_kwargs: dict[str, Any] = {}
        self._eval_dl_kwargs: dict[str, Any] = {}
        self._train_loss_tracker = LossTracker()
        self._eval_loss_tracker = LossTracker()
        self._num_updates = 0
        self._grad_norm: torch.Tensor | None = None
        self.limit_train_batches: int | None = None
        self.limit_eval_batches: int | None = None
        self.progress_interval: float = 0.05
        self._train_progress = self._progress_events("on_train_progress")
        self._eval_progress = self._progress_events("on_eval_progress")
        self._resumable: ResumableLoader | None = None
        self._checkpointed_state = CheckpointedTrainerState(self._shared_training_state)
        self._state_registered = False
        self._resume: ResumePoint | None = None
        self._resumed_from: Path | None = None
        self._running = False
        self._savable: Literal["step", "epoch", "end"] | None = None
        self._saving: Position | None = None
        self._epoch_index = 0
        self._finished_epochs = 0
        self.callback_handler.call_event("on_init_end", self)

    # ----------------------------------------------------------------- construction hooks

    def _create_callback_handler(self, callbacks: Iterable[CallbackLike]) -> CallbackHandler:
        """Create the ``CallbackHandler``, with this trainer's ``custom_events``.

        When the ``PYTORCH_ACCEL_LIMIT_BATCHES`` environment variable is set (see
        ``LimitBatches``), a ``LimitBatchesCallback`` is added unless one was given.
        """
        callbacks = list(callbacks)
        limit = limit_batches_from_environment()
        if limit is not None and not any(_is_limit_callback(callback) for callback in callbacks):
            callbacks.append(LimitBatchesCallback(limit))
        return CallbackHandler(callbacks, events=self.custom_events)

    def _create_accelerator(self) -> Accelerator:
        """Create the accelerator, once per trainer; override to pass options.

        The default ``Accelerator()`` reads the configuration of ``accelerate config`` and
        ``accelerate launch`` (processes, mixed precision, FSDP/DeepSpeed plugins). When a
        launcher started several processes on a machine without GPUs, it is
        ``Accelerator(cpu=True)``: one gloo process group instead of independent copies.
        Batches are copied to GPUs without blocking (from the pinned memory the default
        dataloaders use there), so loading never synchronises the host with the device.
        """
        return Accelerator(
            cpu=needs_cpu_distributed(),
            dataloader_config=DataLoaderConfiguration(non_blocking=True),
        )

    # --------------------------------------------------------------------- public surface

    @property
    def accelerator(self) -> Accelerator:
        """The trainer's ``accelerate.Accelerator``."""
        return self._accelerator

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""
        return self._accelerator.device  # type: ignore[no-any-return]

    @property
    def train_dataloader(self) -> DataLoader[Any] | None:
        """The prepared train dataloader of the current run (``None`` in ``evaluate()``)."""
        return self._train_dataloader

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None:
        """The prepared eval dataloader of the current run, if any."""
        return self._eval_dataloader

    @property
    def train_loss_tracker(self) -> LossTracker:
        """The on-device tracker of the current training epoch's loss."""
        return self._train_loss_tracker

    @property
    def eval_loss_tracker(self) -> LossTracker:
        """The on-device tracker of the current evaluation epoch's loss."""
        return self._eval_loss_tracker

    @property
    def num_updates(self) -> int:
        """Optimizer updates (attempted, on this process) so far in the current ``train()``.

        It counts the update in progress from ``on_optimizer_step_end`` on, so the scheduler
        step of the k-th update sees ``k`` (1-based).
        """
        return self._num_updates

    @property
    def resumed_from(self) -> Path | None:
        """The training state the current (or last) ``train()`` resumed from, if any."""
        return self._resumed_from

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The total gradient norm of the last update, before clipping, as a device tensor.

        Set when ``train(max_grad_norm=...)`` clips by norm (``None`` otherwise). Reading its
        value (``.item()``) synchronises with the device, so log it at an interval.
        """
        return self._grad_norm

    # ------------------------------------------------------------------------ entry points

    def train(
        self,
        train_dataset: Any,
        num_epochs: int,
        eval_dataset: Any = None,
        per_device_batch_size: int = 8,
        max_num_train_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        gradient_clip_value: float | None = None,
        create_scheduler_fn: SchedulerFactory | None = None,
        train_dataloader_kwargs: Mapping[str, Any] | None = None,
        eval_dataloader_kwargs: Mapping[str, Any] | None = None,
        reset_run_history: bool = True,
        collate_fn: Callable[..., Any] | None = None,
        *,
        max_grad_norm: float | None = None,
        resume_from: str | os.PathLike[str] | None = None,
    ) -> None:
        """Train for ``num_epochs`` (or ``max_num_train_steps`` updates, whichever ends first).

        Args:
            train_dataset: A map-style dataset (with ``__len__``).
            num_epochs: Epochs to train for in this call.
            eval_dataset: Evaluated after every training epoch, if given.
            per_device_batch_size: Batch size on each process (train and eval).
            max_num_train_steps: Stop after this many optimizer updates (per process).
            gradient_accumulation_steps: Micro-batches per optimizer update.
            gradient_clip_value: Clip each gradient element to ``[-value, value]``.
            create_scheduler_fn: ``optimizer -> scheduler``, usually a ``functools.partial``
                whose arguments may hold ``TrainerPlaceholderValues``.
            train_dataloader_kwargs: Override the train ``DataLoader`` arguments.
            eval_dataloader_kwargs: Override the eval ``DataLoader`` arguments.
            reset_run_history: Start a fresh run history; ``False`` continues the metrics and
                the epoch count of earlier calls.
            collate_fn: The collate function of both dataloaders.
            max_grad_norm: Clip the global gradient norm to this value.
            resume_from: A directory written by ``save_training_state`` (or
                ``SaveTrainingStateCallback``) to continue exactly where it was saved, with the
                same arguments as the saved run; or ``"latest"``: the newest complete state in
                the ``save_dir`` of the trainer's ``SaveTrainingStateCallback``, starting
                afresh if there is none yet.
        """
        _check_train_arguments(locals())
        self._check_progress_interval("Trainer.train")
        loss_steps = _LOSS_STEPS if eval_dataset is not None else _LOSS_STEPS[:1]
        self._check_loss_func("Trainer.train", loss_steps)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.create_scheduler_fn, self.collate_fn = create_scheduler_fn, collate_fn
        if reset_run_history:
            self.run_history.reset()
        train_dl = self.create_train_dataloader(per_device_batch_size, train_dataloader_kwargs)
        self._check_enough_samples(train_dl)
        eval_dl, self._eval_dl_kwargs = None, {}
        if eval_dataset is not None:
            eval_dl = self.create_eval_dataloader(per_device_batch_size, eval_dataloader_kwargs)
        self._prepare(train_dl, eval_dl)
        self._check_has_batches()
        self.run_config = self._create_run_config(
            num_epochs=num_epochs,
            gradient_accumulation_steps=gradient_accumulation_steps,
            max_num_train_steps=max_num_train_steps,
            gradient_clip_value=gradient_clip_value,
            max_grad_norm=max_grad_norm,
        )
        self.scheduler = self.create_scheduler() if create_scheduler_fn is not None else None
        self._num_updates = 0
        self.optimizer.zero_grad()  # a stop inside an accumulation window leaves gradients behind
        self._resume = self._resume_point(resume_from)
        self._resumed_from = None if self._resume is None else self._resume.directory
        self._running = True
        try:
            self._run_training()
        finally:
            self._running, self._resume, self._savable = False, None, None

    def evaluate(
        self,
        dataset: Any = None,
        per_device_batch_size: int = 8,
        dataloader_kwargs: Mapping[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
    ) -> None:
        """Evaluate the model once on ``dataset``; the mean loss is recorded as ``evaluation_loss``.

        Unlike pytorch-accelerated, this does not reset the run history: the metrics of
        earlier training runs are kept.

        Args:
            dataset: The dataset; defaults to the ``eval_dataset`` of the last ``train()``.
            per_device_batch_size: Batch size on each process.
            dataloader_kwargs: Override the ``DataLoader`` arguments.
            collate_fn: The collate function of the dataloader.
        """
        dataset = self.eval_dataset if dataset is None else dataset
        if dataset is None:
            fail(
                ValueError,
                "Trainer.evaluate",
                "dataset",
                None,
                "a dataset",
                "Pass evaluate(dataset=...), or call train(..., eval_dataset=...) first.",
            )
        check_sized_dataset("Trainer.evaluate", "dataset", dataset)
        check_positive_int("Trainer.evaluate", "per_device_batch_size", per_device_batch_size)
        check_mapping("Trainer.evaluate", "dataloader_kwargs", dataloader_kwargs)
        self._check_loss_func("Trainer.evaluate", ("calculate_eval_batch_loss",))
        self._check_progress_interval("Trainer.evaluate")
        self.eval_dataset, self.collate_fn = dataset, collate_fn
        self._train_dl_kwargs = {}
        self._prepare(None, self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs))
        self.run_config = self._create_run_config(num_epochs=1)
        self._run_level(_EVALUATION_RUN, functools.partial(self._run_eval_epoch, "evaluation_loss"))

    # --------------------------------------------------------------------- overridable steps

    def create_train_dataloader(
        self, batch_size: int, train_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the train dataloader from ``get_default_train_dl_kwargs`` and overrides."""
        self._train_dl_kwargs = merge_dataloader_kwargs(
            self.get_default_train_dl_kwargs(batch_size), train_dl_kwargs
        )
        return DataLoader(self.train_dataset, **self._train_dl_kwargs)

    def create_eval_dataloader(
        self, batch_size: int, eval_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the eval dataloader from ``get_default_eval_dl_kwargs`` and overrides."""
        self._eval_dl_kwargs = merge_dataloader_kwargs(
            self.get_default_eval_dl_kwargs(batch_size), eval_dl_kwargs
        )
        return DataLoader(self.eval_dataset, **self._eval_dl_kwargs)

    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Return the default train ``DataLoader`` arguments (shuffled)."""
        return self._default_dl_kwargs(self.train_dataset, batch_size, shuffle=True)

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Return the default eval ``DataLoader`` arguments (not shuffled)."""
        return self._default_dl_kwargs(self.eval_dataset, batch_size, shuffle=False)

    def create_scheduler(self) -> Any:
        """Create the scheduler from ``create_scheduler_fn``, resolving its placeholders.

        It receives the optimizer whose ``step`` the trainer calls (see
        ``optimizer_step``) and is stepped by ``scheduler_step`` once per
        optimizer update on each process. It is not passed through ``accelerator.prepare``,
        which would step it once per process per update.
        """
        factory = replace_trainer_placeholder_values(self, self.create_scheduler_fn)
        scheduler = factory(self._direct_optimizer or self.optimizer)
        for name, value in vars(scheduler).items():
            if contains_placeholder(value):
                raise ValueError(
                    f"Trainer.create_scheduler: {type(scheduler).__name__}.{name} holds the "
                    f"unresolved placeholder {value!r}. Pass placeholders as arguments of a "
                    "functools.partial so the trainer can resolve them."
                )
        return scheduler

    def training_run_start(self) -> None:
        """Hook at the start of a training run (before ``on_training_run_start``)."""

    def train_epoch_start(self) -> None:
        """Hook at the start of each training epoch: puts the model in train mode."""
        self.model.train()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one training batch.

        Args:
            batch: ``(inputs, targets)`` by default.

        Returns:
            A dict with ``loss`` (the batch's mean loss, un-scaled), ``model_outputs`` and
            ``batch_size``. Gradient accumulation scaling happens in the loop.
        """
        inputs, targets = batch[0], batch[1]
        model_outputs = self.model(inputs)
        loss = self.loss_func(model_outputs, targets)  # type: ignore[misc]  # checked by train()
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def backward_step(self, loss: torch.Tensor) -> None:
        """Run the backward pass of an already scaled loss.

        Through ``accelerator.backward`` when it does work (gradient scaling, DeepSpeed, ...);
        where it would only call ``loss.backward()``, that is called directly.
        """
        if self._direct_optimizer is None:
            self._accelerator.backward(loss)
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def optimizer_step(self) -> None:
        """Update the parameters.

        Through accelerate's optimizer wrapper when it does work (gradient scaler, XLA,
        DeepSpeed, ...); where it would only forward the call, the inner optimizer is stepped
        directly, which saves most of accelerate's per-step overhead.
        """
        (self._direct_optimizer or self.optimizer).step()

    def scheduler_step(self) -> None:
        """Step the scheduler (called after each optimizer update that was not skipped)."""
        self.scheduler.step()

    def optimizer_zero_grad(self) -> None:
        """Reset the gradients after an update (to ``None``, as both torch and accelerate do)."""
        (self._direct_optimizer or self.optimizer).zero_grad()

    def train_epoch_end(self) -> None:
        """Hook at the end of each training epoch (``train_loss_epoch`` is recorded)."""

    def eval_epoch_start(self) -> None:
        """Hook at the start of each evaluation epoch: puts the model in eval mode."""
        self.model.eval()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one evaluation batch, without gradients.

        Args:
            batch: ``(inputs, targets)`` by default.

        Returns:
            A dict with ``loss``, ``model_outputs`` and ``batch_size``.
        """
        with torch.no_grad():
            inputs, targets = batch[0], batch[1]
            model_outputs = self.model(inputs)
            loss = self.loss_func(model_outputs, targets)  # type: ignore[misc]  # checked on entry
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def eval_epoch_end(self) -> None:
        """Hook at the end of each evaluation epoch (its loss is recorded)."""

    def training_run_epoch_end(self) -> None:
        """Hook after each completed epoch of a training run (train, then eval)."""

    def training_run_end(self) -> None:
        """Hook at the end of a training run, also after an early stop."""

    def evaluation_run_start(self) -> None:
        """Hook at the start of an evaluation run."""

    def evaluation_run_end(self) -> None:
        """Hook at the end of an evaluation run."""

    # ---------------------------------------------------------------------------- utilities

    def gather(self, tensor: Any, padding_value: float | None = None) -> Any:
        """Gather tensors from all processes, concatenated on the first dimension.

        Args:
            tensor: A tensor, or a nested list/tuple/dict of tensors.
            padding_value: If given, first pad every process's tensors to the same first
                dimension with this value (needed when sizes differ).

        Returns:
            The gathered tensor(s). Every process must call this.
        """
        if padding_value is not None:
            tensor = self._accelerator.pad_across_processes(tensor, pad_index=padding_value)
        return self._accelerator.gather(tensor)

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather predictions or targets from all processes, without duplicated samples.

        When the eval set does not divide evenly, accelerate pads the last batches with
        repeated samples; this drops them, so metrics see every sample exactly once.
        """
        return self._accelerator.gather_for_metrics(data)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once per node (on each node's main process)."""
        self._accelerator.print(*args, **kwargs)

    def get_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """Return the model without its distributed or mixed-precision wrappers."""
        return self._accelerator.unwrap_model(  # type: ignore[no-any-return]
            self.model, keep_torch_compile=keep_torch_compile
        )

    def save_checkpoint(
        self,
        save_path: str | os.PathLike[str],
        checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
    ) -> None:
        """Write a portable checkpoint file, atomically, from the main process.

        The file holds ``model_state_dict`` (unwrapped model), ``optimizer_state_dict`` and
        ``scheduler_state_dict`` when asked for and present, and ``checkpoint_kwargs``. It is
        written to a temporary file and renamed, so a failed save leaves the previous file
        intact. Every process must call this.

        Args:
            save_path: The file to write (e.g. ``"model.pt"``).
            checkpoint_kwargs: Extra entries (tensors, numbers, strings, containers).
            save_optimizer: Include the optimizer state.
            save_scheduler: Include the scheduler state, if there is a scheduler.
        """
        checkpoint: dict[str, Any] = {"model_state_dict": self._model_state_dict()}
        if save_optimizer:
            checkpoint["optimizer_state_dict"] = self.optimizer.state_dict()
        if save_scheduler and self.scheduler is not None:
            checkpoint["scheduler_state_dict"] = self.scheduler.state_dict()
        checkpoint.update(checkpoint_kwargs or {})
        if self._accelerator.is_main_process:
            atomic_save(checkpoint, save_path)
        self._accelerator.wait_for_everyone()

    def _model_state_dict(self) -> dict[str, Any]:
        """The unwrapped model's state dict, without ``torch.compile``'s ``_orig_mod.`` prefix.

        Sharded engines (FSDP, DeepSpeed) gather it through the accelerator, on every process.
        """
        sharded = (DistributedType.FSDP, DistributedType.DEEPSPEED)
        if self._accelerator.distributed_type in sharded:
            return self._accelerator.get_state_dict(self.model)  # type: ignore[no-any-return]
        return self.get_model(keep_torch_compile=False).state_dict()

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike[str],
        load_optimizer: bool = True,
        load_scheduler: bool = True,
    ) -> dict[str, Any]:
        """Load a checkpoint written by ``save_checkpoint`` (safely: ``weights_only``).

        Args:
            checkpoint_path: The checkpoint file.
            load_optimizer: Restore the optimizer state, if the file has one.
            load_scheduler: Restore the scheduler state, if the file and trainer have one.

        Returns:
            The whole checkpoint dict, including the ``checkpoint_kwargs`` saved with it.
        """
        self._accelerator.wait_for_everyone()
        checkpoint = load_checkpoint_file(checkpoint_path)
        try:
            self.get_model(keep_torch_compile=False).load_state_dict(checkpoint["model_state_dict"])
        except RuntimeError as error:
            raise ValueError(
                f"load_checkpoint: {os.fspath(checkpoint_path)!r} does not fit this model: {error}"
            ) from error
        if load_optimizer and "optimizer_state_dict" in checkpoint:
            self.optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
        if load_scheduler and "scheduler_state_dict" in checkpoint and self.scheduler is not None:
            self.scheduler.load_state_dict(checkpoint["scheduler_state_dict"])
        return checkpoint

    def save_training_state(self, output_dir: str | os.PathLike[str]) -> Path:
        """Save everything needed to continue this run exactly, atomically, to a directory.

        Model, optimizer, gradient scaler and every process's random states (through
        ``accelerator.save_state``), the scheduler, run history, update counter, position in
        the loop, every callback with ``state_dict``/``load_state_dict``, and per process the
        epoch's running loss, gradients of an unfinished accumulation window and the random
        states of the epoch's order. Written to a hidden temporary directory and renamed into
        place once complete (with its manifest), so a failed or interrupted save leaves an
        existing ``output_dir`` intact. Every process must call this.

        Call it outside ``train()``, or inside from ``on_train_step_end`` or
        ``on_training_run_epoch_end`` (``SaveTrainingStateCallback`` does this for you).

        Args:
            output_dir: The directory to write; an existing one is replaced.

        Returns:
            The directory written.

        Raises:
            RuntimeError: If called at another point inside ``train()``.
        """
        final = Path(output_dir)
        self._saving = self._position("Trainer.save_training_state")
        try:
            self._write_training_state(final, temporary_directory(final))
        finally:
            self._saving = None
        return final

    def load_training_state(self, input_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore the model, optimizer, scaler, random states and run history of a saved state.

        To continue training where the state was saved (scheduler, callbacks, position in the
        epoch included), use ``train(..., resume_from=input_dir)`` instead. The directory is
        verified first: its manifest, every file's size and SHA-256 digest, every pickled file
        read with ``weights_only=True``, the world size and the model's parameter names and
        shapes. Every process must call this.

        Args:
            input_dir: A directory written by ``save_training_state``.

        Returns:
            The trainer state saved with it (position, counters, callback states).

        Raises:
            FileNotFoundError: If there is no such directory.
            TrainingStateError: If it is incomplete, corrupt or does not fit this trainer.
        """
        shared, _ = self._load_training_state(Path(input_dir), "Trainer.load_training_state")
        self.run_history.load_state_dict(shared["history"])
        return shared

    # ------------------------------------------------------------------- training states

    def _position(self, where: str) -> Position:
        if not self._running or self._savable == "end":
            return Position(self._finished_epochs, 0, in_run=False)
        if self._savable == "step":
            return Position(self._epoch_index, self._train_progress.done, in_run=True)
        if self._savable == "epoch":
            return Position(self._epoch_index + 1, 0, in_run=True)
        raise RuntimeError(
            f"{where}: a training state can only be saved between steps: call it from "
            "on_train_step_end or on_training_run_epoch_end, or outside train()."
        )

    def _register_training_state(self) -> None:
        """Register the trainer's state with accelerate's checkpointing, once per trainer."""
        if not self._state_registered:
            self._accelerator.register_for_checkpointing(self._checkpointed_state)
            self._state_registered = True

    def _shared_training_state(self) -> dict[str, Any]:
        """The trainer state that is the same on every process (saved by the main process)."""
        position = self._saving or self._position("Trainer.save_training_state")
        history = self.run_history.state_dict()
        if self._savable == "epoch":  # the trainer counts the epoch right after this event
            history["current_epoch"] += 1
        config = self.run_config
        return {
            "position": position.to_dict(),
            "num_updates": self._num_updates,
            "run": {} if config is None else _resume_relevant(config),
            "history": history,
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "callbacks": callback_states(self.callback_handler.callbacks),
        }

    def _rank_training_state(self, position: Position) -> dict[str, Any]:
        """The trainer state that differs between processes."""
        resumable = self._resumable
        mid_epoch = position.in_run and position.batches_done > 0
        loader: dict[str, Any] = {"epoch_states": None, "generators": [], "iteration": 0}
        if resumable is not None:
            epoch_states = resumable.randomness.epoch_states if mid_epoch else None
            loader = {
                "epoch_states": None if epoch_states is None else epoch_states.to_dict(),
                "generators": list(resumable.randomness.current_states().generators),
                "iteration": int(resumable.dataloader.iteration),
            }
        elif mid_epoch:
            raise RuntimeError(
                "Trainer.save_training_state: this train dataloader cannot resume mid-epoch "
                f"({type(self._train_dataloader).__name__}); save at epoch ends instead."
            )
        return {
            "loss_tracker": self._train_loss_tracker.state_dict() if mid_epoch else None,
            "gradients": gradients(self.model),
            "loader": loader,
        }

    def _write_training_state(self, final: Path, temporary: Path) -> None:
        accelerator = self._accelerator
        assert self._saving is not None
        if self._prepared == (None, None):
            self._prepare_model_and_optimizer()
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        self._register_training_state()
        try:
            accelerator.save_state(str(temporary))
            rank_state = self._rank_training_state(self._saving)
            torch.save(rank_state, temporary / rank_state_name(accelerator.process_index))
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                _check_saved_states_load_safely(temporary)
                write_manifest(temporary, self._manifest_info())
                publish(temporary, final)
        except BaseException:
            if accelerator.is_main_process:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        accelerator.wait_for_everyone()

    def _manifest_info(self) -> dict[str, Any]:
        assert self._saving is not None
        return {
            "world_size": self._accelerator.num_processes,
            "saved_at_ns": time.time_ns(),
            "num_updates": self._num_updates,
            "epoch": self.run_history.current_epoch,
            "position": self._saving.to_dict(),
        }

    def _load_training_state(
        self,
        directory: Path,
        where: str,
        check: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Verify a training state, then load it through accelerate; return its trainer parts.

        ``check`` sees the saved trainer state before anything is loaded into the trainer.
        """
        accelerator = self._accelerator
        verify_training_state(directory, accelerator.num_processes, where)
        if self._prepared == (None, None):
            self._prepare_model_and_optimizer()
        _check_model_fits(self.model, directory, where)
        self._register_training_state()
        if check is not None:
            check(self._read_saved_trainer_state(directory, where))
        try:
            accelerator.load_state(str(directory))
        except (RuntimeError, ValueError, KeyError) as error:
            raise TrainingStateError(
                f"{where}: {str(directory)!r} does not fit this trainer's model or optimizer: "
                f"{error}"
            ) from error
        shared = self._checkpointed_state.loaded
        if shared is None:
            raise TrainingStateError(f"{where}: {str(directory)!r} holds no trainer state.")
        rank_file = directory / rank_state_name(accelerator.process_index)
        return shared, load_pickled(rank_file, where)

    def _resume_point(self, resume_from: str | os.PathLike[str] | None) -> ResumePoint | None:
        """Load the state to resume from (if any) and check that it fits this run."""
        where = "Trainer.train"
        if resume_from is None:
            return None
        directory = self._resume_directory(resume_from)
        if directory is None:
            return None
        check = functools.partial(self._check_resumable, directory)
        shared, rank_state = self._load_training_state(directory, where, check)
        random_states = RandomStates(
            torch.get_rng_state(), tuple(rank_state["loader"]["generators"])
        )
        position = Position.from_dict(shared["position"])
        self.run_history.load_state_dict(shared["history"])
        self._num_updates = int(shared["num_updates"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(shared["scheduler"])
        self.print(f"Resuming from {str(directory)!r} (epoch {self.run_history.current_epoch}).")
        return ResumePoint(directory, position, shared["callbacks"], rank_state, random_states)

    def _resume_directory(self, resume_from: str | os.PathLike[str]) -> Path | None:
        if os.fspath(resume_from) != "latest":
            return Path(resume_from)
        save_dirs = [
            getattr(callback, "save_dir")  # noqa: B009 (any callback that saves training states)
            for callback in self.callback_handler.callbacks
            if getattr(callback, "saves_training_states", False)
        ]
        if not save_dirs:
            fail(
                ValueError,
                "Trainer.train",
                "resume_from",
                "latest",
                "a directory, or 'latest' with a SaveTrainingStateCallback",
                "Add SaveTrainingStateCallback(save_dir=...) (its save_dir is searched), or pass "
                "the directory of a training state.",
            )
        latest = latest_training_state(save_dirs[0])
        if latest is None:
            self.print(f"No training state in {str(save_dirs[0])!r} yet: starting afresh.")
        return latest

    def _read_saved_trainer_state(self, directory: Path, where: str) -> dict[str, Any]:
        """Read (safely) the trainer state accelerate is about to load for this trainer."""
        registered = list(getattr(self._accelerator, "_custom_objects", []))
        index = next(i for i, obj in enumerate(registered) if obj is self._checkpointed_state)
        shared = load_pickled(directory / f"custom_checkpoint_{index}.pkl", where)
        if not isinstance(shared, dict) or "position" not in shared:
            raise TrainingStateError(f"{where}: {str(directory)!r} holds no trainer state.")
        return shared

    def _check_resumable(self, directory: Path, shared: Mapping[str, Any]) -> None:
        """Raise if the saved run cannot continue as this ``train()`` call is set up."""
        assert self.run_config is not None
        position = Position.from_dict(shared["position"])
        saved_scheduler = shared["scheduler"] is not None
        if saved_scheduler != (self.scheduler is not None):
            fail(
                TrainingStateError,
                "Trainer.train",
                "create_scheduler_fn",
                self.create_scheduler_fn,
                "the same scheduler as the saved run" if saved_scheduler else "None, as saved",
                f"{str(directory)!r} was saved {'with' if saved_scheduler else 'without'} a "
                "scheduler; resume with the same create_scheduler_fn.",
            )
        if position.batches_done == 0:
            return
        now = _resume_relevant(self.run_config)
        for name, saved in shared["run"].items():
            if now.get(name) != saved:
                fail(
                    TrainingStateError,
                    "Trainer.train",
                    name,
                    now.get(name),
                    f"{saved}, as in the saved run (it stopped mid-epoch)",
                    f"Resume {str(directory)!r} with the same train() arguments and dataset.",
                )
        if self._resumable is None:
            raise TrainingStateError(
                f"Trainer.train: {str(directory)!r} was saved mid-epoch, but this train "
                "dataloader cannot resume mid-epoch."
            )

    # ------------------------------------------------------------------------- the loop

    def _run_training(self) -> None:
        self._run_level(_TRAINING_RUN, self._train_epochs)

    def _train_epochs(self) -> None:
        assert self.run_config is not None
        resume = self._resume
        first_epoch = 0 if resume is None else resume.position.epoch_index
        if resume is not None and resume.position.batches_done == 0:
            restore_callback_states(self.callback_handler, resume.callbacks, resume.directory)
        try:
            for epoch_index in range(first_epoch, self.run_config.num_epochs):
                self._epoch_index = epoch_index
                self._train_epoch()
        finally:
            self._savable, self._finished_epochs = "end", self.run_config.num_epochs

    def _train_epoch(self) -> None:
        self._train_loss_tracker.reset()
        self._train_progress = self._progress_events("on_train_progress")
        self._run_level(_TRAIN_EPOCH, self._train_batches, finish=self._finish_train_epoch)
        if self._eval_dataloader is not None:
            self._run_eval_epoch("eval_loss_epoch")
        self._savable = "epoch"
        try:
            self._fire("training_run_epoch_end", "on_training_run_epoch_end", {})
        finally:  # the epoch is complete even if its last event asks to stop
            self._savable = None
            self.run_history._increment_epoch()

    def _train_batches(self) -> None:
        assert self._train_dataloader is not None
        assert self.run_config is not None
        plan = AccumulationPlan(
            self.run_config.train_dataloader_len, self.run_config.gradient_accumulation_steps
        )
        total_updates = self.run_config.total_num_update_steps
        start, random_state_at_save = self._begin_epoch()
        progress = self._train_progress
        progress.start_at(start)
        if self._num_updates >= total_updates:  # resumed from the run's last update
            if random_state_at_save is not None:
                torch.set_rng_state(random_state_at_save)
            return
        limit = self.limit_train_batches
        limit = None if limit is None else max(0, limit - start)
        try:
            with epoch_batches(self._train_dataloader, limit) as batches:
                if random_state_at_save is not None:
                    batches = _restoring_after_first(batches, random_state_at_save)
                run_level, train_step = self._run_level, self._train_step  # bound once
                handler = self.callback_handler
                for step, batch in enumerate(batches, start):
                    self._savable = None
                    if handler.active_events.isdisjoint(_TRAIN_STEP_EVENTS):
                        train_step(plan, batch, step)  # nothing to fire around it
                    else:
                        run_level(_TRAIN_STEP, train_step, (plan, batch, step))
                    if step >= progress.next_step:
                        self._savable = None  # processes report at different steps
                        progress.report()
                    if self._num_updates >= total_updates:
                        return
        finally:
            self._savable = None
            if self._resumable is not None:
                self._resumable.skip.skip_batches = 0

    def _begin_epoch(self) -> tuple[int, torch.Tensor | None]:
        """Apply a pending resume at the start of an epoch.

        Returns:
            The batches of this epoch to skip, and the random state to set once the first
            remaining batch is loaded (mid-epoch resumes only).
        """
        resume, self._resume = self._resume, None
        resumable = self._resumable
        if resume is None:
            return 0, None
        loader_state = resume.rank_state["loader"]
        if resumable is not None:
            resumable.dataloader.iteration = loader_state["iteration"]
        if resume.position.batches_done == 0:
            self._prime_epoch_randomness(resume)
            return 0, None
        assert resumable is not None
        restore_callback_states(self.callback_handler, resume.callbacks, resume.directory)
        self._train_loss_tracker.load_state_dict(resume.rank_state["loss_tracker"], self.device)
        restore_gradients(self.model, resume.rank_state["gradients"])
        resumable.randomness.replay = resume.epoch_states
        resumable.skip.skip_batches = resume.position.batches_done
        return resume.position.batches_done, resume.random_states.cpu

    def _prime_epoch_randomness(self, resume: ResumePoint) -> None:
        """Set the random states an epoch resumed at its start draws its order from.

        A saved run's next epoch reused its dataloader iterator if the workers persist (the
        order is then drawn from the state at the save); a resumed run always starts a new
        one, which first draws the workers' base seed, so the draw is replayed.
        """
        resumable = self._resumable
        if resumable is None:
            torch.set_rng_state(resume.random_states.cpu)
            return
        resumable.randomness.apply(resume.random_states)
        loader = resumable.dataloader
        if resume.position.in_run and loader.num_workers > 0 and loader.persistent_workers:
            resumable.randomness.replay = resume.random_states

    def _train_step(self, plan: AccumulationPlan, batch: Any, step: int) -> dict[str, Any]:
        scale = 1.0 if plan.steps == 1 else plan.loss_scale(step)
        if plan.steps == 1 or plan.is_update(step):
            batch_output = self._forward_backward(batch, scale)
            self._update()
        else:  # inside an accumulation window: no gradient synchronisation between processes
            with self._accelerator.no_sync(self.model):
                batch_output = self._forward_backward(batch, scale)
        self._train_progress.done = step + 1  # the steps done, for saves and progress
        self._savable = "step"
        return {"batch": batch, "batch_output": batch_output, "step": step}

    def _forward_backward(self, batch: Any, scale: float) -> dict[str, Any]:
        """Compute the batch's loss, track it, and back-propagate it scaled by ``scale``."""
        batch_output = _checked(
            self.calculate_train_batch_loss(batch), "calculate_train_batch_loss"
        )
        loss = batch_output["loss"]
        self._train_loss_tracker.update(loss, batch_output["batch_size"])
        handler = self.callback_handler  # an event nobody listens to costs one set look-up
        if "on_backward_start" in handler.active_events:
            self._fire(None, "on_backward_start", {})
        self.backward_step(loss if scale == 1.0 else loss * scale)
        if "on_backward_end" in handler.active_events:
            self._fire(None, "on_backward_end", {})
        return batch_output

    def _update(self) -> None:
        config = self.run_config
        assert config is not None
        if config.gradient_clip_value is not None:
            self._accelerator.clip_grad_value_(self.model.parameters(), config.gradient_clip_value)
        elif config.max_grad_norm is not None:
            parameters = self.model.parameters()
            self._grad_norm = self._accelerator.clip_grad_norm_(parameters, config.max_grad_norm)
        handler = self.callback_handler  # an event nobody listens to costs one set look-up
        if "on_optimizer_step_start" in handler.active_events:
            self._fire(None, "on_optimizer_step_start", {})
        self.optimizer_step()
        self._num_updates += 1
        if "on_optimizer_step_end" in handler.active_events:
            self._fire(None, "on_optimizer_step_end", {})
        if self.scheduler is not None and not self._step_was_skipped():
            self.scheduler_step()
        self.optimizer_zero_grad()

    def _step_was_skipped(self) -> bool:
        """Whether the gradient scaler skipped the update (only possible through the wrapper)."""
        return self._direct_optimizer is None and bool(self._accelerator.optimizer_step_was_skipped)

    def run_eval_epoch(
        self, metric_name: str = "intermediate_eval_loss", is_intermediate: bool = True
    ) -> None:
        """Run one evaluation epoch of the current run's eval set, from inside ``train()``.

        For callbacks that evaluate between epochs (every N updates, or the EMA weights). The
        eval events fire with ``is_intermediate``; the loss is recorded as ``metric_name`` (with
        the run history's prefix); the training loss of the epoch in progress is not touched,
        and the model is put back in train mode if it was in it. Every process must call it.

        Args:
            metric_name: The run-history name of the epoch's mean loss.
            is_intermediate: Passed to the eval epoch events.

        Raises:
            ValueError: If the current run has no eval set.
        """
        if self._eval_dataloader is None:
            fail(
                ValueError,
                "Trainer.run_eval_epoch",
                "eval_dataset",
                None,
                "a dataset",
                "Pass train(..., eval_dataset=...) to evaluate during training.",
            )
        was_training = self.model.training
        try:
            self._run_eval_epoch(metric_name, is_intermediate)
        finally:
            self.model.train(was_training)

    def _run_eval_epoch(self, metric_name: str, is_intermediate: bool = False) -> None:
        """Run an eval epoch; it neither draws from the training's random state nor saves.

        Evaluating (an eval set, or evaluating more often) never changes the training's
        random draws, so a resumed run, whose eval iterators start afresh, draws the same.
        """
        self._eval_loss_tracker.reset()
        savable, self._savable = self._savable, None
        try:
            with torch.no_grad(), training_rng_preserved(self):
                self._eval_progress = self._progress_events("on_eval_progress")
                self._run_level(
                    _EVAL_EPOCH,
                    self._eval_batches,
                    finish=functools.partial(self._finish_eval_epoch, metric_name),
                    is_intermediate=is_intermediate,
                )
        finally:
            self._savable = savable

    def _eval_batches(self) -> None:
        assert self._eval_dataloader is not None
        progress = self._eval_progress
        with epoch_batches(self._eval_dataloader, self.limit_eval_batches) as batches:
            run_level, eval_step = self._run_level, self._eval_step  # bound once
            handler = self.callback_handler
            for index, batch in enumerate(batches):
                if handler.active_events.isdisjoint(_EVAL_STEP_EVENTS):
                    eval_step(batch)  # nothing to fire around it
                else:
                    run_level(_EVAL_STEP, eval_step, (batch,))
                if index >= progress.next_step:
                    progress.report()

    def _eval_step(self, batch: Any) -> dict[str, Any]:
        batch_output = _checked(self.calculate_eval_batch_loss(batch), "calculate_eval_batch_loss")
        real_samples = self._real_samples_in_padded_batch(batch_output["batch_size"])
        if real_samples is None:
            self._eval_loss_tracker.update(batch_output["loss"], batch_output["batch_size"])
        elif real_samples > 0:
            real_batch = slice_tensors(batch, slice(0, real_samples))
            real_output = _checked(
                self.calculate_eval_batch_loss(real_batch), "calculate_eval_batch_loss"
            )
            self._eval_loss_tracker.update(real_output["loss"], real_samples)
        self._eval_progress.done += 1
        return {"batch": batch, "batch_output": batch_output}

    def _real_samples_in_padded_batch(self, batch_size: Any) -> int | None:
        """Return how many samples of this batch are real, if accelerate padded it; else None.

        With several processes, accelerate completes the last round of eval batches with
        samples from the start of the dataset, so every process has as many batches (no
        collective can deadlock). Those repeats are the ones ``gather_for_metrics`` drops:
        the first ``remainder`` samples of the gathered last batch are real, in process order.
        """
        dataloader = self._eval_dataloader
        at_end = getattr(dataloader, "end_of_dataloader", False)
        if self._accelerator.num_processes == 1 or not at_end:
            return None
        remainder = int(getattr(dataloader, "remainder", -1))
        if remainder <= 0:
            return None
        size, rank = int(batch_size), int(self._accelerator.process_index)
        return max(0, min(size, remainder - rank * size))

    def _finish_train_epoch(self) -> None:
        """Report the epoch's last progress, then record its mean loss."""
        self._train_progress.finish()
        self._record_loss(self._train_loss_tracker, "train_loss_epoch")

    def _finish_eval_epoch(self, metric_name: str) -> None:
        """Report the evaluation epoch's last progress, then record its mean loss."""
        self._eval_progress.finish()
        self._record_loss(self._eval_loss_tracker, metric_name)

    def _record_loss(self, tracker: LossTracker, metric_name: str) -> None:
        self.run_history.update_metric(metric_name, tracker.reduce(self._accelerator))

    def _progress_events(self, event: str) -> ProgressEvents:
        """Fire ``event`` for one epoch, as often as ``progress_interval`` says."""
        return ProgressEvents(self.callback_handler, self, event, self.progress_interval)

    # ----------------------------------------------------------------- levels and events

    def _run_level(
        self,
        level: _Level,
        body: Callable[..., dict[str, Any] | None],
        args: tuple[Any, ...] = (),
        finish: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Fire ``level``'s start, run ``body(*args)``, then ``finish`` and the level's end.

        ``body`` may return extra keyword arguments for the end event. On a
        ``StopTrainingError`` the level acts as its ``on_stop`` says.
        """
        try:
            self._fire(level.start_hook, level.start_event, kwargs)
            end_kwargs = body(*args) or {}
        except StopTrainingError as error:
            if level.on_stop == "propagate":
                raise
            if finish is not None:
                finish()
            if level.on_stop == "handle":
                self._announce_stop(error)
            self._fire_while_stopping(level.end_hook, level.end_event, kwargs)
            if level.on_stop == "close":
                raise
            return
        if finish is not None:
            finish()
        kwargs.update(end_kwargs)
        self._fire(level.end_hook, level.end_event, kwargs)

    def _fire(self, hook: str | None, event: str, kwargs: dict[str, Any]) -> None:
        """Run the hook ``hook`` (if any), then the callbacks of ``event``; stop if one asked.

        The hook and every callback get the event even when one of them asks to stop. With
        several processes, a stop is agreed on by all of them before anyone moves on, so they
        all stop at the same point and no collective is left waiting; a stop that was already
        agreed on in a nested event (an evaluation run by a callback) goes on unwinding at once.
        """
        handler = self.callback_handler
        if hook is not None:
            stop = self._dispatch(hook, event, kwargs)
        elif event in handler.active_events:
            stop = handler.dispatch(event, (self,), kwargs)
        else:
            return  # nothing runs, so there is no stop to agree on either
        agreement = self._stop_agreement
        if agreement is None or (stop is not None and agreement.agreed(stop)):
            if stop is not None:
                raise stop
            return
        if stop is not None:
            agreement.request(stop)
        if hook is not None or handler.may_stop(event):
            agreement.agree()

    def _dispatch(
        self, hook: str | None, event: str, kwargs: dict[str, Any]
    ) -> StopTrainingError | None:
        """Run the hook and the callbacks of ``event``; return the first stop they raised."""
        stop = None
        if hook is not None:
            try:
                getattr(self, hook)()
            except StopTrainingError as error:
                stop = error
        callback_stop = self.callback_handler.dispatch(event, (self,), kwargs)
        return stop or callback_stop

    def _fire_while_stopping(self, hook: str | None, event: str, kwargs: dict[str, Any]) -> None:
        """Close a level during a stop: every callback gets the event, further stops are moot.

        All processes unwind the same levels in step, so no agreement is needed here.
        """
        self._dispatch(hook, event, kwargs)

    def _announce_stop(self, error: StopTrainingError) -> None:
        if str(error):
            self.print(str(error))
        self.callback_handler.call_event_while_stopping("on_stop_training_error", self, error=error)

    # ---------------------------------------------------------------------- preparation

    def _default_dl_kwargs(self, dataset: Any, batch_size: int, shuffle: bool) -> dict[str, Any]:
        kwargs = default_dataloader_kwargs(
            dataset,
            batch_size,
            shuffle=shuffle,
            num_local_processes=_num_local_processes(self._accelerator),
            device=self.device,
        )
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        return kwargs

    def _check_enough_samples(self, train_dl: DataLoader[Any]) -> None:
        batch_size = train_dl.batch_size
        num_processes = self._accelerator.num_processes
        num_samples = len(self.train_dataset)
        if batch_size is not None and num_samples < batch_size * num_processes:
            fail(
                ValueError,
                "Trainer.train",
                "train_dataset",
                f"<{num_samples} samples>",
                f"at least one batch per process ({batch_size} x {num_processes} processes)",
                f"Lower per_device_batch_size to at most {max(1, num_samples // num_processes)}.",
            )

    def _check_has_batches(self) -> None:
        if self._train_dataloader is not None and len(self._train_dataloader) == 0:
            fail(
                ValueError,
                "Trainer.train",
                "train_dataloader_kwargs",
                self._train_dl_kwargs,
                "settings that give at least one batch per process",
                "Check batch_sampler, drop_last and the batch size against the dataset size.",
            )

    def _prepare(self, train_dl: DataLoader[Any] | None, eval_dl: DataLoader[Any] | None) -> None:
        """Prepare the model and optimizer (once each) and this run's dataloaders."""
        self._prepare_model_and_optimizer()
        _forget_dataloaders(self._accelerator, self._train_dataloader, self._eval_dataloader)
        self._resumable = None
        self._train_dataloader = (
            None if train_dl is None else self._prepare_train_dataloader(train_dl)
        )
        self._eval_dataloader = None if eval_dl is None else self._prepare_dataloader(eval_dl)

    def _prepare_train_dataloader(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        """Prepare the train dataloader as one that can resume mid-epoch, where accelerate can."""
        prepared = self._prepare_dataloader(dataloader)
        self._resumable = make_resumable(prepared)
        if self._resumable is None:
            return prepared
        registered = getattr(self._accelerator, "_dataloaders", None)
        if isinstance(registered, list):  # accelerate's save_state looks at the loaders it knows
            registered[:] = [
                self._resumable.dataloader if dl is prepared else dl for dl in registered
            ]
        return self._resumable.dataloader  # type: ignore[no-any-return]

    def _prepare_model_and_optimizer(self) -> None:
        """Prepare the model and the optimizer, each once (again if parameters were unfrozen)."""
        accelerator = self._accelerator
        model_ready = self.model is self._prepared[0] and not self._trainable_set_changed()
        optimizer_ready = self.optimizer is self._prepared[1]
        if not model_ready and not optimizer_ready:
            model = _forget_model(accelerator, self.model)
            self.model, self.optimizer = accelerator.prepare(model, self.optimizer)
        elif not model_ready:
            self.model = accelerator.prepare(_forget_model(accelerator, self.model))
        elif not optimizer_ready:
            self.optimizer = accelerator.prepare(self.optimizer)
        self._prepared = (self.model, self.optimizer)
        self._direct_optimizer = _direct_optimizer(accelerator, self.optimizer)
        self._trainable_when_wrapped = _trainable_flags(self.model)

    def _prepare_dataloader(self, dataloader: DataLoader[Any]) -> DataLoader[Any]:
        """Shard the dataloader across processes; move batches only if the device is not the CPU.

        Placing CPU batches on the CPU is a no-op that costs accelerate about 10 µs per batch.
        """
        placement = self._accelerator.device.type != "cpu"
        return self._accelerator.prepare_data_loader(dataloader, device_placement=placement)  # type: ignore[no-any-return]

    def _trainable_set_changed(self) -> bool:
        """Whether parameters were (un)frozen since the model was wrapped for distribution.

        DistributedDataParallel only synchronises the parameters that required gradients when
        it was built, so a model unfrozen between ``train()`` calls must be wrapped again.
        """
        wrapped = self._prepared[0]
        if not isinstance(wrapped, nn.parallel.DistributedDataParallel):
            return False
        return _trainable_flags(wrapped) != self._trainable_when_wrapped

    def _check_loss_func(self, where: str, steps: tuple[str, ...]) -> None:
        """Reject ``loss_func=None`` if one of ``steps`` is the default, which calls it."""
        defaults = [step for step in steps if getattr(type(self), step) is getattr(Trainer, step)]
        if self.loss_func is None and defaults:
            one = len(defaults) == 1
            names = " and ".join(defaults)
            fail(
                TypeError,
                where,
                "Trainer's loss_func",
                None,
                f"a callable while {names} {'is' if one else 'are'} not overridden",
                f"Pass a loss function to Trainer(...), or override {'that' if one else 'those'} "
                f"step method{'' if one else 's'}.",
            )

    def _check_progress_interval(self, where: str) -> None:
        """Reject a ``progress_interval`` that is not a number of seconds >= 0."""
        check_non_negative_number(
            where,
            "trainer.progress_interval",
            self.progress_interval,
            "Set trainer.progress_interval to seconds, e.g. 0.05, or 0 for every step.",
        )

    def _create_run_config(
        self,
        num_epochs: int,
        gradient_accumulation_steps: int = 1,
        max_num_train_steps: int | None = None,
        gradient_clip_value: float | None = None,
        max_grad_norm: float | None = None,
    ) -> TrainerRunConfig:
        accelerator = self._accelerator
        train_len = 0 if self._train_dataloader is None else len(self._train_dataloader)
        if self.limit_train_batches is not None:
            train_len = min(train_len, self.limit_train_batches)
        updates_per_epoch = math.ceil(train_len / gradient_accumulation_steps)
        total_updates = updates_per_epoch * num_epochs
        if max_num_train_steps is not None:
            total_updates = min(total_updates, max_num_train_steps)
            num_epochs = math.ceil(total_updates / updates_per_epoch)
        train_batch = self._train_dl_kwargs.get("batch_size") or 0
        eval_batch = self._eval_dl_kwargs.get("batch_size") or train_batch
        return TrainerRunConfig(
            num_epochs=num_epochs,
            train_per_device_batch_size=train_batch,
            train_dl_kwargs=dict(self._train_dl_kwargs),
            eval_per_device_batch_size=eval_batch,
            eval_dl_kwargs=dict(self._eval_dl_kwargs),
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_clip_value=gradient_clip_value,
            max_grad_norm=max_grad_norm,
            train_total_batch_size=train_batch
            * accelerator.num_processes
            * gradient_accumulation_steps,
            eval_total_batch_size=eval_batch * accelerator.num_processes,
            num_update_steps_per_epoch=updates_per_epoch,
            num_local_update_steps_per_epoch=updates_per_epoch,
            total_num_update_steps=total_updates,
            train_dataloader_len=train_len,
            max_num_train_steps=max_num_train_steps,
            is_local_process_zero=accelerator.is_local_main_process,
            is_world_process_zero=accelerator.is_main_process,
            is_distributed=accelerator.distributed_type != DistributedType.NO,
            mixed_precision=str(accelerator.mixed_precision),
            num_processes=accelerator.num_processes,
        )


# ------------------------------------------------------------------------ module helpers


def _num_local_processes(accelerator: Accelerator) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))


def _forget_dataloaders(accelerator: Accelerator, *dataloaders: object) -> None:
    """Drop a finished run's dataloaders from the accelerator, so repeated runs do not leak.

    accelerate keeps every prepared dataloader in ``_dataloaders`` (for ``save_state``);
    only the current run's belong there.
    """
    registered = getattr(accelerator, "_dataloaders", None)
    if isinstance(registered, list):
        registered[:] = [dl for dl in registered if all(dl is not old for old in dataloaders)]


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


def _restoring_after_first(
    batches: Iterator[Any], random_state: torch.Tensor
) -> Generator[Any, None, None]:
    """Yield ``batches``, setting the CPU random state once the first one is loaded (or none is).

    Creating a dataloader iterator draws from the random state; a run resumed mid-epoch must
    continue from the state at its save, after its new iterator exists.
    """
    first = next(batches, _NO_BATCH)
    torch.set_rng_state(random_state)
    if first is not _NO_BATCH:
        yield first
        yield from batches


_NO_BATCH = object()

_LOSS_STEPS = ("calculate_train_batch_loss", "calculate_eval_batch_loss")
"""The step methods whose default implementations call ``loss_func``."""


def _is_limit_callback(callback: CallbackLike) -> bool:
    kind = callback if isinstance(callback, type) else type(callback)
    return issubclass(kind, LimitBatchesCallback)


def _trainable_flags(model: nn.Module) -> tuple[bool, ...]:
    return tuple(parameter.requires_grad for parameter in model.parameters())


def _forget_model(accelerator: Accelerator, model: nn.Module) -> nn.Module:
    """Unregister a wrapped model from the accelerator and return the bare module to re-wrap."""
    registered = getattr(accelerator, "_models", None)
    if isinstance(registered, list):
        registered[:] = [known for known in registered if known is not model]
    return accelerator.unwrap_model(model)  # type: ignore[no-any-return]


def _checked(batch_output: Any, method: str) -> dict[str, Any]:
    """Return ``batch_output`` if it is a dict with ``loss`` and ``batch_size``; else raise."""
    if type(batch_output) is dict and "loss" in batch_output and "batch_size" in batch_output:
        return batch_output
    if not isinstance(batch_output, Mapping):
        raise TypeError(
            f"Trainer.{method} must return a dict with keys 'loss', 'model_outputs' and "
            f"'batch_size', got {type(batch_output).__name__}. Return e.g. "
            "{'loss': loss, 'model_outputs': outputs, 'batch_size': targets.size(0)}."
        )
    missing = [key for key in ("loss", "batch_size") if key not in batch_output]
    if missing:
        raise ValueError(
            f"Trainer.{method} returned a dict without {missing} (keys: {sorted(batch_output)}). "
            "Return e.g. {'loss': loss, 'model_outputs': outputs, 'batch_size': targets.size(0)}."
        )
    return batch_output  # type: ignore[return-value]


def _check_constructor_arguments(
    model: object, loss_func: object, optimizer: object, run_history: object
) -> None:
    where = "Trainer"
    if not isinstance(model, nn.Module):
        fail(TypeError, where, "model", model, "a torch.nn.Module", "Pass your model instance.")
    check_callable(where, "loss_func", loss_func, "Pass e.g. torch.nn.CrossEntropyLoss().")
    if not isinstance(optimizer, torch.optim.Optimizer):
        fail(
            TypeError,
            where,
            "optimizer",
            optimizer,
            "a torch.optim.Optimizer",
            "Pass e.g. torch.optim.AdamW(model.parameters(), lr=1e-3).",
        )
    if run_history is not None and not isinstance(run_history, RunHistory):
        fail(
            TypeError,
            where,
            "run_history",
            run_history,
            "a RunHistory or None",
            "Pass e.g. InMemoryRunHistory(), or leave it out.",
        )


def _check_accelerator(accelerator: Accelerator) -> None:
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


def _check_train_arguments(arguments: Mapping[str, Any]) -> None:
    where = "Trainer.train"
    check_sized_dataset(where, "train_dataset", arguments["train_dataset"])
    if arguments["eval_dataset"] is not None:
        check_sized_dataset(where, "eval_dataset", arguments["eval_dataset"])
    for name in ("num_epochs", "per_device_batch_size", "gradient_accumulation_steps"):
        check_positive_int(where, name, arguments[name])
    check_positive_int(
        where, "max_num_train_steps", arguments["max_num_train_steps"], allow_none=True
    )
    for name in ("gradient_clip_value", "max_grad_norm"):
        check_positive_number(where, name, arguments[name], allow_none=True)
    if arguments["gradient_clip_value"] is not None and arguments["max_grad_norm"] is not None:
        fail(
            ValueError,
            where,
            "max_grad_norm",
            arguments["max_grad_norm"],
            "None when gradient_clip_value is set",
            "Clip either by value (gradient_clip_value) or by norm (max_grad_norm), not both.",
        )
    check_callable(
        where,
        "create_scheduler_fn",
        arguments["create_scheduler_fn"],
        "Pass a function optimizer -> scheduler, e.g. functools.partial(StepLR, step_size=10).",
    )
    check_callable(where, "collate_fn", arguments["collate_fn"], "Pass a function or None.")
    for name in ("train_dataloader_kwargs", "eval_dataloader_kwargs"):
        check_mapping(where, name, arguments[name])


def _resume_relevant(config: TrainerRunConfig) -> dict[str, Any]:
    """The run settings a mid-epoch resume needs unchanged to see the same batches."""
    return {
        "train_dataloader_len": config.train_dataloader_len,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "train_per_device_batch_size": config.train_per_device_batch_size,
        "num_processes": config.num_processes,
    }


def _check_saved_states_load_safely(directory: Path) -> None:
    """Raise if a trainer or callback state just saved could not be loaded with weights_only."""
    for path in sorted(directory.glob("custom_checkpoint_*.pkl")):
        try:
            load_pickled(path, "Trainer.save_training_state")
        except TrainingStateError as error:
            raise TypeError(
                "Trainer.save_training_state: the trainer state (scheduler, run history or a "
                "callback's state_dict) holds objects that cannot be loaded safely; keep "
                f"state_dicts to tensors, numbers, strings and containers. {error}"
            ) from error


def _check_model_fits(model: nn.Module, directory: Path, where: str) -> None:
    """Compare the saved parameter names and shapes with the model's, before loading."""
    path = directory / "model.safetensors"
    if not path.is_file():
        return
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            saved = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    except Exception as error:
        raise TrainingStateError(f"{where}: could not read {str(path)!r}: {error}") from error
    current = {_plain_key(key): tensor for key, tensor in model.state_dict().items()}
    saved = {_plain_key(key): shape for key, shape in saved.items()}
    present = {tensor.data_ptr() for key, tensor in current.items() if key in saved}
    problems = [f"unexpected {key}" for key in sorted(set(saved) - set(current))]
    problems += [
        f"missing {key}"
        for key in sorted(set(current) - set(saved))
        if current[key].data_ptr() not in present  # tied weights are saved once
    ]
    problems += [
        f"{key}: saved {list(saved[key])}, model {list(current[key].shape)}"
        for key in sorted(set(saved) & set(current))
        if saved[key] != tuple(current[key].shape)
    ]
    if problems:
        raise TrainingStateError(
            f"{where}: {str(path)!r} holds a different model: {'; '.join(problems[:8])}"
            f"{' ...' if len(problems) > 8 else ''}. Resume with the model it was saved from."
        )


def _plain_key(key: str) -> str:
    """A state-dict key without the DDP (``module.``) and ``torch.compile`` prefixes."""
    return key.removeprefix("module.").replace("_orig_mod.", "")
