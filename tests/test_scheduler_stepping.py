"""Schedulers stepped per epoch, and ReduceLROnPlateau fed a monitored metric (1 process)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    LearningRateRecorder,
    SaveAtStep,
    clone_params,
    make_model,
    make_regression_dataset,
    make_trainer,
)
from torch.optim.lr_scheduler import ReduceLROnPlateau, StepLR

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.schedulers import SchedulerStepping

SCORES = [1.0, 0.9, 0.95, 1.2, 1.1, 0.8, 0.85, 0.9]
"""A scripted metric, one per epoch: plateaus at epochs 3-5 and 7-8."""
BATCHES = 4  # 16 samples, batches of 4: 4 updates per epoch


class ScriptedScore(TrainerCallback):
    """Records ``score`` = ``SCORES[epoch]`` at each eval epoch's end (a metric callback)."""

    may_stop_training = False

    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.run_history.update_metric("score", SCORES[trainer.run_history.current_epoch - 1])


class SaveAtEpochEnd(TrainerCallback):
    """Save a training state at the end of epoch ``epoch`` (1-based), then stop the run."""

    def __init__(self, path: Path, epoch: int) -> None:
        self.path, self.epoch = path, epoch

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.run_history.current_epoch == self.epoch:
            trainer.save_training_state(self.path)
            raise StopTrainingError("")


PLATEAU = functools.partial(ReduceLROnPlateau, factor=0.5, patience=1)


def plateau_run(
    *callbacks: Any, num_epochs: int = 8, resume_from: Path | None = None, **kwargs: Any
) -> tuple[Trainer, LearningRateRecorder]:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(ScriptedScore(), recorder, *callbacks), lr=0.04)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=num_epochs,
        eval_dataset=make_regression_dataset(8, seed=1),
        per_device_batch_size=4,
        create_scheduler_fn=kwargs.pop(
            "create_scheduler_fn", SchedulerStepping.create_scheduler_fn(PLATEAU, monitor="score")
        ),
        resume_from=resume_from,
        **kwargs,
    )
    return trainer, recorder


def lrs_by_hand(scores: list[float], lr: float = 0.04) -> list[float]:
    """The LR of each epoch's updates: the plateau stepped by hand after each epoch."""
    optimizer = torch.optim.SGD(make_model().parameters(), lr=lr)
    scheduler = PLATEAU(optimizer)
    per_epoch = []
    for score in scores:
        per_epoch.append(optimizer.param_groups[0]["lr"])
        scheduler.step(score)
    return per_epoch


def per_epoch(recorder: LearningRateRecorder) -> list[float]:
    lrs = recorder.first_group
    assert all(lrs[i] == lrs[i - i % BATCHES] for i in range(len(lrs)))  # constant in an epoch
    return lrs[::BATCHES]


def test_plateau_is_fed_the_monitored_metric_after_each_evaluation() -> None:
    trainer, recorder = plateau_run()
    expected = lrs_by_hand(SCORES)
    assert expected == [0.04, 0.04, 0.04, 0.04, 0.02, 0.02, 0.02, 0.02]  # the test can fail
    assert per_epoch(recorder) == expected
    assert trainer.optimizer.param_groups[0]["lr"] == 0.01  # reduced again after the last epoch


def test_plateau_without_configuration_watches_the_eval_loss_then_the_train_loss() -> None:
    trainer, recorder = plateau_run(create_scheduler_fn=PLATEAU, num_epochs=4)
    eval_losses = trainer.run_history.get_metric_values("eval_loss_epoch")
    assert per_epoch(recorder) == lrs_by_hand(eval_losses)[:4]
    assert trainer.scheduler.best == min(eval_losses)

    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.04)
    data = make_regression_dataset(16)
    trainer.train(data, num_epochs=3, per_device_batch_size=4, create_scheduler_fn=PLATEAU)
    assert trainer.scheduler.best == min(trainer.run_history.get_metric_values("train_loss_epoch"))


def test_plateau_steps_only_after_the_epochs_that_evaluate() -> None:
    trainer, recorder = plateau_run(num_epochs=6, eval_every_n_epochs=2)
    # evaluated after epochs 2, 4, 6: the scores recorded then are SCORES[1], [3], [5]
    assert trainer.run_history.get_metric_values("score") == [0.9, 1.2, 0.8]
    steps = lrs_by_hand([0.9, 1.2, 0.8])
    assert per_epoch(recorder) == [steps[0], steps[0], steps[1], steps[1], steps[2], steps[2]]
    assert trainer.scheduler.last_epoch == 3


def test_interval_epoch_steps_a_torch_scheduler_once_per_epoch() -> None:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.1)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=5,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,  # 2 updates per epoch
        create_scheduler_fn=SchedulerStepping.create_scheduler_fn(
            functools.partial(StepLR, step_size=2, gamma=0.1), interval="epoch"
        ),
    )
    expected = [0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01, 0.001, 0.001]
    assert recorder.first_group == pytest.approx(expected, rel=1e-12)
    assert trainer.scheduler.last_epoch == 5


def test_interval_step_is_the_default_and_unchanged() -> None:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.1)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(StepLR, step_size=1, gamma=0.5),
    )
    assert recorder.first_group == pytest.approx([0.1, 0.05, 0.025, 0.0125], rel=1e-12)


def test_a_ported_scheduler_step_override_keeps_working_per_update_and_per_epoch() -> None:
    calls: list[int] = []

    class PortedTrainer(Trainer):
        def scheduler_step(self) -> None:  # pytorch-accelerated style
            calls.append(self.num_updates)
            self.scheduler.step()

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = PortedTrainer(model, torch.nn.MSELoss(), optimizer, callbacks=())
    step_lr = functools.partial(StepLR, step_size=1, gamma=0.5)
    data = make_regression_dataset(16)
    trainer.train(data, num_epochs=2, per_device_batch_size=4, create_scheduler_fn=step_lr)
    assert calls == list(range(1, 9))
    calls.clear()
    per_epoch_fn = SchedulerStepping.create_scheduler_fn(step_lr, interval="epoch")
    trainer.train(data, num_epochs=2, per_device_batch_size=4, create_scheduler_fn=per_epoch_fn)
    assert calls == [4, 8]  # called after each epoch instead, as Lightning's interval does


@pytest.mark.parametrize("where", ["mid-epoch", "epoch end"])
def test_plateau_counters_and_epoch_steps_survive_a_kill_and_resume(
    tmp_path: Path, where: str
) -> None:
    whole, whole_recorder = plateau_run()
    state = tmp_path / "state"
    stopper = SaveAtStep(state, 3 * 4 + 2) if where == "mid-epoch" else SaveAtEpochEnd(state, 3)
    first, _ = plateau_run(stopper)
    assert first.scheduler.num_bad_epochs == 1  # epoch 3 was a bad one: a counter to restore
    resumed, recorder = plateau_run(resume_from=state)
    done = 3 * BATCHES + (2 if where == "mid-epoch" else 0)
    assert recorder.first_group == whole_recorder.first_group[done:]
    # reduced after epoch 4 only if epoch 3's bad-epoch count was restored
    assert set(recorder.first_group) == {0.04, 0.02}
    assert resumed.scheduler.state_dict() == whole.scheduler.state_dict()
    for mine, theirs in zip(clone_params(resumed.model), clone_params(whole.model), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.bad_input
def test_unknown_interval_is_refused() -> None:
    with pytest.raises(ValueError, match=r"interval must be 'step' or 'epoch', got 'batch'"):
        SchedulerStepping.create_scheduler_fn(PLATEAU, interval="batch")  # type: ignore[arg-type]


@pytest.mark.bad_input
def test_a_monitor_stepped_per_update_is_refused() -> None:
    with pytest.raises(ValueError, match=r"recorded once per epoch"):
        SchedulerStepping.create_scheduler_fn(PLATEAU, interval="step", monitor="eval_loss_epoch")


@pytest.mark.bad_input
def test_plateau_stepped_per_update_is_refused() -> None:
    fn = SchedulerStepping.create_scheduler_fn(PLATEAU, interval="step")
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau steps on a metric"):
        make_trainer().train(make_regression_dataset(8), num_epochs=1, create_scheduler_fn=fn)


@pytest.mark.bad_input
def test_a_monitored_metric_never_recorded_names_those_that_were() -> None:
    fn = SchedulerStepping.create_scheduler_fn(PLATEAU, monitor="val_loss")
    with pytest.raises(
        ValueError,
        match=r"monitored metric must be one the run recorded \(eval_loss_epoch, "
        r"train_loss_epoch\), got 'val_loss'",
    ):
        make_trainer().train(
            make_regression_dataset(8),
            num_epochs=1,
            eval_dataset=make_regression_dataset(8),
            create_scheduler_fn=fn,
        )


def test_a_scheduler_stepped_per_epoch_resumes_mid_epoch_exactly(tmp_path: Path) -> None:
    per_epoch = SchedulerStepping.create_scheduler_fn(
        functools.partial(StepLR, step_size=1, gamma=0.5), interval="epoch"
    )

    def run(*callbacks: Any, resume_from: Path | None = None) -> tuple[Trainer, list[float]]:
        recorder = LearningRateRecorder()
        trainer = make_trainer(callbacks=(recorder, *callbacks), lr=0.04)
        trainer.train(
            make_regression_dataset(16),
            num_epochs=4,
            per_device_batch_size=4,
            create_scheduler_fn=per_epoch,
            resume_from=resume_from,
        )
        return trainer, recorder.first_group

    whole, whole_lrs = run()
    assert whole_lrs[::BATCHES] == [0.04, 0.02, 0.01, 0.005]
    run(SaveAtStep(tmp_path / "state", 2 * BATCHES + 1))  # inside epoch 3
    resumed, lrs = run(resume_from=tmp_path / "state")
    assert lrs == whole_lrs[2 * BATCHES + 1 :]
    assert resumed.scheduler.state_dict() == whole.scheduler.state_dict()
    for mine, theirs in zip(clone_params(resumed.model), clone_params(whole.model), strict=True):
        assert torch.equal(mine, theirs)
