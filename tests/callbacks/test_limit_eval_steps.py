"""LimitEvalStepsCallback in real training runs."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import RecordingCallback, make_regression_dataset, make_trainer
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks.limit_eval_steps import LimitEvalStepsCallback
from pytorch_accel.callbacks.step_eval import StepBasedEvaluationCallback

TRAIN, EVAL = make_regression_dataset(64), make_regression_dataset(40, seed=1)  # 5 eval batches


def eval_steps_per_epoch(recorder: RecordingCallback) -> list[tuple[bool, int]]:
    """(is_intermediate, steps) for each eval epoch, in order."""
    epochs: list[tuple[bool, int]] = []
    for event, kwargs in zip(recorder.events, recorder.kwargs, strict=True):
        if event == "on_eval_epoch_start":
            epochs.append((kwargs["is_intermediate"], 0))
        elif event == "on_eval_step_end":
            epochs[-1] = (epochs[-1][0], epochs[-1][1] + 1)
    return epochs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_eval_steps": 0}, ValueError, r"num_eval_steps must be a positive int"),
        ({"num_eval_steps": 1.0}, TypeError, r"num_eval_steps must be a positive int"),
        (
            {"num_eval_steps": 2, "limit_intermediate_only": "yes"},
            TypeError,
            r"limit_intermediate_only must be a bool",
        ),
    ],
)
def test_constructor_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=r"^LimitEvalStepsCallback: " + match):
        LimitEvalStepsCallback(**kwargs)


def test_limits_only_intermediate_evaluations_by_default() -> None:
    recorder = RecordingCallback()
    callbacks = (StepBasedEvaluationCallback(4), LimitEvalStepsCallback(2), recorder)
    trainer = make_trainer(callbacks=callbacks)
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL)  # 8 updates: evaluations at 4 and 8
    assert eval_steps_per_epoch(recorder) == [(True, 2), (True, 2), (False, 5)]
    assert trainer.limit_eval_batches is None
    trainer.evaluate(EVAL)
    assert eval_steps_per_epoch(recorder)[-1] == (False, 5)


def test_limits_every_evaluation_when_asked_and_the_loss_is_of_those_batches() -> None:
    recorder = RecordingCallback()
    limit = LimitEvalStepsCallback(2, limit_intermediate_only=False)
    trainer = make_trainer(callbacks=(limit, recorder))
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL)
    trainer.evaluate(EVAL)
    assert eval_steps_per_epoch(recorder) == [(False, 2), (False, 2)]
    inputs, targets = EVAL.tensors
    expected = nn.functional.mse_loss(trainer.model(inputs[:16]), targets[:16]).item()
    assert trainer.run_history.get_latest_metric("evaluation_loss") == pytest.approx(expected)
    assert limit.steps_per_process(trainer) == 2


def test_a_stricter_limit_is_kept_and_restored() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(LimitEvalStepsCallback(3, False), recorder))
    trainer.limit_eval_batches = 1
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL)
    assert eval_steps_per_epoch(recorder) == [(False, 1)]
    assert trainer.limit_eval_batches == 1


def test_the_limit_is_restored_when_the_run_stops_in_the_evaluation() -> None:
    from pytorch_accel.callbacks import StopTrainingError, TrainerCallback

    class StopInEval(TrainerCallback):
        def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise StopTrainingError("stop")

    trainer = make_trainer(callbacks=(LimitEvalStepsCallback(2, False), StopInEval()))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    assert trainer.limit_eval_batches is None
