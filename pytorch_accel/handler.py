"""Dispatch of named events to callbacks, in a declared order.

Part of the core: the loop fires events through a ``CallbackHandler``; the callbacks package
re-exports it as ``pytorch_accel.callbacks.CallbackHandler``.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, ParamSpec, TypeVar

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.events import BUILTIN_EVENTS
from pytorch_accel.logging_setup import get_logger

__all__ = ["CallbackHandler", "CallbackLike", "announces_exceptions"]

CallbackLike = TrainerCallback | type[TrainerCallback]

P = ParamSpec("P")
R = TypeVar("R")

_ANNOUNCED = "_pytorch_accel_announced"
"""The attribute that marks an exception whose ``on_exception`` has fired."""


class CallbackHandler:
    """Holds the callbacks of a trainer and calls them when an event fires.

    Callbacks run in increasing ``order`` (an int attribute, default 0); ties keep the order
    of registration. Only callbacks that define an event's method are called for it; the
    trainer does not even fire an event nobody listens to (see ``active_events``). Exceptions
    raised by callbacks propagate: nothing is swallowed.

    A callback method ``on_<name>`` must name a known event: a typo such as
    ``on_train_epoch_ned`` is rejected when the callback is added. Custom events are known once
    registered, with ``register_event`` or a callback's ``custom_events``.

    Args:
        callbacks: Callback instances, or classes to instantiate without arguments.
        events: Extra event names to register before the callbacks are added.

    Attributes:
        active_events: The events at least one callback listens to, kept current as callbacks
            are added and removed (read it, do not assign it). The trainer does not fire an
            event outside it, so an event nobody listens to costs one set look-up.
    """

    def __init__(self, callbacks: Iterable[CallbackLike] = (), events: Iterable[str] = ()) -> None:
        self._events: set[str] = set(BUILTIN_EVENTS)
        self._callbacks: list[TrainerCallback] = []
        self._listeners: dict[str, tuple[Callable[..., Any], ...]] = {}
        self._stoppable: frozenset[str] = frozenset()
        self._self_agreeing: frozenset[str] = frozenset()
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

        Listeners are callbacks that define the event; a callback declares that it never stops
        training with ``may_stop_training = False``.
        """
        return event in self._stoppable

    def agrees_on_stops(self, event: str) -> bool:
        """Return whether a listener of ``event`` agrees across processes on its own stops.

        Such listeners (``TrainerCallback.agreed_stop_events``) raise ``StopTrainingError`` on
        every process at once, so a stop raised in the event needs no exchange when no other
        listener may stop (``may_stop``).
        """
        return event in self._self_agreeing

    def call_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every callback that defines it, in order.

        A ``StopTrainingError`` raised by one callback does not keep the others from the event:
        it is raised once every callback has had it, so the order of callbacks never decides
        who sees the last event of a run (and, with several processes, every process runs the
        same callbacks). Any other exception propagates at once.

        Args:
            event: The event name, e.g. ``"on_train_epoch_end"``.
            *args: Positional arguments (the trainer first).
            **kwargs: Keyword arguments for the event.

        Raises:
            ValueError: If the event was never registered and no callback defines it.
            StopTrainingError: The first one a callback raised, after all were called.
        """
        stop = self.dispatch(event, args, kwargs)
        if stop is not None:
            raise stop

    def call_event_while_stopping(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every listener while the run is already stopping.

        A further ``StopTrainingError`` is redundant then, so it does not keep the
        remaining callbacks from their end event (to close files and progress bars); any other
        exception propagates.
        """
        self.dispatch(event, args, kwargs)

    def announce_exception(self, trainer: Any, exception: BaseException, where: str) -> None:
        """Fire ``on_exception`` once for ``exception``, escaping the entry point ``where``.

        An exception that already passed here (from an ``evaluate()`` called inside
        ``train()``) is not announced again. Every listener gets it: an error a listener
        raises is logged with its traceback and the next listener is called, so the original
        exception is never hidden (the caller re-raises it).
        """
        if getattr(exception, _ANNOUNCED, False):
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

    def dispatch(
        self, event: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> StopTrainingError | None:
        """Call ``event`` on every callback that defines it; return the first stop, if any.

        ``call_event`` without the packing of its arguments, for callers that fire events
        often (the trainer, every step): the same order and the same rule that every callback
        gets the event, but the first ``StopTrainingError`` is returned instead of raised.

        Raises:
            ValueError: If the event was never registered and no callback defines it.
        """
        listeners = self._listeners.get(event)
        if listeners is None:
            listeners = self._implementers(event)
        stop: StopTrainingError | None = None
        for listener in listeners:
            try:
                listener(*args, **kwargs)
            except StopTrainingError as error:
                stop = stop or error
        return stop

    def _implementers(self, event: str) -> tuple[Callable[..., Any], ...]:
        """The methods named ``event`` of the callbacks, for an event never registered.

        pytorch-accelerated fires any name (``call_event("verify_train_batch", ...)``); such
        an event reaches the callbacks that define it. A name no callback defines is still a
        typo, and rejected.
        """
        found = tuple(
            method
            for callback in self._callbacks
            if callable(method := getattr(callback, event, None))
        )
        if not found:
            self._reject_unknown_event(event)
        return found

    def _reject_unknown_event(self, event: str) -> NoReturn:
        suggestion = _suggest(event, self._events)
        raise ValueError(
            f"CallbackHandler.call_event: unknown event {event!r}{suggestion} No callback "
            f"defines it; register custom events first with register_event({event!r})."
        )

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
        self._listeners = {
            event: tuple(
                getattr(callback, event)
                for callback in self._callbacks
                if _overrides(callback, event)
            )
            for event in self._events
        }
        self.active_events = frozenset(event for event, found in self._listeners.items() if found)
        self._stoppable = frozenset(
            event
            for event in self._events
            if any(
                getattr(callback, "may_stop_training", True)
                and event not in getattr(callback, "agreed_stop_events", ())
                and _overrides(callback, event)
                for callback in self._callbacks
            )
        )
        self._self_agreeing = frozenset(
            event
            for callback in self._callbacks
            for event in getattr(callback, "agreed_stop_events", ())
            if _overrides(callback, event)
        )


def announces_exceptions(method: Callable[P, R]) -> Callable[P, R]:
    """Fire ``on_exception`` when an exception escapes a trainer's entry point ``method``.

    For ``Trainer.train``, ``evaluate`` and ``predict``: any ``Exception`` and
    ``KeyboardInterrupt``, once (see ``CallbackHandler.announce_exception``), then it
    propagates unchanged. ``StopTrainingError`` (a normal stop) and ``SystemExit`` (the exit
    after a preemption save, which ended the run through its stop events) are not announced.
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
            raise

    return announcing


def _overrides(callback: object, event: str) -> bool:
    method = getattr(callback, event, None)
    if method is None:
        return False
    base = getattr(TrainerCallback, event, None)
    return getattr(method, "__func__", method) is not base


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
