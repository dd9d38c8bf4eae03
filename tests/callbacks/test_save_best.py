"""SaveBestModelCallback in real training runs: what is saved, kept, deleted and loaded."""

from __future__ import annotations

import functools
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel._checkpointing.checkpoint import load_checkpoint_file
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
from pytorch_accel.callbacks.save_best import SaveBestModelCallback
from pytorch_accel.tracking import MetricNotFoundError

TRAIN, EVAL = make_regression_dataset(16), make_regression_dataset(8, seed=1)
MOMENTUM_SGD = functools.partial(torch.optim.SGD, momentum=0.9)


class ScriptedMetric(TrainerCallback):
    """Records the next scripted ``score`` at each epoch end and snapshots the state saved then."""

    may_stop_training = False

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.values_seen: dict[int, float] = {}
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.momentum: dict[int, list[torch.Tensor]] = {}

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        self.values_seen[epoch] = self.values.pop(0)
        trainer.run_history.update_metric("score", self.values_seen[epoch])
        model_state = trainer.get_model().state_dict()
        self.weights[epoch] = {name: tensor.clone() for name, tensor in model_state.items()}
        self.momentum[epoch] = [
            state["momentum_buffer"].clone() for state in trainer.optimizer.state.values()
        ]


def run(
    values: list[float], tmp_path: Path, **options: Any
) -> tuple[Trainer, SaveBestModelCallback, ScriptedMetric]:
    scripted = ScriptedMetric(values)
    saver = SaveBestModelCallback(tmp_path / "best_model.pt", watch_metric="score", **options)
    trainer = make_trainer(callbacks=(scripted, saver), optimizer_class=MOMENTUM_SGD)
    trainer.train(TRAIN, num_epochs=len(values), per_device_batch_size=8)
    return trainer, saver, scripted


def assert_state_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        assert torch.equal(tensor, expected[name]), name


def files(tmp_path: Path) -> list[str]:
    return sorted(path.name for path in tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"save_path": 3}, TypeError, r"save_path must be a file path"),
        ({"save_path": ""}, TypeError, r"save_path must be a file path"),
        ({"watch_metric": "epoch"}, ValueError, r"watch_metric must be a name other than"),
        ({"watch_metric": None}, TypeError, r"watch_metric must be a non-empty metric name"),
        ({"greater_is_better": 1}, TypeError, r"greater_is_better must be a bool"),
        ({"save_optimizer": "no"}, TypeError, r"save_optimizer must be a bool"),
        ({"load_saved_checkpoint": None}, TypeError, r"load_saved_checkpoint must be a bool"),
        ({"save_top_k": 0}, ValueError, r"save_top_k must be a positive int"),
        ({"save_top_k": 2.0}, TypeError, r"save_top_k must be a positive int"),
    ],
)
def test_constructor_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=r"^SaveBestModelCallback: " + match):
        SaveBestModelCallback(**kwargs)


def test_saves_the_best_epoch_with_consistent_keys_and_loads_it_at_the_end(
    tmp_path: Path,
) -> None:
    trainer, saver, scripted = run([3.0, 1.0, 2.0], tmp_path)
    assert files(tmp_path) == ["best_model.pt"]
    checkpoint = load_checkpoint_file(tmp_path / "best_model.pt")
    assert (checkpoint["score"], checkpoint["epoch"]) == (1.0, 2)
    assert "loss" not in checkpoint
    assert_state_equal(checkpoint["model_state_dict"], scripted.weights[2])
    assert (saver.best_metric, saver.best_metric_epoch) == (1.0, 2)
    # Loaded at the end: the weights and the optimizer state of epoch 2, not of epoch 3.
    assert_state_equal(trainer.get_model().state_dict(), scripted.weights[2])
    buffers = [state["momentum_buffer"] for state in trainer.optimizer.state.values()]
    assert all(map(torch.equal, buffers, scripted.momentum[2]))
    assert not torch.equal(scripted.weights[2]["0.weight"], scripted.weights[3]["0.weight"])


def test_after_the_reload_the_learning_rate_follows_the_schedule(tmp_path: Path) -> None:
    scripted = ScriptedMetric([1.0, 3.0, 4.0])  # the best, epoch 1, at update 2 of 6
    saver = SaveBestModelCallback(tmp_path / "best.pt", watch_metric="score")
    trainer = make_trainer(callbacks=(scripted, saver), optimizer_class=MOMENTUM_SGD, lr=1.0)
    trainer.train(
        TRAIN,
        num_epochs=3,
        per_device_batch_size=8,
        create_scheduler_fn=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2),
    )
    assert_state_equal(trainer.get_model().state_dict(), scripted.weights[1])  # reloaded
    buffers = [state["momentum_buffer"] for state in trainer.optimizer.state.values()]
    assert all(map(torch.equal, buffers, scripted.momentum[1]))  # the best epoch's moments
    assert trainer.scheduler.state_dict()["last_epoch"] == 6  # the schedule at the run's end
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # not epoch 1's 0.1
    assert trainer.scheduler.get_last_lr() == [pytest.approx(1e-3)]


def test_the_first_value_of_the_watched_eval_loss_is_saved_under_its_name(tmp_path: Path) -> None:
    saver = SaveBestModelCallback(tmp_path / "model.pt", save_optimizer=False)
    trainer = make_trainer(callbacks=(saver,))
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL, per_device_batch_size=8)
    checkpoint = load_checkpoint_file(tmp_path / "model.pt")
    assert checkpoint["eval_loss_epoch"] == trainer.run_history.get_latest_metric("eval_loss_epoch")
    assert checkpoint["epoch"] == 1
    assert "optimizer_state_dict" not in checkpoint


def test_top_k_keeps_the_k_best_epochs_as_files_and_deletes_the_rest(tmp_path: Path) -> None:
    _, saver, scripted = run([5.0, 3.0, 4.0, 1.0, 2.0], tmp_path, save_top_k=2)
    assert files(tmp_path) == ["best_model-epoch4.pt", "best_model-epoch5.pt", "best_model.pt"]
    assert saver.top_checkpoints == [(4, 1.0), (5, 2.0)]
    assert saver.checkpoint_path(4) == tmp_path / "best_model-epoch4.pt"
    for name, epoch in [
        ("best_model.pt", 4),
        ("best_model-epoch4.pt", 4),
        ("best_model-epoch5.pt", 5),
    ]:
        checkpoint = load_checkpoint_file(tmp_path / name)
        assert (checkpoint["epoch"], checkpoint["score"]) == (epoch, scripted.values_seen[epoch])
        assert_state_equal(checkpoint["model_state_dict"], scripted.weights[epoch])


def test_top_k_with_greater_is_better_and_ties(tmp_path: Path) -> None:
    _, saver, _ = run([1.0, 3.0, 2.0, 3.0], tmp_path, save_top_k=2, greater_is_better=True)
    assert saver.top_checkpoints == [(2, 3.0), (4, 3.0)]  # the earlier of a tie ranks first
    assert load_checkpoint_file(tmp_path / "best_model.pt")["epoch"] == 2
    assert files(tmp_path) == ["best_model-epoch2.pt", "best_model-epoch4.pt", "best_model.pt"]


def test_nan_is_never_saved(tmp_path: Path) -> None:
    _, saver, _ = run([math.nan, 2.0, math.nan], tmp_path)
    assert saver.best_metric_epoch == 2


def test_no_checkpoint_before_the_first_epoch_end_is_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class StopAtSecondStep(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            if kwargs["step"] == 1:
                raise StopTrainingError("stop")

    saver = SaveBestModelCallback(tmp_path / "best_model.pt")
    trainer = make_trainer(callbacks=(StopAtSecondStep(), saver))
    trainer.train(make_regression_dataset(32), num_epochs=2, eval_dataset=EVAL)
    assert files(tmp_path) == []
    assert "no checkpoint was saved" in caplog.text


def test_saves_the_last_epoch_before_early_stopping_ends_the_run(tmp_path: Path) -> None:
    scripted = ScriptedMetric([2.0, 1.0, 0.5, 0.1])
    saver = SaveBestModelCallback(tmp_path / "best.pt", watch_metric="score")
    stopper = EarlyStoppingCallback(early_stopping_patience=1)  # lr=0: stops after epoch 2
    trainer = make_trainer(lr=0.0, callbacks=(stopper, scripted, saver))
    trainer.train(TRAIN, num_epochs=4, eval_dataset=EVAL, per_device_batch_size=8)
    assert len(trainer.run_history.get_metric_values("score")) == 2  # two epochs completed
    assert load_checkpoint_file(tmp_path / "best.pt")["epoch"] == 2


def test_load_saved_checkpoint_false_keeps_the_last_weights(tmp_path: Path) -> None:
    trainer, _, scripted = run([1.0, 2.0], tmp_path, load_saved_checkpoint=False)
    assert_state_equal(trainer.get_model().state_dict(), scripted.weights[2])


@pytest.mark.parametrize("reset_on_train", [True, False])
def test_reset_on_train(tmp_path: Path, reset_on_train: bool) -> None:
    scripted = ScriptedMetric([1.0, 2.0, 5.0, 4.0])
    saver = SaveBestModelCallback(
        tmp_path / "best.pt", watch_metric="score", save_top_k=2, reset_on_train=reset_on_train
    )
    trainer = make_trainer(callbacks=(scripted, saver), optimizer_class=MOMENTUM_SGD)
    trainer.train(TRAIN, num_epochs=2, per_device_batch_size=8)
    trainer.train(TRAIN, num_epochs=2, per_device_batch_size=8, reset_run_history=False)
    if reset_on_train:  # a new ranking: the first run's files are gone
        assert saver.top_checkpoints == [(4, 4.0), (3, 5.0)]
        assert files(tmp_path) == ["best-epoch3.pt", "best-epoch4.pt", "best.pt"]
    else:  # the first run's epochs still rank first; nothing of the second run qualifies
        assert saver.top_checkpoints == [(1, 1.0), (2, 2.0)]
        assert files(tmp_path) == ["best-epoch1.pt", "best-epoch2.pt", "best.pt"]
    assert load_checkpoint_file(tmp_path / "best.pt")["epoch"] == saver.top_checkpoints[0][0]


def test_reset_on_train_false_loads_a_best_only_from_the_call_that_saved_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stages of one run: an earlier stage's best never replaces a later stage's weights."""
    scripted = ScriptedMetric([3.0, 1.0, 2.0, 4.0])  # the best, 1.0, in stage 2's first epoch
    saver = SaveBestModelCallback(
        tmp_path / "best.pt", watch_metric="score", greater_is_better=False, reset_on_train=False
    )
    trainer = make_trainer(callbacks=(scripted, saver), optimizer_class=MOMENTUM_SGD)
    trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)
    trainer.train(TRAIN, num_epochs=2, per_device_batch_size=8, reset_run_history=False)
    assert_state_equal(trainer.get_model().state_dict(), scripted.weights[2])  # its own best
    with caplog.at_level(logging.INFO, logger="pytorch_accel"):
        trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8, reset_run_history=False)
    assert_state_equal(trainer.get_model().state_dict(), scripted.weights[4])  # not epoch 2's
    assert (saver.best_metric, saver.best_metric_epoch) == (1.0, 2)
    assert "(score = 1 in epoch 2) is from an earlier train() call" in caplog.text
    assert "trainer.load_checkpoint(" in caplog.text


def test_missing_metric_names_the_recorded_ones(tmp_path: Path) -> None:
    trainer = make_trainer(callbacks=(SaveBestModelCallback(tmp_path / "b.pt", "accuracy"),))
    with pytest.raises(MetricNotFoundError, match=r"Recorded metrics: train_loss_epoch\."):
        trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)
