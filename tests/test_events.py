"""The exact order of events and hooks, recorded from real runs and checked against the docs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import RecordingCallback, make_model, make_regression_dataset, make_trainer
from torch.utils.data import TensorDataset

import pytorch_accel.events
from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback

STEP = ["on_train_step_start", "on_backward_start", "on_backward_end"]
UPDATE = ["on_optimizer_step_start", "on_optimizer_step_end"]
EVAL_EPOCH = ["on_eval_epoch_start", "on_eval_step_start", "on_eval_step_end", "on_eval_epoch_end"]


def run_events(num_samples: int, eval_samples: int | None = None, **train_kwargs: Any) -> list[str]:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(recorder,))
    eval_dataset = None if eval_samples is None else make_regression_dataset(eval_samples)
    trainer.train(
        make_regression_dataset(num_samples),
        eval_dataset=eval_dataset,
        per_device_batch_size=4,
        **train_kwargs,
    )
    return recorder.events


def documented_listing(title: str) -> list[str]:
    """The event names of one listing in the events module docstring, in order.

    Without the progress events, which the listings mark as fired now and then.
    """
    doc = pytorch_accel.events.__doc__ or ""
    block = doc.split(title, 1)[1].split(":\n", 1)[1]
    body = re.split(r"\n\S", block, maxsplit=1)[0]
    names = re.findall(r"\bon_\w+", body)
    return [name for name in names if name not in pytorch_accel.events.PROGRESS_EVENTS]


def test_training_run_with_eval_matches_the_documented_listing() -> None:
    events = run_events(4, eval_samples=4, num_epochs=1)
    assert events == documented_listing("A training run")
    assert events == [
        "on_training_run_start",
        "on_train_epoch_start",
        *STEP,
        *UPDATE,
        "on_train_step_end",
        "on_train_epoch_end",
        *EVAL_EPOCH,
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]


def test_evaluation_run_matches_the_documented_listing() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(recorder,))
    trainer.evaluate(make_regression_dataset(4), per_device_batch_size=4)
    assert recorder.events == documented_listing("An evaluation run")
    assert recorder.events == ["on_evaluation_run_start", *EVAL_EPOCH, "on_evaluation_run_end"]


def test_training_without_eval_has_no_eval_events() -> None:
    events = run_events(8, num_epochs=2)
    epoch = ["on_train_epoch_start", *(STEP + UPDATE + ["on_train_step_end"]) * 2]
    expected = [
        "on_training_run_start",
        *epoch,
        "on_train_epoch_end",
        "on_training_run_epoch_end",
        *epoch,
        "on_train_epoch_end",
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]
    assert events == expected


def test_accumulation_fires_optimizer_events_only_at_window_ends() -> None:
    events = run_events(12, num_epochs=1, gradient_accumulation_steps=2)  # 3 batches: 2 + 1
    step = [*STEP, "on_train_step_end"]
    update_step = [*STEP, *UPDATE, "on_train_step_end"]
    assert events == [
        "on_training_run_start",
        "on_train_epoch_start",
        *step,
        *update_step,
        *update_step,
        "on_train_epoch_end",
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]


class StopAtStep(TrainerCallback):
    def __init__(self, event: str, step: int) -> None:
        self.event, self.step, self.calls = event, step, 0

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._maybe_stop("on_train_step_start")

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._maybe_stop("on_train_step_end")

    def _maybe_stop(self, event: str) -> None:
        if event == self.event:
            self.calls += 1
            if self.calls == self.step:
                raise StopTrainingError("stop requested")


def test_early_stop_at_step_end_closes_the_epoch_then_the_run() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(StopAtStep("on_train_step_end", 2), recorder))
    trainer.train(
        make_regression_dataset(16),
        num_epochs=3,
        eval_dataset=make_regression_dataset(4),
        per_device_batch_size=4,
    )
    step = [*STEP, *UPDATE, "on_train_step_end"]
    # the recorder comes after the stopping callback and still gets the event that stopped
    assert recorder.events == [
        "on_training_run_start",
        "on_train_epoch_start",
        *step,
        *step,
        "on_train_epoch_end",
        "on_stop_training_error",
        "on_training_run_end",
    ]
    assert trainer.run_history.get_metric_values("train_loss_epoch")  # recorded on the way out
    assert trainer.num_updates == 2


def test_documented_stop_listing_holds_when_the_stopper_runs_first() -> None:
    recorder = RecordingCallback()

    class Stopper(StopAtStep):
        order = 10  # after the recorder

    trainer = make_trainer(callbacks=(recorder, Stopper("on_train_step_end", 2)))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    documented = documented_listing("A stop raised in")
    assert recorder.events[-len(documented) :] == documented


def test_stop_before_any_step_still_pairs_start_and_end_events() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(StopAtStep("on_train_step_start", 1), recorder))
    trainer.train(make_regression_dataset(8), num_epochs=2, per_device_batch_size=4)
    assert recorder.events == [
        "on_training_run_start",
        "on_train_epoch_start",
        "on_train_step_start",  # the event that asked to stop still reaches every callback
        "on_train_epoch_end",
        "on_stop_training_error",
        "on_training_run_end",
    ]
    assert trainer.num_updates == 0


def test_stop_at_epoch_end_skips_later_epochs() -> None:
    class StopAfterEval(TrainerCallback):
        def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise StopTrainingError("early stopping")

    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(StopAfterEval(), recorder))
    trainer.train(
        make_regression_dataset(4),
        num_epochs=5,
        eval_dataset=make_regression_dataset(4),
        per_device_batch_size=4,
    )
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]
    assert recorder.events.count("on_train_epoch_start") == 1
    stop_kwargs = recorder.kwargs[recorder.events.index("on_stop_training_error")]
    assert isinstance(stop_kwargs["error"], StopTrainingError)


def test_stop_in_a_trainer_hook_is_handled_like_a_callback_stop() -> None:
    class StoppingTrainer(Trainer):
        def train_epoch_end(self) -> None:
            raise StopTrainingError("hook stop")

    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(recorder,), trainer_class=StoppingTrainer)
    trainer.train(make_regression_dataset(4), num_epochs=3, per_device_batch_size=4)
    # the callbacks still get the event whose hook asked to stop
    ending = ["on_train_epoch_end", "on_stop_training_error", "on_training_run_end"]
    assert recorder.events[-3:] == ending
    assert recorder.events.count("on_train_epoch_start") == 1


def test_stop_during_evaluate_fires_the_run_end() -> None:
    class StopInEval(TrainerCallback):
        def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise StopTrainingError

    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(StopInEval(), recorder))
    trainer.evaluate(make_regression_dataset(8), per_device_batch_size=4)
    assert recorder.events == [
        "on_evaluation_run_start",
        "on_eval_epoch_start",
        "on_eval_step_start",
        "on_eval_step_end",
        "on_eval_epoch_end",
        "on_stop_training_error",
        "on_evaluation_run_end",
    ]


def test_trainer_hooks_run_before_the_callback_event_of_the_same_name() -> None:
    calls: list[str] = []
    hooks = [
        "training_run_start",
        "train_epoch_start",
        "train_epoch_end",
        "eval_epoch_start",
        "eval_epoch_end",
        "training_run_epoch_end",
        "training_run_end",
    ]

    class HookedTrainer(Trainer):
        pass

    for hook in hooks:

        def method(self: Trainer, _hook: str = hook) -> None:
            calls.append(_hook)
            getattr(Trainer, _hook)(self)

        setattr(HookedTrainer, hook, method)

    class EventLog(TrainerCallback):
        pass

    for hook in hooks:
        setattr(
            EventLog, f"on_{hook}", lambda self, trainer, _e=f"on_{hook}", **kw: calls.append(_e)
        )
    trainer = make_trainer(callbacks=(EventLog(),), trainer_class=HookedTrainer)
    trainer.train(
        make_regression_dataset(4),
        num_epochs=1,
        eval_dataset=make_regression_dataset(4),
        per_device_batch_size=4,
    )
    for hook in hooks:
        assert calls.index(hook) + 1 == calls.index(f"on_{hook}"), hook


def test_step_end_receives_batch_output_and_step_index() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(recorder,))
    dataset: TensorDataset = make_regression_dataset(12)
    trainer.train(dataset, num_epochs=1, per_device_batch_size=4)
    ends = [
        kw
        for e, kw in zip(recorder.events, recorder.kwargs, strict=True)
        if e == "on_train_step_end"
    ]
    assert [kw["step"] for kw in ends] == [0, 1, 2]
    assert all(set(kw) == {"batch", "batch_output", "step"} for kw in ends)
    assert ends[0]["batch_output"]["batch_size"] == 4
    eval_starts = [
        kw
        for e, kw in zip(recorder.events, recorder.kwargs, strict=True)
        if e == "on_eval_epoch_start"
    ]
    assert eval_starts == []


@pytest.mark.parametrize("is_train", [True, False])
def test_model_mode_follows_the_phase(is_train: bool) -> None:
    modes: list[bool] = []

    class ModeProbe(TrainerCallback):
        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            modes.append(trainer.model.training)

        def on_eval_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            modes.append(trainer.model.training)

    trainer = make_trainer(make_model(), callbacks=(ModeProbe(),))
    if is_train:
        trainer.train(
            make_regression_dataset(4),
            num_epochs=2,
            eval_dataset=make_regression_dataset(4),
            per_device_batch_size=4,
        )
        assert modes == [True, False, True, False]
    else:
        trainer.evaluate(make_regression_dataset(4), per_device_batch_size=4)
        assert modes == [False]


class AddsRecorderAfterFirstUpdate(TrainerCallback):
    """Adds a recorder from an inner event, while no callback listens to the step events."""

    def __init__(self) -> None:
        self.recorder = RecordingCallback()

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.recorder not in trainer.callback_handler.callbacks:
            trainer.callback_handler.add_callback(self.recorder)


def test_a_callback_added_mid_epoch_gets_whole_steps_from_the_next_one_on() -> None:
    adder = AddsRecorderAfterFirstUpdate()
    trainer = make_trainer(callbacks=(adder,))
    trainer.train(make_regression_dataset(12), num_epochs=1, per_device_batch_size=4)
    step = [*STEP, *UPDATE, "on_train_step_end"]
    # the first step ran without step events (nobody listened when it started), so the
    # recorder gets no unpaired on_train_step_end for it
    assert adder.recorder.events == [
        *step,
        *step,
        "on_train_epoch_end",
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]
