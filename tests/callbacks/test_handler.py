"""The callback handler: ordering, validation of event names, custom events, errors."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel.callbacks import CallbackHandler, TrainerCallback


class Tagged(TrainerCallback):
    def __init__(self, tag: str, log: list[str]) -> None:
        self.tag, self.log = tag, log

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.log.append(self.tag)


def test_callbacks_run_by_order_then_registration() -> None:
    log: list[str] = []

    class Late(Tagged):
        order = 5

    class Early(Tagged):
        order = -5

    handler = CallbackHandler([Late("late", log), Tagged("a", log), Early("early", log)])
    handler.add_callback(Tagged("b", log))
    handler.call_event("on_train_epoch_start", None)
    assert log == ["early", "a", "b", "late"]
    assert handler.callback_list == ["Early", "Tagged", "Tagged", "Late"]


def test_classes_are_instantiated_and_instances_kept() -> None:
    class Plain(TrainerCallback):
        pass

    instance = Plain()
    handler = CallbackHandler([Plain, instance])
    assert len(handler) == 2
    assert handler.callbacks[1] is instance
    assert isinstance(handler.callbacks[0], Plain)
    assert handler.callbacks[0] is not instance


def test_typo_in_event_method_is_rejected_with_the_close_match() -> None:
    class Typo(TrainerCallback):
        def on_train_epoch_ned(self, trainer: Trainer, **kwargs: Any) -> None:
            pass

    with pytest.raises(
        ValueError, match=r"Typo.on_train_epoch_ned names no known event.*'on_train_epoch_end'"
    ):
        CallbackHandler([Typo])
    with pytest.raises(ValueError, match="on_train_epoch_ned"):
        make_trainer(callbacks=(Typo(),))


def test_custom_events_work_once_registered() -> None:
    seen: list[Any] = []

    class Listener(TrainerCallback):
        custom_events = ("on_checkpoint_saved",)

        def on_checkpoint_saved(self, trainer: Trainer, path: str, **kwargs: Any) -> None:
            seen.append(path)

    class Manual(TrainerCallback):
        def on_manual_event(self, trainer: Trainer, **kwargs: Any) -> None:
            seen.append("manual")

    handler = CallbackHandler([Listener()])
    handler.call_event("on_checkpoint_saved", None, path="a.pt")
    with pytest.raises(ValueError, match="on_manual_event"):
        handler.add_callback(Manual())
    handler.register_event("on_manual_event")
    handler.add_callback(Manual())
    handler.call_event("on_manual_event", None)
    assert seen == ["a.pt", "manual"]


def test_trainer_subclass_declares_custom_events() -> None:
    fired: list[int] = []

    class EventfulTrainer(Trainer):
        custom_events = ("on_epoch_summary",)

        def train_epoch_end(self) -> None:
            self.callback_handler.call_event(
                "on_epoch_summary", self, epoch=self.run_history.current_epoch
            )

    class Summary(TrainerCallback):
        def on_epoch_summary(self, trainer: Trainer, epoch: int, **kwargs: Any) -> None:
            fired.append(epoch)

    trainer = make_trainer(callbacks=(Summary(),), trainer_class=EventfulTrainer)
    trainer.train(make_regression_dataset(8), num_epochs=2, per_device_batch_size=4)
    assert fired == [1, 2]


def test_unknown_event_and_bad_names_are_errors() -> None:
    handler = CallbackHandler()
    with pytest.raises(
        ValueError, match=r"unknown event 'on_train_epoch_strat'.*'on_train_epoch_start'"
    ):
        handler.call_event("on_train_epoch_strat", None)
    with pytest.raises(ValueError, match="must be an identifier starting with 'on_'"):
        handler.register_event("train_epoch_summary")


def test_order_must_be_an_int() -> None:
    class BadOrder(TrainerCallback):
        order = "first"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"BadOrder.order must be an int, got 'first'"):
        CallbackHandler([BadOrder])


def test_errors_inside_callbacks_propagate() -> None:
    class Broken(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise RuntimeError("callback bug")

    trainer = make_trainer(callbacks=(Broken(),))
    with pytest.raises(RuntimeError, match="callback bug"):
        trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)


def test_remove_and_clear() -> None:
    class A(TrainerCallback):
        def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
            raise AssertionError("removed callbacks must not run")

    first = A()
    handler = CallbackHandler([first, A()])
    handler.remove_callback(first)
    assert len(handler) == 1
    handler.remove_callback(A)
    handler.call_event("on_train_epoch_start", None)
    handler.add_callback(A())
    handler.clear_callbacks()
    handler.call_event("on_train_epoch_start", None)
    assert list(handler) == []


def test_end_events_during_a_stop_reach_every_callback() -> None:
    from pytorch_accel.callbacks import StopTrainingError

    closed: list[str] = []

    class StopsAgainAtEpochEnd(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise StopTrainingError("first")

        def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise StopTrainingError("redundant")

    class Closer(TrainerCallback):
        order = 1

        def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            closed.append("epoch")

        def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
            closed.append("run")

    trainer = make_trainer(callbacks=(StopsAgainAtEpochEnd(), Closer()))
    trainer.train(make_regression_dataset(8), num_epochs=2, per_device_batch_size=4)
    assert closed == ["epoch", "run"]


def test_dispatch_returns_the_first_stop_after_every_callback_had_the_event() -> None:
    from pytorch_accel.callbacks import StopTrainingError

    seen: list[tuple[str, Any]] = []

    class Stops(TrainerCallback):
        def __init__(self, tag: str) -> None:
            self.tag = tag

        def on_train_step_end(self, trainer: Any, step: int, **kwargs: Any) -> None:
            seen.append((self.tag, step))
            raise StopTrainingError(self.tag)

    handler = CallbackHandler([Stops("first"), Stops("second")])
    kwargs = {"step": 3}
    stop = handler.dispatch("on_train_step_end", (None,), kwargs)
    assert isinstance(stop, StopTrainingError)
    assert str(stop) == "first"
    assert seen == [("first", 3), ("second", 3)]
    assert kwargs == {"step": 3}  # the caller's dict is not changed
    only = CallbackHandler([Stops("only")]).dispatch("on_train_step_end", (None,), {"step": 5})
    assert isinstance(only, StopTrainingError)
    assert str(only) == "only"
    assert seen[-1] == ("only", 5)
    assert handler.dispatch("on_train_epoch_start", (None,), {}) is None
    with pytest.raises(StopTrainingError, match="first"):
        handler.call_event("on_train_step_end", None, step=4)
    with pytest.raises(ValueError, match="unknown event 'on_train_stp_end'"):
        handler.dispatch("on_train_stp_end", (None,), {})


def test_nan_callback_without_interval_does_not_listen_to_steps() -> None:
    from pytorch_accel.callbacks import TerminateOnNaNCallback

    handler = CallbackHandler([TerminateOnNaNCallback()])
    assert not handler.may_stop("on_train_step_end")
    # its epoch check reads the epoch loss, the same on every process: no exchange needed
    assert not handler.may_stop("on_train_epoch_end")
    assert handler.agrees_on_stops("on_train_epoch_end")
    assert CallbackHandler([TerminateOnNaNCallback(check_every_n_steps=5)]).may_stop(
        "on_train_step_end"
    )


def test_active_events_follow_the_listeners() -> None:
    class StepEnd(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            pass

    log: list[str] = []
    handler = CallbackHandler([Tagged("a", log)])
    assert handler.active_events == {"on_train_epoch_start"}
    listener = StepEnd()
    handler.add_callback(listener)
    assert handler.active_events == {"on_train_epoch_start", "on_train_step_end"}
    handler.remove_callback(listener)
    assert handler.active_events == {"on_train_epoch_start"}
    silenced = StepEnd()
    silenced.on_train_step_end = None  # type: ignore[method-assign, assignment]
    handler.add_callback(silenced)
    assert handler.active_events == {"on_train_epoch_start"}


def test_a_callback_added_mid_step_gets_the_rest_of_that_step() -> None:
    events: list[str] = []

    class Late(TrainerCallback):
        def on_backward_end(self, trainer: Trainer, **kwargs: Any) -> None:
            events.append("on_backward_end")

        def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            events.append("on_optimizer_step_start")

    class Adder(TrainerCallback):
        def on_backward_start(self, trainer: Trainer, **kwargs: Any) -> None:
            if not events:
                events.append("added")
                trainer.callback_handler.add_callback(Late())

    trainer = make_trainer(callbacks=(Adder(),))
    trainer.train(make_regression_dataset(4), num_epochs=1, per_device_batch_size=4)
    assert events == ["added", "on_backward_end", "on_optimizer_step_start"]
