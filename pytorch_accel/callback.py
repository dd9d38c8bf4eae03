"""The callback interface and its dispatch (the catalogue: ``pytorch_accel.callbacks``).

``TrainerCallback`` is the base class whose ``on_*`` methods the trainer's events call;
``CallbackHandler`` calls them in a declared order; ``ProgressEvents`` fires an epoch's
progress event at strides that follow the speed.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, ParamSpec, TypeVar

from pytorch_accel.errors import StopTrainingError
from pytorch_accel.events import BUILTIN_EVENTS
from pytorch_accel.tracking import get_logger

__all__ = [
    "CallbackHandler",
    "CallbackLike",
    "ProgressEvents",
    "TrainerCallback",
    "announces_exceptions",
]

P = ParamSpec("P")
R = TypeVar("R")

_ANNOUNCED = "_pytorch_accel_announced"
"""The attribute that marks an exception whose ``on_exception`` has fired."""


class TrainerCallback:
    """Base class for callbacks: override the ``on_*`` events you need.

    Every method receives the trainer first and keyword arguments after it; accept
    ``**kwargs`` so that new arguments do not break your callback. Use only the trainer's
    public surface (``trainer.model``, ``trainer.run_history``, ``trainer.accelerator``, ...):
    ``pytorch_accel.protocols.TrainerLike`` declares it, for type hints. The events here take
    the trainer untyped, so a subclass may annotate it ``TrainerLike`` or ``Trainer``.

    Attributes:
        order: Callbacks run in increasing ``order``; ties keep registration order. Default
            callbacks use -100 (device placement) to 100 (metric logging).
        custom_events: Names of extra events this callback handles or fires, registered with
            the handler when the callback is added.
        may_stop_training: Whether this callback may raise ``StopTrainingError``. In a
            multi-process run the processes agree on stopping after each event that has a
            listener which may stop; ``False`` saves that exchange.
        agreed_stop_events: Events in which this callback raises ``StopTrainingError`` only
            on every process at once, because it agrees across processes itself (e.g. with
            ``pytorch_accel.distributed.AgreedFlag``): the trainer adds no exchange for them.

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

    def training_states_dir(self) -> Path | None:
        """The directory this callback saves training states in, or ``None`` (the default).

        ``train(resume_from="latest")`` resumes from the newest state in the first one returned.
        """
        return None

    def on_init_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of ``Trainer.__init__``."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the start of ``train()``, after preparation and scheduler creation."""

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the start of each training epoch, after ``model.train()``."""

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called before each training batch is processed."""

    def on_backward_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called just before the backward pass of each training batch.

        ``kwargs`` include ``batch`` and ``batch_output`` (``calculate_train_batch_loss``'s
        output): the loss before it changes any weight.
        """

    def on_backward_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called just after the backward pass of each training batch."""

    def on_optimizer_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called before each optimizer update, after gradients were unscaled and clipped."""

    def on_optimizer_step_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called after each optimizer update, before the scheduler step and ``zero_grad``."""

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Called after each training batch's backward pass and update.

        ``batch`` is as the dataloader produced it, ``batch_output`` the dict returned by
        ``calculate_train_batch_loss``; ``kwargs`` include ``step``, the 0-based batch index.
        """

    def on_train_progress(self, trainer: Any, steps_done: int, **kwargs: Any) -> None:
        """Called now and then after a training step (``steps_done``), and after the last one.

        For progress displays. Processes fire it at different steps (see
        ``Trainer.progress_interval``): it must not stop training, call collectives or save state.
        """

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of each training epoch, after ``train_loss_epoch`` is recorded."""

    def on_eval_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the start of each evaluation epoch (kwarg ``is_intermediate``)."""

    def on_eval_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called before each evaluation batch is processed."""

    def on_eval_step_end(
        self, trainer: Any, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Called after each evaluation batch, with ``calculate_eval_batch_loss``'s output."""

    def on_eval_progress(self, trainer: Any, steps_done: int, **kwargs: Any) -> None:
        """Called now and then after an evaluation step, and after the epoch's last one.

        Like ``on_train_progress``, for the evaluation epoch.
        """

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of each evaluation epoch, after its loss is recorded."""

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called after each completed epoch of a training run (train, then eval if any)."""

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of ``train()``, also when it was stopped early."""

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the start of ``evaluate()``."""

    def on_evaluation_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of ``evaluate()``."""

    def on_predict_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the start of ``predict()``, with the model in eval mode."""

    def on_predict_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Called before each prediction batch."""

    def on_predict_step_end(
        self, trainer: Any, batch: Any, predictions: Any, **kwargs: Any
    ) -> None:
        """Called after each prediction batch, with its outputs gathered from every process.

        ``batch`` is this process's; ``predictions`` are the batch's outputs from every
        process, in dataset order, without repeated samples, on ``predict()``'s
        ``output_device`` (the same on every process).
        """

    def on_predict_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Called at the end of ``predict()``."""

    def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
        """Called when a ``StopTrainingError`` stopped the run (kwarg ``error``)."""

    def on_exception(self, trainer: Any, exception: BaseException, **kwargs: Any) -> None:
        """Called once when an exception escapes ``train()``, ``evaluate()`` or ``predict()``.

        On the process where it was raised (also for ``KeyboardInterrupt``; see
        ``pytorch_accel.events``), instead of the run's end events: close files, trackers and
        progress bars here, without collectives. ``kwargs``: ``where``, the entry point
        (``"train"``, ``"evaluate"``, ``"predict"``, ``"find_lr"``, ``"find_batch_size"``). An
        error it raises is logged, and the original exception propagates.
        """


CallbackLike = TrainerCallback | type[TrainerCallback]


class CallbackHandler:
    """Holds the callbacks of a trainer and calls them when an event fires.

    Callbacks run in increasing ``order`` (default 0); ties keep the order of registration.
    Only callbacks that define an event's method are called for it. Exceptions raised by
    callbacks propagate: nothing is swallowed. A callback method ``on_<name>`` must name a
    known event (a typo such as ``on_train_epoch_ned`` is rejected when the callback is
    added); custom events are known once registered (``register_event``, ``custom_events``).

    Args:
        callbacks: Callback instances, or classes to instantiate without arguments.
        events: Extra event names to register before the callbacks are added.

    Attributes:
        active_events: The events at least one callback listens to, kept current as callbacks
            are added and removed (read it, do not assign it). The trainer does not fire the
            others.
    """

    def __init__(self, callbacks: Iterable[CallbackLike] = (), events: Iterable[str] = ()) -> None:
        self._events: set[str] = set(BUILTIN_EVENTS)
        self._callbacks: list[TrainerCallback] = []
        self._listeners: dict[str, tuple[Callable[..., Any], ...]] = {}
        self._stoppable: frozenset[str] = frozenset()
        self._self_agreeing: frozenset[str] = frozenset()
        self._caller_handles = 0  # exceptions_handled_by_caller
        self.active_events: frozenset[str] = frozenset()
        for event in events:
            self._add_event(event)
        self.add_callbacks(callbacks)

    @property
    def callbacks(self) -> list[TrainerCallback]:
        """The callbacks, in the order they are called."""
        return list(self._callbacks)

    @property
    def callback_list(self) -> list[str]:
        """The class names of the callbacks, in the order they are called."""
        return [type(callback).__name__ for callback in self._callbacks]

    @property
    def events(self) -> frozenset[str]:
        """Every event name this handler accepts."""
        return frozenset(self._events)

    def __iter__(self) -> Iterator[TrainerCallback]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self._callbacks)

    def register_event(self, name: str) -> None:
        """Make a custom event known, so callbacks may define it and the trainer may fire it.

        Raises:
            ValueError: If ``name`` is not an identifier starting with ``on_``.
        """
        self._add_event(name)
        self._index()

    def add_callbacks(self, callbacks: Iterable[CallbackLike]) -> None:
        """Add several callbacks; see ``add_callback``."""
        for callback in callbacks:
            self._register(callback)
        self._index()

    def add_callback(self, callback: CallbackLike) -> TrainerCallback:
        """Add one callback (an instance, or a class instantiated without arguments); return it.

        Raises:
            TypeError: If ``order`` is not an int.
            ValueError: If the callback defines an ``on_*`` method that names no known event.
        """
        instance = self._register(callback)
        self._index()
        return instance

    def remove_callback(self, callback: CallbackLike) -> None:
        """Remove a callback instance, or every instance of a callback class."""
        if isinstance(callback, type):
            self._callbacks = [cb for cb in self._callbacks if not isinstance(cb, callback)]
        else:
            self._callbacks = [cb for cb in self._callbacks if cb is not callback]
        self._index()

    def clear_callbacks(self) -> None:
        """Remove every callback."""
        self._callbacks = []
        self._index()

    def may_stop(self, event: str) -> bool:
        """Return whether a listener of ``event`` may raise ``StopTrainingError``.

        A callback declares that it never stops training with ``may_stop_training = False``.
        """
        return event in self._stoppable

    def agrees_on_stops(self, event: str) -> bool:
        """Return whether a listener of ``event`` agrees across processes on its own stops.

        See ``TrainerCallback.agreed_stop_events``.
        """
        return event in self._self_agreeing

    def call_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every callback that defines it, in order.

        A ``StopTrainingError`` raised by one callback does not keep the others from the event:
        it is raised once every callback has had it, so the order of callbacks never decides
        who sees the last event of a run. Any other exception propagates at once.

        Raises:
            ValueError: If the event was never registered and no callback defines it.
            StopTrainingError: The first one a callback raised, after all were called.
        """
        stop = self.dispatch(event, args, kwargs)
        if stop is not None:
            raise stop

    def call_event_while_stopping(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every listener while the run is already stopping.

        A further ``StopTrainingError`` is redundant then, and ignored; any other exception
        propagates.
        """
        self.dispatch(event, args, kwargs)

    def announce_exception(self, trainer: Any, exception: BaseException, where: str) -> None:
        """Fire ``on_exception`` once for ``exception``, escaping the entry point ``where``.

        An exception that already passed here (from a ``train()`` inside ``train(dry_run=...)``)
        is not announced again. An error a listener raises is logged with its traceback and the
        next listener is called: the original exception is never hidden.
        """
        if getattr(exception, _ANNOUNCED, False) or self._caller_handles:
            return
        with contextlib.suppress(AttributeError):  # an exception class without a __dict__
            setattr(exception, _ANNOUNCED, True)
        for listener in self._listeners.get("on_exception", ()):
            try:
                listener(trainer, exception=exception, where=where)
            except Exception:  # logged: the original exception is what propagates
                get_logger().exception(
                    "%s raised while handling %s from %s(); the original exception propagates",
                    getattr(listener, "__qualname__", listener),
                    type(exception).__name__,
                    where,
                )

    @contextlib.contextmanager
    def exceptions_handled_by_caller(self) -> Iterator[None]:
        """Announce no exception meanwhile: the caller handles them (a batch-size trial's OOM)."""
        self._caller_handles += 1
        try:
            yield
        finally:
            self._caller_handles -= 1

    def dispatch(
        self, event: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> StopTrainingError | None:
        """Call ``event`` on every callback that defines it; return the first stop, if any.

        ``call_event`` without the packing of its arguments, for the trainer's frequent events:
        the first ``StopTrainingError`` is returned instead of raised.

        Raises:
            ValueError: If the event was never registered and no callback defines it.
        """
        listeners = self._listeners.get(event)
        if listeners is None:  # never registered: pytorch-accelerated fires any name
            listeners = tuple(
                method
                for callback in self._callbacks
                if callable(method := getattr(callback, event, None))
            )
            if not listeners:  # a name no callback defines is a typo
                raise ValueError(
                    f"CallbackHandler.call_event: unknown event {event!r}"
                    f"{_suggest(event, self._events)} No callback defines it; register custom "
                    f"events first with register_event({event!r})."
                )
        stop: StopTrainingError | None = None
        for listener in listeners:
            try:
                listener(*args, **kwargs)
            except StopTrainingError as error:
                stop = stop or error
        return stop

    def _add_event(self, name: str) -> None:
        if not (isinstance(name, str) and name.startswith("on_") and name.isidentifier()):
            raise ValueError(
                f"CallbackHandler.register_event: name must be an identifier starting with "
                f"'on_', got {name!r}. Use e.g. 'on_my_event'."
            )
        self._events.add(name)

    def _register(self, callback: CallbackLike) -> TrainerCallback:
        _check_callback_like(callback)
        instance = callback() if isinstance(callback, type) else callback
        order = getattr(instance, "order", 0)
        if isinstance(order, bool) or not isinstance(order, int):
            raise TypeError(
                f"CallbackHandler: {type(instance).__name__}.order must be an int, got "
                f"{order!r} ({type(order).__name__}). Set order = 0 or another int."
            )
        for event in getattr(instance, "custom_events", ()):
            self._add_event(event)
        self._check_event_methods(instance)
        self._callbacks.append(instance)
        return instance

    def _check_event_methods(self, callback: object) -> None:
        kind = type(callback).__name__
        for name in dir(callback):
            meant = _meant_event(name, self._events)
            if not (name.startswith("on_") or meant is not None):
                continue  # not read: a property is not evaluated
            method = getattr(callback, name, None)
            if not callable(method):
                continue
            if name.startswith("on_") and name not in self._events:
                raise ValueError(
                    f"CallbackHandler: {kind}.{name} names no known "
                    f"event{_suggest(name, self._events)} If it is a custom event, list it "
                    f"in {kind}.custom_events or call "
                    f"register_event({name!r}) before adding the callback."
                )
            if meant is not None:
                raise ValueError(
                    f"CallbackHandler: {kind}.{name} looks like the event {meant!r} but is never "
                    f"called: event methods are named exactly as the event. Rename it to {meant}."
                )
            if name in self._events and _overrides(callback, name):
                _check_accepts_kwargs(kind, name, method)

    def _index(self) -> None:
        self._callbacks.sort(key=lambda callback: getattr(callback, "order", 0))
        listeners: dict[str, list[Callable[..., Any]]] = {event: [] for event in self._events}
        stoppable, self_agreeing = set(), set()
        for callback in self._callbacks:
            agreed = getattr(callback, "agreed_stop_events", ())
            may_stop = getattr(callback, "may_stop_training", True)
            for event, found in listeners.items():
                if _overrides(callback, event):
                    found.append(getattr(callback, event))
                    if event in agreed:
                        self_agreeing.add(event)
                    elif may_stop:
                        stoppable.add(event)
        self._listeners = {event: tuple(found) for event, found in listeners.items()}
        self.active_events = frozenset(event for event, found in listeners.items() if found)
        self._stoppable, self._self_agreeing = frozenset(stoppable), frozenset(self_agreeing)


def announces_exceptions(method: Callable[P, R]) -> Callable[P, R]:
    """Fire ``on_exception`` when an exception escapes a trainer's entry point ``method``.

    Any ``Exception`` and ``KeyboardInterrupt``, once, then it propagates unchanged; not
    ``StopTrainingError`` (a normal stop) nor ``SystemExit`` (the exit after a preemption save,
    which ended the run through its stop events). The ``KeyboardInterrupt`` that follows a
    Ctrl-C whose training state was saved (``SaveTrainingStateCallback(save_on_interrupt=
    True)``, which said so in the log) propagates without the stop it ended: a bare
    ``KeyboardInterrupt`` from the entry point, not a chain of tracebacks through the loop.
    """
    where = method.__name__

    @functools.wraps(method)
    def announcing(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except (StopTrainingError, SystemExit, GeneratorExit):
            raise
        except BaseException as exception:  # an error, or KeyboardInterrupt (Ctrl-C)
            trainer = args[0]
            handler = getattr(trainer, "callback_handler", None)
            if isinstance(handler, CallbackHandler):
                handler.announce_exception(trainer, exception, where)
            if _after_saved_interrupt(exception):
                raise KeyboardInterrupt from None  # the log said where the state was saved
            raise

    return announcing


def _after_saved_interrupt(exception: BaseException) -> bool:
    """Whether ``exception`` is the ``KeyboardInterrupt`` ending a run stopped by a saved Ctrl-C.

    That stop is a ``StopTrainingError`` caused by a ``KeyboardInterrupt`` (see
    ``SaveTrainingStateCallback``); the run's end raises the interrupt while handling it.
    """
    stop = exception.__context__
    return (
        isinstance(exception, KeyboardInterrupt)
        and isinstance(stop, StopTrainingError)
        and isinstance(stop.__cause__, KeyboardInterrupt)
    )


def _overrides(callback: object, event: str) -> bool:
    method = getattr(callback, event, None)
    base = getattr(TrainerCallback, event, None)
    return method is not None and getattr(method, "__func__", method) is not base


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)." if close else "."


def _check_callback_like(callback: object) -> None:
    """Reject what cannot be a callback (a string, a plain function, ``None``)."""
    kind = callback if isinstance(callback, type) else type(callback)
    if issubclass(kind, TrainerCallback) or any(name.startswith("on_") for name in dir(kind)):
        return
    raise TypeError(
        f"CallbackHandler: a callback must be a TrainerCallback instance or class, got "
        f"{callback!r} ({kind.__name__}). Pass e.g. callbacks=(ProgressBarCallback(),); a "
        "function is never called: put it in a TrainerCallback's on_* method."
    )


def _meant_event(name: str, events: Iterable[str]) -> str | None:
    """The event a method name looks like without being it (no ``on_``, or capitalised)."""
    if name.startswith("_") or name in events:
        return None
    for candidate in (f"on_{name}", name.lower(), f"on_{name.lower()}"):
        if candidate != name and candidate in events:
            return candidate
    return None


def _check_accepts_kwargs(kind: str, name: str, method: Callable[..., Any]) -> None:
    """Reject an event method without ``**kwargs``, which would fail at its first event."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): let it be
        return
    if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        raise TypeError(
            f"CallbackHandler: {kind}.{name} must accept **kwargs: events pass keyword "
            f"arguments, and new ones may be added. Define it as "
            f"def {name}(self, trainer, **kwargs)."
        )


class ProgressEvents:
    """Fires one epoch's progress event with ``steps_done``, at strides that follow the speed.

    The strides are described in ``pytorch_accel.events``. The loop calls ``report`` once the
    step's 0-based index reaches ``next_step`` (between two events a step costs one integer
    comparison), and ``finish`` when the epoch ends.

    Args:
        handler: The callback handler whose listeners get the event.
        trainer: Passed to the listeners first.
        event: ``"on_train_progress"`` or ``"on_eval_progress"``.
        interval: Seconds below which consecutive events double their stride.
    """

    __slots__ = (
        "_event",
        "_handler",
        "_interval",
        "_listened",
        "_reported",
        "_reported_at",
        "_stride",
        "_trainer",
        "next_step",
    )

    def __init__(
        self, handler: CallbackHandler, trainer: object, event: str, interval: float
    ) -> None:
        self._handler, self._trainer, self._event = handler, trainer, event
        self._interval = interval
        self._listened = event in handler.active_events
        self._reported_at: float | None = None  # the first event only starts the clock
        self._stride = 1
        self._reported = 0
        self.next_step = 0 if self._listened else sys.maxsize

    def start_at(self, steps_done: int) -> None:
        """Count from ``steps_done`` (a resumed epoch's skipped batches); report the next step."""
        self._reported = steps_done
        if self._listened:
            self.next_step = steps_done

    def report(self, done: int) -> None:
        """Fire the event with ``done``, then choose the step after which the next one fires."""
        now = time.monotonic()
        if self._reported_at is not None:
            fast = now - self._reported_at < self._interval
            self._stride = self._stride * 2 if fast else max(1, self._stride // 2)
        self._reported_at = now
        self.next_step = done - 1 + self._stride
        self._fire(done)

    def finish(self, done: int) -> None:
        """Fire the event once more if steps were done since the last one."""
        if self._listened and done > self._reported:
            self._fire(done)

    def _fire(self, done: int) -> None:
        self._reported = done
        stop = self._handler.dispatch(self._event, (self._trainer,), {"steps_done": done})
        if stop is not None:
            raise RuntimeError(
                f"{self._event} may not stop training: processes fire it at different steps, "
                f"so they could not stop together. Raise StopTrainingError from "
                f"{self._event.replace('progress', 'step_end')} instead."
            ) from stop
