"""StepBasedEvaluationCallback in real training runs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import RecordingCallback, make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.step_eval import StepBasedEvaluationCallback

TRAIN, EVAL = make_regression_dataset(64), make_regression_dataset(20, seed=1)


class ModeLog(TrainerCallback):
    """Notes the model's mode at each train step end (after the evaluation) and eval step."""

    order = 10

    def __init__(self) -> None:
        self.train_modes: list[bool] = []
        self.eval_modes: list[bool] = []

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.train_modes.append(trainer.model.training)

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.eval_modes.append(trainer.model.training)


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (None, TypeError)]
)
def test_eval_every_n_steps_is_checked(value: Any, error: type[Exception]) -> None:
    with pytest.raises(
        error, match=r"^StepBasedEvaluationCallback: eval_every_n_steps must be a positive int"
    ):
        StepBasedEvaluationCallback(value)


def test_evaluates_every_n_updates_across_epochs_in_train_mode_again() -> None:
    log, recorder = ModeLog(), RecordingCallback()
    trainer = make_trainer(callbacks=(StepBasedEvaluationCallback(3), log, recorder))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)  # 8 updates per epoch
    assert len(trainer.run_history.get_metric_values("intermediate_eval_loss")) == 5  # 3..15
    assert len(log.train_modes) == 16
    assert all(log.train_modes)
    assert not any(log.eval_modes)
    flags = [
        kw["is_intermediate"]
        for e, kw in zip(recorder.events, recorder.kwargs, strict=True)
        if e == "on_eval_epoch_start"
    ]
    assert flags == [True, True, False, True, True, True, False]


def test_counts_updates_not_batches_with_accumulation() -> None:
    trainer = make_trainer(callbacks=(StepBasedEvaluationCallback(3),))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, gradient_accumulation_steps=2)
    assert trainer.num_updates == 8
    assert len(trainer.run_history.get_metric_values("intermediate_eval_loss")) == 2  # 3 and 6


def test_an_evaluation_at_the_epoch_end_update_equals_the_epoch_evaluation() -> None:
    trainer = make_trainer(callbacks=(StepBasedEvaluationCallback(8),))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    history = trainer.run_history
    assert history.get_metric_values("intermediate_eval_loss") == history.get_metric_values(
        "eval_loss_epoch"
    )


def test_training_is_not_disturbed() -> None:
    torch.manual_seed(7)
    plain = make_trainer()
    plain.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    torch.manual_seed(7)
    trainer = make_trainer(callbacks=(StepBasedEvaluationCallback(3),))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert trainer.run_history.get_metric_values(name) == plain.run_history.get_metric_values(
            name
        )
    for ours, theirs in zip(trainer.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_a_run_without_an_eval_set_fails_at_the_start() -> None:
    trainer = make_trainer(callbacks=(StepBasedEvaluationCallback(3),))
    with pytest.raises(ValueError, match=r"eval_dataset must be a dataset.*remove the callback"):
        trainer.train(TRAIN, num_epochs=1)


def test_a_stop_during_the_evaluation_ends_the_run_there() -> None:
    class StopInIntermediateEval(TrainerCallback):
        def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            if kwargs["is_intermediate"] and trainer.num_updates == 6:
                raise StopTrainingError("stop")

    recorder = RecordingCallback()
    callbacks = (StepBasedEvaluationCallback(3), StopInIntermediateEval(), recorder)
    trainer = make_trainer(callbacks=callbacks)
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    assert trainer.num_updates == 6
    assert trainer.model.training
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]
