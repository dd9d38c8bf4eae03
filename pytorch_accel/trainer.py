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

import contextlib
import functools
import itertools
import math
import os
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, slice_tensors
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel._validation import (
    check_callable,
    check_mapping,
    check_positive_int,
    check_positive_number,
    check_sized_dataset,
    fail,
)
from pytorch_accel.accumulation import AccumulationPlan
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
from pytorch_accel.run_config import TrainerRunConfig
from pytorch_accel.tracking import InMemoryRunHistory, LossTracker, RunHistory

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
        """
        _check_train_arguments(locals())
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
        self._run_training()

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
        loss = self._compute_loss(model_outputs, targets)
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.size(0)}

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
            loss = self._compute_loss(model_outputs, targets)
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.size(0)}

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

    # ------------------------------------------------------------------------- the loop

    def _run_training(self) -> None:
        self._run_level(_TRAINING_RUN, self._train_epochs)

    def _train_epochs(self) -> None:
        assert self.run_config is not None
        for _ in range(self.run_config.num_epochs):
            self._train_loss_tracker.reset()
            self._run_level(
                _TRAIN_EPOCH,
                self._train_batches,
                finish=functools.partial(
                    self._record_loss, self._train_loss_tracker, "train_loss_epoch"
                ),
            )
            if self._eval_dataloader is not None:
                self._run_eval_epoch("eval_loss_epoch")
            try:
                self._fire("training_run_epoch_end", "on_training_run_epoch_end", {})
            finally:  # the epoch is complete even if its last event asks to stop
                self.run_history._increment_epoch()

    def _train_batches(self) -> None:
        assert self._train_dataloader is not None
        assert self.run_config is not None
        plan = AccumulationPlan(
            self.run_config.train_dataloader_len, self.run_config.gradient_accumulation_steps
        )
        total_updates = self.run_config.total_num_update_steps
        batches = _iterate(self._train_dataloader, self.limit_train_batches)
        with contextlib.closing(batches):
            for step, batch in enumerate(batches):
                self._run_level(_TRAIN_STEP, functools.partial(self._train_step, plan, batch, step))
                if self._num_updates >= total_updates:
                    return

    def _train_step(self, plan: AccumulationPlan, batch: Any, step: int) -> dict[str, Any]:
        is_update, scale = (
            (True, 1.0) if plan.steps == 1 else (plan.is_update(step), plan.loss_scale(step))
        )
        with _SYNC if is_update else self._accelerator.no_sync(self.model):
            batch_output = _checked(
                self.calculate_train_batch_loss(batch), "calculate_train_batch_loss"
            )
            self._train_loss_tracker.update(batch_output["loss"], batch_output["batch_size"])
            loss = batch_output["loss"] if scale == 1.0 else batch_output["loss"] * scale
            self._fire(None, "on_backward_start", {})
            self.backward_step(loss)
            self._fire(None, "on_backward_end", {})
        if is_update:
            self._update()
        return {"batch": batch, "batch_output": batch_output, "step": step}

    def _update(self) -> None:
        self._clip_gradients()
        self._fire(None, "on_optimizer_step_start", {})
        self.optimizer_step()
        self._num_updates += 1
        self._fire(None, "on_optimizer_step_end", {})
        if self.scheduler is not None and not self._step_was_skipped():
            self.scheduler_step()
        self.optimizer_zero_grad()

    def _step_was_skipped(self) -> bool:
        """Whether the gradient scaler skipped the update (only possible through the wrapper)."""
        return self._direct_optimizer is None and bool(self._accelerator.optimizer_step_was_skipped)

    def _clip_gradients(self) -> None:
        assert self.run_config is not None
        clip_value, max_norm = self.run_config.gradient_clip_value, self.run_config.max_grad_norm
        if clip_value is not None:
            self._accelerator.clip_grad_value_(self.model.parameters(), clip_value)
        elif max_norm is not None:
            self._grad_norm = self._accelerator.clip_grad_norm_(self.model.parameters(), max_norm)

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
        self._eval_loss_tracker.reset()
        with torch.no_grad():
            self._run_level(
                _EVAL_EPOCH,
                self._eval_batches,
                finish=functools.partial(self._record_loss, self._eval_loss_tracker, metric_name),
                is_intermediate=is_intermediate,
            )

    def _eval_batches(self) -> None:
        assert self._eval_dataloader is not None
        batches = _iterate(self._eval_dataloader, self.limit_eval_batches)
        with contextlib.closing(batches):
            for batch in batches:
                self._run_level(_EVAL_STEP, functools.partial(self._eval_step, batch))

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

    def _record_loss(self, tracker: LossTracker, metric_name: str) -> None:
        self.run_history.update_metric(metric_name, tracker.reduce(self._accelerator))

    # ----------------------------------------------------------------- levels and events

    def _run_level(
        self,
        level: _Level,
        body: Callable[[], dict[str, Any] | None],
        finish: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Fire ``level``'s start, run ``body``, then ``finish`` and the level's end.

        ``body`` may return extra keyword arguments for the end event. On a
        ``StopTrainingError`` the level acts as its ``on_stop`` says.
        """
        try:
            self._fire(level.start_hook, level.start_event, kwargs)
            end_kwargs = body() or {}
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
        stop = self._dispatch(hook, event, kwargs)
        agreement = self._stop_agreement
        if agreement is None or (stop is not None and agreement.agreed(stop)):
            if stop is not None:
                raise stop
            return
        if stop is not None:
            agreement.request(stop)
        if hook is not None or self.callback_handler.may_stop(event):
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
        try:
            self.callback_handler.call_event(event, self, **kwargs)
        except StopTrainingError as error:
            stop = stop or error
        return stop

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
        _forget_dataloaders(accelerator, self._train_dataloader, self._eval_dataloader)
        self._train_dataloader = None if train_dl is None else self._prepare_dataloader(train_dl)
        self._eval_dataloader = None if eval_dl is None else self._prepare_dataloader(eval_dl)

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

    def _compute_loss(self, model_outputs: Any, targets: Any) -> torch.Tensor:
        if self.loss_func is None:
            raise TypeError(
                "Trainer: loss_func is None, but the default calculate_*_batch_loss calls it. "
                "Pass a loss function, or override calculate_train_batch_loss and "
                "calculate_eval_batch_loss."
            )
        return self.loss_func(model_outputs, targets)


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


def _iterate(dataloader: Iterable[Any], limit: int | None) -> Generator[Any, None, None]:
    """Yield at most ``limit`` batches, and always release accelerate's record of the loader.

    accelerate only forgets a dataloader it saw to the end; a loop cut short (a batch limit,
    ``max_num_train_steps``, a stop) would otherwise leave it as the active one.
    """
    try:
        yield from dataloader if limit is None else itertools.islice(dataloader, limit)
    finally:
        end = getattr(dataloader, "end", None)
        if callable(end):
            end()


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


_SYNC = contextlib.nullcontext()
"""The context of a micro-batch whose gradients are synchronised: nothing to do."""


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
