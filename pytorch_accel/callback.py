"""The callback interface: the base class whose ``on_*`` methods the trainer's events call.

Part of the core. The catalogue of built-in callbacks is the ``pytorch_accel.callbacks``
package, which builds on this class (``pytorch_accel.callbacks.TrainerCallback`` is this one).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["TrainerCallback", "redirected_paths"]


class TrainerCallback:
    """Base class for callbacks: override the ``on_*`` events you need.

    Every method receives the trainer first and keyword arguments after it; accept
    ``**kwargs`` so that new arguments do not break your callback. Use only the trainer's
    public surface (``trainer.model``, ``trainer.run_history``, ``trainer.accelerator``, ...).

    Attributes:
        order: Callbacks run in increasing ``order``; ties keep registration order. Default
            callbacks use -100 (device placement) to 100 (metric logging).
        custom_events: Names of extra events this callback handles or fires, registered with
            the handler when the callback is added.
        may_stop_training: Whether this callback may raise ``StopTrainingError``. In a
            multi-process run the processes agree on stopping after each event that has a
            listener which may stop; callbacks that never stop set this to ``False`` to save
            that exchange.
        agreed_stop_events: Events in which this callback raises ``StopTrainingError`` only
            on every process at once, because it agrees across processes itself (e.g. with
            ``pytorch_accel.distributed.AgreedFlag``). The trainer adds no exchange of its own
            for them, so they cost no collective where nothing else may stop.

    Example:
        ```python
        class PrintLossCallback(TrainerCallback):
            def on_train_epoch_end(self, trainer, **kwargs):
                trainer.print(trainer.run_history.get_latest_metric("train_loss_epoch"))
        ```
    """

    order: ClassVar[int] = 0
    custom_events: ClassVar[tuple[str, ...]] = ()
    may_stop_training: ClassVar[bool] = True
    agreed_stop_events: ClassVar[frozenset[str]] = frozenset()

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write this callback's files under ``directory`` while the returned context is open.

        ``train(dry_run=...)`` enters it for every callback, with a new directory per callback
        under the dry run's temporary one, so a dry run leaves the user's files as they were.
        The default redirects nothing: a callback that writes no files needs nothing. One
        that writes files overrides it, usually with ``redirected_paths``, naming the
        attributes that hold where it writes, and puts them back when the context exits.

        Args:
            directory: An empty directory of this callback's own (it may not exist yet).

        Returns:
            A context manager; its ``__exit__`` puts the callback's own locations back.

        Example:
            ```python
            def redirect_outputs(self, directory):
                return redirected_paths(self, directory, "save_path")
            ```
        """
        return contextlib.nullcontext()

    def training_states_dir(self) -> Path | None:
        """The directory this callback saves training states in, or ``None`` (the default).

        ``train(resume_from="latest")`` resumes from the newest complete state in the directory
        of the first callback that returns one (``SaveTrainingStateCallback`` returns its
        ``save_dir``).
        """
        return None

    def on_init_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of ``Trainer.__init__``."""

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the start of ``train()``, after preparation and scheduler creation."""

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the start of each training epoch, after ``model.train()``."""

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called before each training batch is processed."""

    def on_backward_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called just before the backward pass of each training batch."""

    def on_backward_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called just after the backward pass of each training batch."""

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called before each optimizer update, after gradients were unscaled and clipped."""

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called after each optimizer update, before the scheduler step and ``zero_grad``."""

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Called after each training batch's backward pass and update.

        ``batch`` is as the dataloader produced it, ``batch_output`` the dict returned by
        ``calculate_train_batch_loss``; ``kwargs`` include ``step``, the 0-based batch index.
        """

    def on_train_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        """Called now and then after a training step, and after the epoch's last one.

        For progress displays, which need no per-step event: the trainer fires it at strides
        that follow the step time (see ``Trainer.progress_interval``). Processes fire it at
        different steps, so it must not stop training, call collectives or save state.
        ``steps_done``: the steps of the epoch done so far.
        """

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of each training epoch, after ``train_loss_epoch`` is recorded."""

    def on_eval_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the start of each evaluation epoch (kwarg ``is_intermediate``)."""

    def on_eval_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called before each evaluation batch is processed."""

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Called after each evaluation batch, with ``calculate_eval_batch_loss``'s output."""

    def on_eval_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        """Called now and then after an evaluation step, and after the epoch's last one.

        Like ``on_train_progress``, for the evaluation epoch.
        """

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of each evaluation epoch, after its loss is recorded."""

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called after each completed epoch of a training run (train, then eval if any)."""

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of ``train()``, also when it was stopped early."""

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the start of ``evaluate()``."""

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of ``evaluate()``."""

    def on_predict_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the start of ``predict()``, with the model in eval mode."""

    def on_predict_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called before each prediction batch."""

    def on_predict_step_end(
        self, trainer: Trainer, batch: Any, predictions: Any, **kwargs: Any
    ) -> None:
        """Called after each prediction batch, with its outputs gathered from every process.

        ``batch`` is this process's; ``predictions`` are the batch's outputs from every
        process, in dataset order, without repeated samples, on ``predict()``'s
        ``output_device`` (the same on every process).
        """

    def on_predict_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called at the end of ``predict()``."""

    def on_stop_training_error(self, trainer: Trainer, **kwargs: Any) -> None:
        """Called when a ``StopTrainingError`` stopped the run (kwarg ``error``)."""

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """Called once when an exception escapes ``train()``, ``evaluate()`` or ``predict()``.

        Fired on the process where it was raised, before it propagates, for any ``Exception``
        and for ``KeyboardInterrupt`` (Ctrl-C), not for ``StopTrainingError`` (a normal stop)
        nor ``SystemExit``. The run's end events do not fire then: close what the callback
        holds open here (files, trackers, progress bars). ``kwargs``: ``where``, the entry
        point (``"train"``, ``"evaluate"`` or ``"predict"``). Other processes may not have
        failed, so it must not call collectives; an error it raises is logged, and the
        original exception propagates.
        """


@contextlib.contextmanager
def redirected_paths(owner: object, directory: Path, *names: str) -> Iterator[None]:
    """Point ``owner``'s path attributes ``names`` into ``directory``, then put them back.

    For ``TrainerCallback.redirect_outputs``: each attribute holding a path (a ``str`` or
    ``os.PathLike``; ``None`` is left alone) becomes the same file name in ``directory``, of
    the same type, until the context exits.
    """
    saved = {name: getattr(owner, name) for name in names}
    for name, value in saved.items():
        if isinstance(value, (str, os.PathLike)):
            new = directory / Path(value).name
            setattr(owner, name, new if isinstance(value, Path) else os.fspath(new))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)
