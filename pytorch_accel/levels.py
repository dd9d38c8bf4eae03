"""The levels of the loop, and the one helper that fires their start and end events.

A run, an epoch and a step are each a *level*: a start event, a body, an end event. Every level
runs through ``Levels.run``, so its two events cannot drift apart, also when a
``StopTrainingError`` ends the run early (each level's ``on_stop`` says what a stop does to it).
Firing an event runs the trainer's hook of the same name (if the level has one), then every
callback that listens; with several processes, a stop is agreed on by all of them
(``StopAgreement``) before anyone moves on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pytorch_accel._validation import shape_mismatches_raise
from pytorch_accel.distributed import StopAgreement
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.logging_setup import get_logger, setup_logging

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = [
    "EVALUATION_RUN",
    "EVAL_EPOCH",
    "EVAL_STEP",
    "EVAL_STEP_EVENTS",
    "PREDICT_RUN",
    "PREDICT_STEP",
    "PREDICT_STEP_EVENTS",
    "TRAINING_RUN",
    "TRAIN_EPOCH",
    "TRAIN_STEP",
    "TRAIN_STEP_EVENTS",
    "Level",
    "Levels",
]


class Level(NamedTuple):
    """One level of the loop: its hooks, its events and what a stop does to it.

    ``on_stop``: ``"propagate"`` (a step: it does not complete), ``"close"`` (an epoch: fire
    the end, then let the stop unwind) or ``"handle"`` (a run: announce the stop, then end).
    """

    start_hook: str | None
    start_event: str
    end_hook: str | None
    end_event: str
    on_stop: Literal["propagate", "close", "handle"]


TRAINING_RUN = Level(
    "training_run_start",
    "on_training_run_start",
    "training_run_end",
    "on_training_run_end",
    "handle",
)
EVALUATION_RUN = Level(
    "evaluation_run_start",
    "on_evaluation_run_start",
    "evaluation_run_end",
    "on_evaluation_run_end",
    "handle",
)
TRAIN_EPOCH = Level(
    "train_epoch_start", "on_train_epoch_start", "train_epoch_end", "on_train_epoch_end", "close"
)
EVAL_EPOCH = Level(
    "eval_epoch_start", "on_eval_epoch_start", "eval_epoch_end", "on_eval_epoch_end", "close"
)
PREDICT_RUN = Level(None, "on_predict_run_start", None, "on_predict_run_end", "handle")
TRAIN_STEP = Level(None, "on_train_step_start", None, "on_train_step_end", "propagate")
EVAL_STEP = Level(None, "on_eval_step_start", None, "on_eval_step_end", "propagate")
PREDICT_STEP = Level(None, "on_predict_step_start", None, "on_predict_step_end", "propagate")

# a step whose two events nobody listens to runs without its level: there is nothing to fire
TRAIN_STEP_EVENTS = frozenset({TRAIN_STEP.start_event, TRAIN_STEP.end_event})
EVAL_STEP_EVENTS = frozenset({EVAL_STEP.start_event, EVAL_STEP.end_event})
PREDICT_STEP_EVENTS = frozenset({PREDICT_STEP.start_event, PREDICT_STEP.end_event})


class Levels:
    """Runs levels and fires events for one trainer.

    Args:
        trainer: Whose hooks run and whose ``callback_handler`` is called (read at every event,
            so a handler replaced between runs is used).
        agreement: The stop agreement between processes, or ``None`` with one process.

    Attributes:
        stopped_by: The ``StopTrainingError`` that ended the last run early, or ``None``.
    """

    def __init__(self, trainer: Trainer, agreement: StopAgreement | None) -> None:
        self._trainer = trainer
        self._agreement = agreement
        self.stopped_by: StopTrainingError | None = None

    def run_entry_point(
        self,
        where: str,
        level: Level,
        body: Callable[..., dict[str, Any] | None],
        args: tuple[Any, ...] = (),
    ) -> None:
        """Run a whole run level (``train``, ``evaluate``, ``predict``) as ``run`` does.

        ``stopped_by`` is cleared first and holds the stop that ended the run, if one did;
        a loss that broadcasts targets of another shape raises (``shape_mismatches_raise``).
        The package's logger is set up first (``setup_logging``), for the messages of the loop
        and the callbacks.

        Args:
            where: The entry point, for messages (``"Trainer.train"``).
            level: A run level (``on_stop="handle"``).
            body: Runs the level's work.
            args: Passed to ``body``.
        """
        self.stopped_by = None
        setup_logging()  # the loop's and the callbacks' messages go through the package's logger
        with shape_mismatches_raise(where):
            self.run(level, body, args)

    def run(
        self,
        level: Level,
        body: Callable[..., dict[str, Any] | None],
        args: tuple[Any, ...] = (),
        finish: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """Fire ``level``'s start, run ``body(*args)``, then ``finish`` and the level's end.

        ``body`` may return extra keyword arguments for the end event. On a
        ``StopTrainingError`` the level acts as its ``on_stop`` says; a run level (``"handle"``)
        keeps the stop that ended it in ``stopped_by``.
        """
        try:
            self.fire(level.start_hook, level.start_event, kwargs)
            end_kwargs = body(*args) or {}
        except StopTrainingError as error:
            if level.on_stop == "propagate":
                raise
            if finish is not None:
                finish()
            if level.on_stop == "handle":
                self.stopped_by = error
                self._announce_stop(error)
            self._dispatch(level.end_hook, level.end_event, kwargs)  # further stops are moot
            if level.on_stop == "close":
                raise
            return
        if finish is not None:
            finish()
        kwargs.update(end_kwargs)
        self.fire(level.end_hook, level.end_event, kwargs)

    def fire(self, hook: str | None, event: str, kwargs: dict[str, Any]) -> None:
        """Run the hook ``hook`` (if any), then the callbacks of ``event``; stop if one asked.

        The hook and every callback get the event even when one of them asks to stop. With
        several processes, a stop is agreed on by all of them before anyone moves on, so they
        all stop at the same point and no collective is left waiting; a stop that was already
        agreed on in a nested event (an evaluation run by a callback) goes on unwinding at once.
        The exchange happens after an event whose hook is overridden (the trainer's own hooks
        never stop) or that has a listener which may stop; one whose only listeners that may
        stop agree on their stops themselves (``agreed_stop_events``) costs no exchange: their
        stop is raised as it is.
        """
        handler = self._trainer.callback_handler
        if hook is not None:
            stop = self._dispatch(hook, event, kwargs)
        elif event in handler.active_events:
            stop = handler.dispatch(event, (self._trainer,), kwargs)
        else:
            return  # nothing runs, so there is no stop to agree on either
        agreement = self._agreement
        if agreement is None or (stop is not None and agreement.agreed(stop)):
            if stop is not None:
                raise stop
            return
        if stop is not None:
            agreement.request(stop)
        if (hook is not None and self._hook_may_stop(hook)) or handler.may_stop(event):
            agreement.agree()
        elif stop is not None and handler.agrees_on_stops(event):
            agreement.adopt(stop)  # raised on every process at once by a self-agreeing listener

    def _hook_may_stop(self, hook: str) -> bool:
        """Whether the trainer's ``hook`` may raise ``StopTrainingError``.

        The trainer's own hooks are no-ops or mode switches, which never stop; a hook that a
        subclass (or the instance) overrides may.
        """
        trainer = self._trainer
        if hook in vars(trainer):
            return True
        return sum(1 for klass in type(trainer).__mro__ if hook in vars(klass)) > 1

    def _dispatch(
        self, hook: str | None, event: str, kwargs: dict[str, Any]
    ) -> StopTrainingError | None:
        """Run the hook and the callbacks of ``event``; return the first stop they raised.

        Closing a level during a stop calls this directly: every callback gets the event, and
        all processes unwind the same levels in step, so no agreement is needed.
        """
        stop = None
        if hook is not None:
            try:
                getattr(self._trainer, hook)()
            except StopTrainingError as error:
                stop = error
        callback_stop = self._trainer.callback_handler.dispatch(event, (self._trainer,), kwargs)
        return stop or callback_stop

    def _announce_stop(self, error: StopTrainingError) -> None:
        trainer = self._trainer
        if str(error):
            get_logger().info(str(error))
        trainer.callback_handler.call_event_while_stopping(
            "on_stop_training_error", trainer, error=error
        )
