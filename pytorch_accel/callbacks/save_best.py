"""Save the best model of a run (or its k best epochs), and load the best at the end."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._watch import MetricWatch
from pytorch_accel.callbacks.defaults import format_value
from pytorch_accel.checks import check_bool, check_path, check_positive_int, fail
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["SaveBestModelCallback"]

_RESERVED_KEYS = frozenset(
    {"epoch", "model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}
)


class SaveBestModelCallback(TrainerCallback):
    """Checkpoint the model whenever ``watch_metric`` reaches a new best; load the best at the end.

    At each epoch's end (``on_training_run_epoch_end``) it reads the latest value of
    ``watch_metric``; a value strictly better than every earlier one of the run (a tie keeps
    the earlier epoch, NaN is never saved) is saved to ``save_path`` with
    ``trainer.save_checkpoint`` (atomic, written by the main process, so every process takes
    part), with the metric under its own name and the epoch, e.g.
    ``{"model_state_dict": ..., "eval_loss_epoch": 0.12, "epoch": 3}``. At the end of the run
    (also after an early stop) the best checkpoint is loaded, if one was saved. In
    multi-process runs the main process's value decides, so all processes save and load
    together.

    With ``save_top_k=k > 1`` the ``k`` best epochs are also kept as ``<stem>-epoch<N><suffix>``
    next to ``save_path`` (``best_model-epoch3.pt`` for ``best_model.pt``), which holds a copy
    of the best; the main process deletes a file that drops out of the top ``k``.

    Several ``train()`` calls (stages of one run): with ``reset_on_train=True`` each call ranks
    its own epochs (deleting the previous call's epoch files) and ends with its own best. With
    ``reset_on_train=False`` the ranking spans the calls, and a call loads the best at its end
    only if it saved that best itself: a best from an earlier call is never loaded over a later
    stage's weights; a message names it and how to load it
    (``trainer.load_checkpoint(save_path)``), where pytorch-accelerated loaded it. A resumed
    ``train(resume_from=...)`` continues the saved call.

    Order ``50``: after callbacks that record metrics at ``on_training_run_epoch_end`` (default
    0, ``ModelEmaCallback`` 40), before ``LogMetricsCallback`` (100) and
    ``EarlyStoppingCallback`` (150), whose stop would otherwise skip the last epoch's save.

    Args:
        save_path: The file of the best checkpoint (in ``trainer.run_dir`` when left out and
            the trainer has an ``output_dir``).
        watch_metric: The run-history metric that ranks the epochs.
        greater_is_better: Whether larger values of the metric are better. Left out, lower is
            better, with a warning unless the metric's name says it is a loss or an error.
        reset_on_train: Start a new ranking at each ``train()``; ``False`` keeps the best of
            earlier calls (a later call saves only what beats them).
        save_optimizer: Include the optimizer state in the checkpoints.
        save_scheduler: Include the scheduler state, if there is a scheduler.
        load_saved_checkpoint: Load the best checkpoint at the end of each ``train()`` call,
            if that call saved it: the weights and the optimizer's state (moments) of the best
            epoch, while the learning-rate schedule stays where the run ended (the
            scheduler's state and the optimizer's hyper-parameters, such as ``lr``, are those
            of the run's end), so a next stage continues the schedule rather than repeat it
            from the best epoch. For the checkpoint's schedule too, call
            ``trainer.load_checkpoint(save_path)``.
        save_top_k: How many of the best epochs to keep as files.

    Attributes:
        best_metric: The best value so far (``None`` before the first save).
        best_metric_epoch: The epoch of ``best_metric``.

    Example:
        ```python
        best = SaveBestModelCallback("checkpoints/best.pt", watch_metric="accuracy",
                                     greater_is_better=True, save_top_k=3)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, best))
        trainer.train(train_dataset, num_epochs=10, eval_dataset=eval_dataset)
        # checkpoints/best.pt and checkpoints/best-epoch<N>.pt for the 3 best epochs
        ```
    """

    order = 50
    may_stop_training = False

    def __init__(
        self,
        save_path: str | os.PathLike[str] = DefaultPath("best_model.pt"),
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool | None = None,
        reset_on_train: bool = True,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        load_saved_checkpoint: bool = True,
        save_top_k: int = 1,
    ) -> None:
        where = "SaveBestModelCallback"
        check_path(where, "save_path", save_path)
        self._watch = MetricWatch(where, watch_metric, greater_is_better)
        if watch_metric in _RESERVED_KEYS:
            fail(
                ValueError,
                where,
                "watch_metric",
                watch_metric,
                f"a name other than the checkpoint keys {sorted(_RESERVED_KEYS)}",
                "Record the metric under another name.",
            )
        for name, flag in (
            ("reset_on_train", reset_on_train),
            ("save_optimizer", save_optimizer),
            ("save_scheduler", save_scheduler),
            ("load_saved_checkpoint", load_saved_checkpoint),
        ):
            check_bool(where, name, flag)
        check_positive_int(where, "save_top_k", save_top_k)
        self.save_path = Path(save_path)
        self._run_paths = RunPaths(save_path=save_path)
        self.watch_metric = watch_metric
        self.greater_is_better = self._watch.greater_is_better
        self.reset_on_train = reset_on_train
        self.save_optimizer = save_optimizer
        self.save_scheduler = save_scheduler
        self.load_saved_checkpoint = load_saved_checkpoint
        self.save_top_k = save_top_k
        self.best_metric: float | None = None
        self.best_metric_epoch: int | None = None
        self._ranking: list[tuple[float, int]] = []  # (value, epoch), best first
        self._best_in_call = False  # whether the current train() call saved best_metric

    def redirect_outputs(self, directory: Path) -> AbstractContextManager[None]:
        """Write the best checkpoints under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "save_path")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the best checkpoints under ``run_dir`` if ``save_path`` was left at its default."""
        self._run_paths.place(self, run_dir)

    @property
    def top_checkpoints(self) -> list[tuple[int, float]]:
        """The kept epochs as ``(epoch, value)``, best first (at most ``save_top_k``)."""
        return [(epoch, value) for value, epoch in self._ranking]

    def checkpoint_path(self, epoch: int) -> Path:
        """Return the file that keeps the 1-based ``epoch`` when ``save_top_k > 1``."""
        path = self.save_path
        return path.with_name(f"{path.stem}-epoch{epoch}{path.suffix}")

    def state_dict(self) -> dict[str, Any]:
        """Return the best value, its epoch and the kept ranking (saved in training states)."""
        return {
            "best_metric": self.best_metric,
            "best_metric_epoch": self.best_metric_epoch,
            "ranking": [list(entry) for entry in self._ranking],
            "best_in_call": self._best_in_call,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state returned by ``state_dict``."""
        self.best_metric = state_dict["best_metric"]
        self.best_metric_epoch = state_dict["best_metric_epoch"]
        self._ranking = [(float(value), int(epoch)) for value, epoch in state_dict["ranking"]]
        self._best_in_call = bool(state_dict.get("best_in_call", True))

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start a new ranking (if ``reset_on_train``); check that the metric can be recorded."""
        if self.reset_on_train:
            self._forget(trainer)
        self._best_in_call = False
        self._watch.start_run(trainer)

    def on_training_run_epoch_end(
        self, trainer: TrainerLike, evaluated: bool = True, **kwargs: Any
    ) -> None:
        """Save the epoch if it is a new best or, with ``save_top_k > 1``, in the top ``k``."""
        value = self._watch.read_main(trainer, evaluated)
        full = len(self._ranking) >= self.save_top_k
        if self._watch.is_better(value, self._ranking[-1][0] if full else None):
            self._save(trainer, value, trainer.run_history.current_epoch)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Load the best checkpoint, if asked for and one was saved."""
        if not self.load_saved_checkpoint:
            return
        if self.best_metric is None:
            get_logger().info(
                f"SaveBestModelCallback: no checkpoint was saved (no completed epoch with a "
                f"value of {self.watch_metric}); the model keeps its last weights."
            )
            return
        if not self._best_in_call:
            get_logger().info(
                f"SaveBestModelCallback: the best checkpoint {str(self.save_path)!r} "
                f"({self.watch_metric} = {format_value(self.best_metric)} "
                f"in epoch {self.best_metric_epoch}) "
                "is from an earlier train() call: the model keeps this call's last weights "
                "rather than go back to an earlier stage. To use the best, call "
                f"trainer.load_checkpoint({str(self.save_path)!r})."
            )
            return
        get_logger().info(
            f"Loading the best checkpoint {str(self.save_path)!r}: {self.watch_metric} = "
            f"{format_value(self.best_metric)} in epoch {self.best_metric_epoch}."
        )
        schedule = _Schedule.of(trainer)
        trainer.load_checkpoint(
            self.save_path, load_optimizer=self.save_optimizer, load_scheduler=self.save_scheduler
        )
        schedule.restore(trainer)

    def _save(self, trainer: TrainerLike, value: float, epoch: int) -> None:
        """Write the epoch's file(s), then delete the file that left the top ``k``."""
        contents = {self.watch_metric: value, "epoch": epoch}
        options = {"save_optimizer": self.save_optimizer, "save_scheduler": self.save_scheduler}
        if self.save_top_k > 1:
            trainer.save_checkpoint(self.checkpoint_path(epoch), contents, **options)
        if self._watch.is_better(value, self.best_metric):
            trainer.save_checkpoint(self.save_path, contents, **options)
            self.best_metric, self.best_metric_epoch = value, epoch
            self._best_in_call = True
        # An epoch number seen before (a new run with reset_run_history) replaces that file.
        self._ranking = [entry for entry in self._ranking if entry[1] != epoch]
        self._ranking.append((value, epoch))
        sign = -1.0 if self.greater_is_better else 1.0
        self._ranking.sort(key=lambda entry: (sign * entry[0], entry[1]))
        evicted, self._ranking = self._ranking[self.save_top_k :], self._ranking[: self.save_top_k]
        self._delete(trainer, [epoch for _, epoch in evicted])

    def _forget(self, trainer: TrainerLike) -> None:
        self._delete(trainer, [epoch for _, epoch in self._ranking])
        self._ranking = []
        self.best_metric = None
        self.best_metric_epoch = None

    def _delete(self, trainer: TrainerLike, epochs: list[int]) -> None:
        if self.save_top_k == 1 or not trainer.accelerator.is_main_process:
            return
        for epoch in epochs:
            self.checkpoint_path(epoch).unlink(missing_ok=True)


class _Schedule:
    """The learning-rate schedule's position: the scheduler's state, the optimizer's settings.

    Taken before the best checkpoint is loaded and put back after it, so that the schedule
    goes on from the run's end: the settings are every param-group entry but ``params``
    (``lr``, and what schedules such as ``OneCycleLR`` move: ``momentum``, ``betas``).
    """

    def __init__(self, scheduler: dict[str, Any] | None, groups: list[dict[str, Any]]) -> None:
        self.scheduler = scheduler
        self.groups = groups

    @classmethod
    def of(cls, trainer: TrainerLike) -> _Schedule:
        scheduler = trainer.scheduler
        state = None if scheduler is None else copy.deepcopy(scheduler.state_dict())
        groups = [
            {key: copy.deepcopy(value) for key, value in group.items() if key != "params"}
            for group in trainer.optimizer.param_groups
        ]
        return cls(state, groups)

    def restore(self, trainer: TrainerLike) -> None:
        if self.scheduler is not None and trainer.scheduler is not None:
            trainer.scheduler.load_state_dict(self.scheduler)
        for group, settings in zip(trainer.optimizer.param_groups, self.groups, strict=True):
            group.update(settings)
