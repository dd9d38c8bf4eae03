"""The ``Trainer``: the facade of the training loop, customised by step methods and callbacks.

``docs/architecture.md`` maps the layers below it; its pytorch-accelerated names come from
``pytorch_accel.compat``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel import _entry_checks as checks
from pytorch_accel import _inference_checks as inference_checks
from pytorch_accel._batches import inputs_and_targets
from pytorch_accel._dict_batches import dict_batch_loss, predictions_of
from pytorch_accel._loop import Loop
from pytorch_accel._state import Preparation, TrainerState
from pytorch_accel.callback import CallbackHandler, CallbackLike, announces_exceptions
from pytorch_accel.compat import DefaultCallbacks, warn_assigned_num_updates, with_ported_attributes
from pytorch_accel.compat import trainer_module_attribute as __getattr__  # noqa: F401
from pytorch_accel.dataloaders import merge_dataloader_kwargs
from pytorch_accel.distributed import apply_fsdp_request, create_accelerator
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.failing_batches import SkipFailingBatches
from pytorch_accel.placeholders import (
    TrainerPlaceholderValues,
    check_resolved,
    replace_trainer_placeholder_values,
)
from pytorch_accel.run_config import (
    TrainerRunConfig,
    apply_randomness,
    create_run_config,
)
from pytorch_accel.run_directory import RunDirectory
from pytorch_accel.tracking import (
    InMemoryRunHistory,
    LoggedMetrics,
    LossTracker,
    RunHistory,
)

if TYPE_CHECKING:
    from pytorch_accel._checkpointing.training_state import TrainingStateIO
    from pytorch_accel.tools.lr_finder import LRFinderResult

__all__ = [  # DEFAULT_CALLBACKS and the other ported names: served by __getattr__ (compat)
    "Trainer",
    "TrainerPlaceholderValues",
    "replace_trainer_placeholder_values",
]


@with_ported_attributes
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
        accelerator_kwargs: Arguments of the ``accelerate.Accelerator`` the trainer creates
            (``mixed_precision``, ``kwargs_handlers`` for DDP and the process group, plugins),
            over the trainer's defaults.
        output_dir: The root of the run directories: callbacks' default paths are then under
            ``<output_dir>/<run name>`` (``run_dir``), not the working directory.

    Attributes:
        limit_train_batches: Use at most this many batches of each training epoch (``None``:
            all). Read when ``train()`` starts, so the run config, placeholders and the last
            accumulation window follow it. For quick debug runs; see ``LimitBatchesCallback``.
        limit_eval_batches: Use at most this many batches of each evaluation epoch, read when
            the epoch starts.
        dry_run_dir: During ``train(dry_run=...)``, the temporary directory the dry run writes
            to (``None`` otherwise). Callbacks declare their files with
            ``outputs.RedirectsOutputs``; one that does not may write under it then.
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
        callbacks: Iterable[CallbackLike] = DefaultCallbacks(),
        run_history: RunHistory | None = None,
        *,
        accelerator_kwargs: Mapping[str, Any] | None = None,
        output_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        checks.check_constructor_arguments(
            model, loss_func, optimizer, callbacks, run_history, accelerator_kwargs
        )
        self._accelerator_kwargs = dict(accelerator_kwargs or {})
        self.model = model
        self.loss_func = loss_func
        self.optimizer = optimizer
        self.callback_handler = self._create_callback_handler(callbacks)
        self.run_history: RunHistory = run_history or InMemoryRunHistory()
        self._accelerator = accelerator = self._create_accelerator()
        apply_fsdp_request(self._accelerator, self._accelerator_kwargs.get("fsdp_plugin"))
        checks.check_accelerator(self._accelerator)
        self._run_directory = None if output_dir is None else RunDirectory(output_dir, accelerator)
        self.scheduler: Any = None
        self.create_scheduler_fn: Callable[[torch.optim.Optimizer], Any] | None = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self.run_config: TrainerRunConfig | None = None
        self._train_dl_kwargs: dict[str, Any] = {}
        self._eval_dl_kwargs: dict[str, Any] = {}
        self.limit_train_batches: int | None = None
        self.limit_eval_batches: int | None = None
        self.progress_interval: float = 0.05
        self.dry_run_dir: Path | None = None
        self._state = TrainerState()
        self._assigned_num_updates: int | None = None  # see num_updates
        self._preparation = Preparation(self._accelerator, self._state)
        self._loop = Loop(self, self._state, self._preparation)
        self.callback_handler.call_event("on_init_end", self)

    def _create_callback_handler(self, callbacks: Iterable[CallbackLike]) -> CallbackHandler:
        """Create the ``CallbackHandler`` (with ``PYTORCH_ACCEL_LIMIT_BATCHES``'s callback)."""
        from pytorch_accel.default_callbacks import with_environment_callbacks

        return CallbackHandler(with_environment_callbacks(callbacks), events=self.custom_events)

    def _create_accelerator(self) -> Accelerator:
        """Create the accelerator, once per trainer (see ``distributed.create_accelerator``)."""
        return create_accelerator(self._accelerator_kwargs)

    @property
    def accelerator(self) -> Accelerator:
        """The trainer's ``accelerate.Accelerator``."""
        return self._accelerator

    @property
    def device(self) -> torch.device:
        """The device this process trains on."""
        return self._accelerator.device  # type: ignore[no-any-return]

    @property
    def run_dir(self) -> Path | None:
        """``<output_dir>/<run name>``, where callbacks keep their default files; ``None``: none."""
        return None if self._run_directory is None else self._run_directory.path

    @property
    def train_dataloader(self) -> DataLoader[Any] | None:
        """The prepared train dataloader of the current run (``None`` in ``evaluate()``)."""
        return self._state.train_dataloader

    @property
    def eval_dataloader(self) -> DataLoader[Any] | None:
        """The current run's prepared eval dataloader (of the set being evaluated, or the first)."""
        return self._state.eval_dataloader

    @property
    def eval_dataloaders(self) -> Mapping[str | None, DataLoader[Any]]:
        """The prepared eval dataloaders of the current run, by set name (``None``: unnamed)."""
        return MappingProxyType(self._state.eval_dataloaders)

    @property
    def eval_set(self) -> str | None:
        """The name of the eval set being evaluated (``None``: the unnamed one, or none).

        For the eval step events; the eval epoch events also receive it as ``eval_set``.
        """
        return self._state.eval_set

    @property
    def train_loss_tracker(self) -> LossTracker:
        """The on-device tracker of the current training epoch's loss."""
        return self._state.train_loss_tracker

    @property
    def eval_loss_tracker(self) -> LossTracker:
        """The on-device tracker of the current evaluation epoch's loss."""
        return self._state.eval_loss_tracker

    @property
    def num_updates(self) -> int:
        """Optimizer updates (attempted, on this process) so far in the current ``train()``.

        It counts the update in progress from ``on_optimizer_step_end`` on, so the scheduler
        step of the k-th update sees ``k`` (1-based). Assigning it (as pytorch-accelerated's
        timm examples do) sets what it reads (``None``: the count); the loop keeps counting.
        """
        assigned = self._assigned_num_updates
        return self._state.num_updates if assigned is None else assigned

    @num_updates.setter
    def num_updates(self, value: int | None) -> None:
        if value is not None and self._assigned_num_updates is None:
            warn_assigned_num_updates()
        self._assigned_num_updates = value

    @property
    def global_num_updates(self) -> int:
        """Optimizer updates (on this process) of the whole run: the x-axis of step curves.

        ``num_updates`` plus those of the earlier ``train()`` calls the run continues
        (``reset_run_history=False``); 0 when a call starts a new run. Saved in training states.
        """
        return self._state.updates_before + self._state.num_updates

    @property
    def is_training(self) -> bool:
        """Whether ``train()`` is running (for callbacks that also serve ``evaluate()``)."""
        return self._state.running

    @property
    def stopped_by(self) -> StopTrainingError | None:
        """The ``StopTrainingError`` that ended the last run early (``None``: it ran to its end)."""
        return self._state.stopped_by

    @property
    def resumed_from(self) -> Path | None:
        """The training state the current (or last) ``train()`` resumed from, if any."""
        return self._state.resumed_from

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The total gradient norm of the last update, before clipping, as a device tensor.

        Set when ``train(max_grad_norm=...)`` clips by norm (else ``None``); reading it
        (``.item()``) waits for the device: log it at an interval.
        """
        return self._state.grad_norm

    @property
    def logged_metrics(self) -> LoggedMetrics:
        """What ``log`` logged (step-logging callbacks open their intervals on it)."""
        return self._state.logged

    @announces_exceptions
    @checks.suggest_arguments
    def train(
        self,
        train_dataset: Any,
        num_epochs: int | None = None,
        eval_dataset: Any = None,
        per_device_batch_size: int | None = None,
        max_num_train_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        gradient_clip_value: float | None = None,
        create_scheduler_fn: Callable[[torch.optim.Optimizer], Any] | None = None,
        train_dataloader_kwargs: Mapping[str, Any] | None = None,
        eval_dataloader_kwargs: Mapping[str, Any] | None = None,
        reset_run_history: bool = True,
        collate_fn: Callable[..., Any] | None = None,
        *,
        max_grad_norm: float | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        eval_every_n_epochs: int = 1,
        sanity_eval_batches: int = 0,
        seed: int | None = None,
        seed_per_rank: bool = False,
        deterministic: bool = False,
        cudnn_benchmark: bool | None = None,
        auto_scale_lr: int | None = None,
        resume_optimizer: bool = True,
        resume_scheduler: bool = True,
        skip_failing_batches: int | SkipFailingBatches | None = None,
        on_oom: Literal["raise", "split"] = "raise",
        dry_run: bool | int = False,
        overfit_batches: int | None = None,
        run_name: str | None = None,
    ) -> None:
        """Train for ``num_epochs`` (or ``max_num_train_steps`` updates, whichever ends first).

        The one declaration of the arguments (checks, run config and docs derive from it).

        Args:
            train_dataset: A map-style dataset (with ``__len__``), at least one batch per
                process, or an ``IterableDataset`` ([with ``max_num_train_steps``](
                training-loop.md#runs-counted-in-updates-and-iterabledatasets)); or a
                ``DataLoader`` you built over one (its sampler, batch sampler and collate
                function are kept; accelerate shards it), without ``per_device_batch_size``,
                ``train_dataloader_kwargs`` and ``collate_fn``; or [several training sets](
                trainer.md#several-training-sets) ``{"a": ..., "b": ...}`` mixed by a rule.
            num_epochs: Epochs (passes through the data) to train for in this call; ``None``
                with ``max_num_train_steps``: as many as its updates need ([details](
                training-loop.md#runs-counted-in-updates-and-iterabledatasets)).
            eval_dataset: Evaluated after training epochs: a dataset or a ``DataLoader``, or
                [named eval sets](trainer.md#several-eval-sets) ``{"val": ..., "ood": ...}``.
            per_device_batch_size: Batch size on each process, for datasets (default 8).
            max_num_train_steps: Stop after this many optimizer updates on each process
                ([details](training-loop.md#limiting-the-number-of-updates)); required without
                ``num_epochs``, and for an ``IterableDataset``.
            gradient_accumulation_steps: Micro-batches per optimizer update.
            gradient_clip_value: Clip each gradient element to ``[-value, value]``.
            create_scheduler_fn: ``optimizer -> scheduler``, usually a ``functools.partial``
                with [placeholders](trainer.md#placeholders) (``TrainerPlaceholderValues``).
            train_dataloader_kwargs: Override the train ``DataLoader``'s defaults.
            eval_dataloader_kwargs: Override the eval ``DataLoader``'s [defaults](
                trainer.md#dataloader-defaults), as ``train_dataloader_kwargs`` the train one's.
            reset_run_history: ``False``: continue the run of the earlier calls (metrics, epoch
                and update counts; [details](trainer.md#several-train-calls-stages-of-one-run)).
            collate_fn: The collate function of both dataloaders.
            max_grad_norm: Clip the global gradient norm (not with ``gradient_clip_value``).
            resume_from: A training state's directory, or ``"latest"`` (the newest in
                ``SaveTrainingStateCallback``'s ``save_dir``; none: start afresh), to continue a
                saved run exactly ([resuming a run](checkpointing.md#resuming-a-run)).
            eval_every_n_epochs: Evaluate after every this many epochs, and after the last
                ([details](trainer.md#how-often-to-evaluate-and-the-sanity-evaluation)).
            sanity_eval_batches: Before the first epoch, evaluate this many batches of every
                eval set (every callback too): a broken evaluation fails in seconds. 0: off.
            seed: Seed ``random``, NumPy and torch (all devices) before anything draws
                ([details](run-setup.md#seeding-and-determinism)); recorded in the run config.
            seed_per_rank: Seed each process with ``seed + process_index``.
            deterministic: Use deterministic algorithms (torch, cuDNN, cuBLAS).
            cudnn_benchmark: Set ``torch.backends.cudnn.benchmark``; ``None`` leaves it.
            auto_scale_lr: A base batch size: scale the learning rates by the global batch size
                (processes x per-device batch x accumulation) over it, once per run ([details](
                run-setup.md#scaling-the-learning-rate-to-the-batch-size)).
            resume_optimizer: ``False``: resume without the optimizer's saved state.
            resume_scheduler: ``False``: resume without the scheduler's saved state
                ([selective resume](run-setup.md#selective-resume)).
            skip_failing_batches: Skip training batches whose forward pass runs out of memory,
                or which are empty: up to this many, or as a ``SkipFailingBatches`` says
                ([failing batches](run-setup.md#failing-batches)). ``None``: fail at once.
            on_oom: ``"split"``: a step out of memory runs again in twice as many micro-batches
                of the same total, to the run's end, with the same results ([details](
                tuning-and-diagnosis.md#out-of-memory-more-micro-batches-same-results)).
            dry_run: Check the set-up instead of training: ``True`` (2) or N batches of training
                and evaluation through every callback, a save and a load of the training state,
                callbacks' files in a temporary directory; nothing of yours changes ([dry runs](
                run-setup.md#dry-runs-and-overfitting-a-few-batches)).
            overfit_batches: Train (and evaluate) on the first N batches only, in order.
            run_name: With ``Trainer(output_dir=...)``: the run's directory under it, for this
                call and later ones (default: the trainer's run, or the run holding the newest
                state with ``resume_from="latest"``; [details](
                tuning-and-diagnosis.md#one-output-directory-per-run)).
        """
        arguments = checks.checked_train_arguments(self, Trainer, locals())
        if arguments.dry_run or arguments.overfit_batches is not None:
            from pytorch_accel.tools._dry_run import run_dry_or_overfit

            run_dry_or_overfit(self, arguments)  # train() again, with the run's settings
            return
        if (run_directory := self._run_directory) is not None:
            run_directory.start_training(self.callback_handler.callbacks, run_name, resume_from)
        apply_randomness(arguments, self._accelerator)
        self.create_scheduler_fn, self.collate_fn = create_scheduler_fn, collate_fn
        if reset_run_history:
            self.run_history.reset()
        train_dl, eval_dls = self._preparation.build_dataloaders(self, arguments)
        checks.check_train_dataloader(train_dl, self._accelerator.num_processes)
        with self._preparation.prepared(self, train_dl, eval_dls):
            checks.check_has_batches(
                "Trainer.train",
                self._state,
                train_dataloader_kwargs=self._train_dl_kwargs,
                eval_dataloader_kwargs=self._eval_dl_kwargs,
            )
            self.run_config = self._preparation.training_run_config(self, arguments)
            self._state.eval_batch_size = self.run_config.train_per_device_batch_size or 8
            self.scheduler = self.create_scheduler() if create_scheduler_fn is not None else None
            self._state.start_counting(continue_run=not reset_run_history)
            self.optimizer.zero_grad()  # a stop inside an accumulation window leaves gradients
            load = {"optimizer": resume_optimizer, "scheduler": resume_scheduler}
            resume = None if resume_from is None else self._states.resume_point(resume_from, **load)
            self._loop.train(resume)

    @announces_exceptions
    @checks.suggest_arguments
    def evaluate(
        self,
        dataset: Any = None,
        per_device_batch_size: int | None = None,
        dataloader_kwargs: Mapping[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        *,
        metric_prefix: str = "evaluation_",
        skip_failing_batches: int | SkipFailingBatches | None = None,
    ) -> dict[str, Any]:
        """Evaluate the model once on ``dataset``; return what was recorded, by name.

        Everything recorded meanwhile (the mean loss as ``loss``, and every callback's
        metrics) gets ``metric_prefix``: ``evaluation_loss``, ``evaluation_accuracy``. So an
        evaluation never adds to the series of a training run's validation metrics. Unlike
        pytorch-accelerated, the run history is not reset: earlier metrics are kept.

        Args:
            dataset: A dataset or a ``DataLoader`` you built, or a mapping of set names to
                them (each set's metrics named ``<metric_prefix><name>_...``); defaults to the
                ``eval_dataset`` of the last ``train()``.
            per_device_batch_size: Batch size on each process, for datasets; default: the
                per-device batch size of the last ``train()`` (its dataloader's, if it was
                given one; 8 before any, or for a dataloader without a batch size).
            dataloader_kwargs: Override the ``DataLoader`` arguments.
            collate_fn: The collate function of the dataloader.
            metric_prefix: Prepended to the names of everything recorded (``"test_"``: the
                loss is ``test_loss``).
            skip_failing_batches: As in ``train()``, per eval epoch (``skipped_batches``).

        Returns:
            The latest value of every metric recorded by this evaluation, by its run-history
            name: floats, or lists for metrics with several values.
        """
        dataset = self.eval_dataset if dataset is None else dataset
        arguments = (dataset, per_device_batch_size, dataloader_kwargs, collate_fn, metric_prefix)
        inference_checks.check_evaluate_arguments(self, Trainer, *arguments)
        self.collate_fn, self._train_dl_kwargs, batch_size = collate_fn, {}, per_device_batch_size
        if self._run_directory is not None:
            self._run_directory.place(self.callback_handler.callbacks)
        loaders = self._preparation.build_eval_dataloaders(
            self, dataset, batch_size or self._state.eval_batch_size, dataloader_kwargs
        )
        with self._preparation.prepared(self, None, loaders):
            checks.check_has_batches(
                "Trainer.evaluate", self._state, dataloader_kwargs=self._eval_dl_kwargs
            )
            dl: tuple[dict[str, Any], dict[str, Any]] = ({}, self._eval_dl_kwargs)
            self.run_config = create_run_config(self._accelerator, None, None, dl)  # one epoch
            return self._loop.evaluate(metric_prefix, skip_failing_batches)

    @announces_exceptions
    @checks.suggest_arguments
    def predict(
        self,
        data: Any,
        per_device_batch_size: int | None = None,
        dataloader_kwargs: Mapping[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        *,
        output_device: str | torch.device | None = "cpu",
        keep_outputs: bool = True,
        skip_failing_batches: int | SkipFailingBatches | None = None,
        pad_value: float | None = None,
    ) -> Any:
        """Return the model's outputs for every sample of ``data``, in order, from all processes.

        Each batch goes through ``calculate_predict_batch`` without gradients, in eval mode
        (restored afterwards), and its outputs are gathered from every process without the
        samples accelerate repeats to even out the last batches. Every process must call it,
        and gets the same result. The training's random state is untouched.

        Args:
            data: A map-style dataset, or a ``DataLoader`` you built (not shuffled; accelerate
                shards it across processes).
            per_device_batch_size: Batch size on each process, for a dataset; default: the
                per-device batch size of the last ``train()`` (its dataloader's, if it was
                given one; 8 before any, or for a dataloader without a batch size).
            dataloader_kwargs: Override the ``DataLoader`` arguments, for a dataset.
            collate_fn: The collate function, for a dataset.
            output_device: Where each gathered batch is moved; ``None`` leaves it on the device.
            keep_outputs: Collect and return the outputs. ``False`` returns ``None``, for
                outputs too large to keep: a callback's ``on_predict_step_end`` receives each
                gathered batch (``predictions``) to write out.
            skip_failing_batches: As in ``train()``; the outputs lack the skipped batches,
                whose indices ``run_history`` records as ``predict_skipped_batches``.
            pad_value: Pad outputs of varying lengths along their second (sequence) dimension
                with this value, to the longest over every batch and process (a causal
                language model's ``(batch, length, vocab)`` logits). ``None``: no padding.

        Returns:
            The outputs concatenated on the first dimension (a tensor, or the structure of one
            batch's outputs), or ``None`` with ``keep_outputs=False``. Outputs that cannot be
            concatenated are refused after the first batch (a 0-d tensor, a string), or raise
            ``PredictOutputsError`` after the last, holding every batch's (varying lengths:
            pass ``pad_value``).
        """
        from pytorch_accel import _predictions  # the prediction run: read when predicting

        checks.check_trainer_settings("Trainer.predict", self)
        if pad_value is not None:
            _predictions.check_pad_value(pad_value)
        loader = inference_checks.predict_dataloader(
            data,
            per_device_batch_size,
            dataloader_kwargs,
            collate_fn,
            self._preparation,
            keep_outputs,
            default_batch_size=self._state.eval_batch_size,
        )
        self._preparation.prepare_model_and_optimizer(self)
        with self._preparation.prepared_for_prediction(loader) as prepared:
            return _predictions.predict(
                self._loop, prepared, output_device, keep_outputs, skip_failing_batches, pad_value
            )

    @announces_exceptions
    def find_batch_size(self, train_dataset: Any, **kwargs: Any) -> int:
        """The largest per-device batch size that trains: ``tools.batch_size_search``'s."""
        from pytorch_accel.tools.batch_size_search import find_batch_size

        return find_batch_size(self, train_dataset, **kwargs)

    def create_scheduler(self) -> Any:
        """Create the scheduler from ``create_scheduler_fn``, resolving its placeholders.

        It gets the optimizer ``optimizer_step`` steps; it is not passed through
        ``accelerator.prepare``, which would step it once per process per update.
        """
        factory = replace_trainer_placeholder_values(self, self.create_scheduler_fn)
        optimizer = self._preparation.direct_optimizer or self.optimizer
        scheduler = checks.created_scheduler(factory, optimizer, self.run_config)
        check_resolved(scheduler, "Trainer.create_scheduler")
        return scheduler

    def run_eval_epoch(
        self, metric_name: str = "intermediate_eval_loss", is_intermediate: bool = True
    ) -> None:
        """Run one evaluation epoch of each of the current run's eval sets, inside ``train()``.

        For callbacks that evaluate between epochs (every N updates, or the EMA weights). The
        loss is recorded as ``metric_name`` (with a named set's prefix); the training loss of
        the epoch in progress is not touched, and the model is put back in train mode if it
        was in it. Every process must call it.

        Args:
            metric_name: The run-history name of the epoch's mean loss.
            is_intermediate: Passed to the eval epoch events.

        Raises:
            ValueError: If the current run has no eval set.
        """
        self._loop.run_eval_epoch(metric_name, is_intermediate)

    def _run_train_epoch(self, train_dl: DataLoader[Any] | None) -> bool:
        """Run one training epoch over ``train_dl``: its events, batches, steps and updates.

        Override it (calling ``super()``) as in pytorch-accelerated to wrap an epoch.

        Returns:
            Whether the run's updates (``max_num_train_steps``) are all done.
        """
        return self._loop.train_epoch(train_dl)

    def _run_eval_epoch(
        self, valid_dl: DataLoader[Any], is_training: bool = True, is_intermediate: bool = False
    ) -> None:
        """Run one evaluation epoch over ``valid_dl``: its events, batches and mean loss.

        The loop calls it for each eval set, without gradients, in ``train()`` and
        ``evaluate()``; override it (calling ``super()``) to wrap an eval epoch.

        Args:
            valid_dl: The prepared dataloader of the eval set.
            is_training: Whether it runs inside ``train()`` (``is_training`` tells as well).
            is_intermediate: Passed to the eval epoch events.
        """
        self._loop.eval_epoch(valid_dl, is_intermediate)

    # ---------------------------------------------- step methods, hooks and process utilities

    def training_run_start(self) -> None:
        """Hook at the start of a training run (before ``on_training_run_start``)."""

    def train_epoch_start(self) -> None:
        """Hook at the start of each training epoch: puts the model in train mode."""
        self.model.train()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one training batch.

        Args:
            batch: ``(inputs, targets)``, or a dict of the model's keyword arguments (the
                loss is then the output's ``loss``, or ``loss_func(logits, batch["labels"])``).

        Returns:
            A dict with ``loss`` (the batch's mean loss, un-scaled), ``model_outputs`` and
            ``batch_size``. Gradient accumulation scaling happens in the loop.
        """
        pair = type(batch) is list and len(batch) == 2  # default_collate's (inputs, targets)
        if (not pair and isinstance(batch, Mapping)) or self.loss_func is None:
            return dict_batch_loss(self.model, self.loss_func, batch, "calculate_train_batch_loss")
        inputs, targets = batch if pair else inputs_and_targets(batch, "calculate_train_batch_loss")
        model_outputs = self.model(inputs)
        loss = self.loss_func(model_outputs, targets)
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def backward_step(self, loss: torch.Tensor) -> None:
        """Run the backward pass of an already scaled loss (through ``accelerator.backward``).

        Where ``accelerator.backward`` would only call ``loss.backward()``, that is called.
        """
        if self._preparation.direct_optimizer is None:
            self._accelerator.backward(loss)
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def optimizer_step(self) -> None:
        """Update the parameters (through accelerate's optimizer wrapper).

        Where the wrapper would only forward the call, the inner optimizer is stepped directly,
        which saves most of accelerate's per-step overhead.
        """
        (self._preparation.direct_optimizer or self.optimizer).step()

    def scheduler_step(self) -> None:
        """Step the scheduler: after each update, or each epoch (see ``SchedulerStepping``)."""
        self._state.scheduler_stepping.step(self.scheduler, self.run_history)

    def optimizer_zero_grad(self) -> None:
        """Reset the gradients after an update (to ``None``, as both torch and accelerate do)."""
        (self._preparation.direct_optimizer or self.optimizer).zero_grad()

    def train_epoch_end(self) -> None:
        """Hook at the end of each training epoch (``train_loss_epoch`` is recorded)."""

    def eval_epoch_start(self) -> None:
        """Hook at the start of each evaluation epoch: puts the model in eval mode."""
        self.model.eval()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one evaluation batch, without gradients.

        Args:
            batch: ``(inputs, targets)``, or a dict of the model's keyword arguments (the
                loss is then the output's ``loss``, or ``loss_func(logits, batch["labels"])``).

        Returns:
            A dict with ``loss``, ``model_outputs`` and ``batch_size``.
        """
        with torch.no_grad():
            if isinstance(batch, Mapping) or self.loss_func is None:
                return dict_batch_loss(
                    self.model, self.loss_func, batch, "calculate_eval_batch_loss"
                )
            inputs, targets = inputs_and_targets(batch, "calculate_eval_batch_loss")
            model_outputs = self.model(inputs)
            loss = self.loss_func(model_outputs, targets)
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def calculate_predict_batch(self, batch: Any) -> Any:
        """Return the model's outputs for one batch, for ``predict()``.

        Args:
            batch: ``(inputs, ...)`` (a tuple or list, whose first item is the model's input),
                a dict of the model's keyword arguments, or the inputs themselves.

        Returns:
            The model's outputs (a tensor, or a structure of tensors with the batch first); for
            a dict batch, the output's ``logits`` where it has them.
        """
        if isinstance(batch, Mapping):
            return predictions_of(self.model(**batch))
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(inputs)

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

    def log(self, name: str, value: Any, *, reduce: str = "mean", weight: Any = 1) -> None:
        """Log a metric: kept on the device, reduced across processes once per epoch or interval.

        In a training epoch (a step method or callback) it joins ``train_<name>_epoch`` (run
        history) and ``train_<name>_step`` (step logging); in an eval epoch, ``eval_<name>_epoch``;
        elsewhere it is reduced at once, recorded as ``<name>``. See docs/trackers.md.

        Args:
            name: The metric's name.
            value: A one-element tensor (not read on the host) or a real number.
            reduce: ``"mean"`` (weighted by ``weight``), ``"sum"``, ``"max"`` or ``"min"``,
                over the calls and over the processes (every process must log the same names).
            weight: The value's weight in a mean, e.g. the batch size.
        """
        self._state.logged.log({name: value}, reduce, weight, self.run_history, self.device)

    def log_dict(
        self, metrics: Mapping[str, Any], *, reduce: str = "mean", weight: Any = 1
    ) -> None:
        """Log several metrics at once, as ``log`` does each (one collective between epochs)."""
        logged = self._state.logged
        logged.log(metrics, reduce, weight, self.run_history, self.device, "Trainer.log_dict")

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

        accelerate pads the last batches of an eval set that does not divide evenly with
        repeated samples; this drops them.
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

    @announces_exceptions
    def find_lr(self, train_dataset: Any, **kwargs: Any) -> LRFinderResult:
        """The learning-rate range test: ``tools.lr_finder.find_lr`` (arguments, result)."""
        from pytorch_accel.tools.lr_finder import find_lr

        return find_lr(self, train_dataset, **kwargs)

    # ------------------------------------------------------------------------ dataloaders

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
        """Return the default train ``DataLoader`` arguments (shuffled, unless a stream)."""
        return self._preparation.default_dl_kwargs(
            self.train_dataset, batch_size, shuffle=True, collate_fn=self.collate_fn
        )

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Return the default eval ``DataLoader`` arguments (not shuffled)."""
        return self._preparation.default_dl_kwargs(
            self.eval_dataset, batch_size, shuffle=False, collate_fn=self.collate_fn
        )

    # ------------------------------------------------------ checkpoints and training states

    def save_checkpoint(
        self,
        save_path: str | os.PathLike[str],
        checkpoint_kwargs: Mapping[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
    ) -> None:
        """Write a portable checkpoint file, atomically, from the main process.

        The file holds ``model_state_dict`` (unwrapped model), ``optimizer_state_dict`` and
        ``scheduler_state_dict`` when asked for and present, and ``checkpoint_kwargs``; a
        failed save leaves the previous file intact. Every process must call this; callbacks'
        ``on_save_checkpoint`` may add entries first.

        Args:
            save_path: The file to write (e.g. ``"model.pt"``).
            checkpoint_kwargs: Extra entries (tensors, numbers, strings, containers).
            save_optimizer: Include the optimizer state.
            save_scheduler: Include the scheduler state, if there is a scheduler.
        """
        optimizer = self.optimizer if save_optimizer else None
        scheduler = self.scheduler if save_scheduler else None
        from pytorch_accel._checkpointing.checkpoint import write_checkpoint

        write_checkpoint(self, save_path, optimizer, scheduler, checkpoint_kwargs)

    def save_model(self, directory: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Export the unwrapped model to ``directory``, as the ecosystem loads it back.

        A model with ``save_pretrained`` (``transformers``; PEFT: the adapter only) is written
        by it, for ``from_pretrained``; another module as ``model.safetensors``. Written beside
        ``directory`` and renamed into place by the main process. Every process must call it.
        Details: ``pytorch_accel.export.save_model``.
        """
        from pytorch_accel.export import save_model

        return save_model(self._accelerator, self.model, directory, overwrite=overwrite)

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
            The whole checkpoint dict, with its ``checkpoint_kwargs`` (``on_load_checkpoint``
            sees it first).
        """
        optimizer = self.optimizer if load_optimizer else None
        scheduler = self.scheduler if load_scheduler else None
        from pytorch_accel._checkpointing.checkpoint import restore_checkpoint

        return restore_checkpoint(self, checkpoint_path, optimizer, scheduler)

    @functools.cached_property
    def _states(self) -> TrainingStateIO:
        """Saves and loads this trainer's training states (built at the first save or load)."""
        from pytorch_accel._checkpointing.training_state import TrainingStateIO

        return TrainingStateIO(self, self._preparation, self._state)

    def save_training_state(
        self, output_dir: str | os.PathLike[str], blocking: bool = True
    ) -> Path:
        """Save everything needed to continue this run exactly, atomically, to a directory.

        Model, optimizer (``torch.distributed.checkpoint``), scaler, every process's random states,
        scheduler, run history, counters, position, callbacks' ``state_dict``, and per process
        the running loss, an open accumulation window's gradients and the epoch order's random
        states. A failed or interrupted save leaves ``output_dir`` intact. Every process must
        call this: outside ``train()``, or from ``on_train_step_end`` or
        ``on_training_run_epoch_end``.

        Args:
            output_dir: The directory to write; an existing one is replaced.
            blocking: ``False`` (inside ``train()``): copy the state to host memory, write it
                in the background and publish it at a later step boundary; the next save and
                the run's end wait for it, and its errors are raised there.

        Returns:
            The directory written.

        Raises:
            RuntimeError: If called at another point inside ``train()``.
        """
        return self._states.save(output_dir, blocking)

    def load_training_state(self, input_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore the model, optimizer, scaler, random states, run history and update counts.

        To continue training where the state was saved (scheduler, callbacks, position in the
        epoch included), use ``train(..., resume_from=input_dir)`` instead. Verified first:
        manifest, every file's size and digest, pickled files read with ``weights_only=True``,
        world size, parameter names and shapes. Every process must call this.

        Args:
            input_dir: A directory written by ``save_training_state``.

        Returns:
            The trainer state saved with it (position, counters, callback states).

        Raises:
            FileNotFoundError: If there is no such directory.
            TrainingStateError: If it is incomplete, corrupt or does not fit this trainer.
        """
        return self._states.load(Path(input_dir), "Trainer.load_training_state")[0]
