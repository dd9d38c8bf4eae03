"""Several named eval sets, evaluate() returning its metrics, evaluating every N epochs and the
sanity evaluation: real training on the tiny regression model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.regression import MeanAbsoluteError

from pytorch_accel.callbacks import (
    EarlyStoppingCallback,
    MetricsCallback,
    SaveBestModelCallback,
    TrainerCallback,
)
from pytorch_accel.trainer import Trainer

TRAIN = make_regression_dataset(48)
VAL = make_regression_dataset(20, seed=1)
OOD = TensorDataset(VAL.tensors[0] * 3, VAL.tensors[1] * 3)  # shifted: a larger loss


def metrics() -> MetricsCallback:
    return MetricsCallback(MeanAbsoluteError(), name="mae")


def trained(**kwargs: Any) -> Trainer:
    trainer = make_trainer(make_model(), callbacks=(metrics(),))
    settings: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 8}
    trainer.train(TRAIN, **(settings | kwargs))
    return trainer


def test_one_eval_set_keeps_todays_names() -> None:
    history = trained(eval_dataset=VAL).run_history
    assert history.get_metric_names() == {"train_loss_epoch", "eval_loss_epoch", "mae"}
    assert len(history.get_metric_values("eval_loss_epoch")) == 2


def test_each_named_set_is_recorded_under_its_name_equal_to_evaluating_it_alone() -> None:
    trainer = trained(eval_dataset={"val": VAL, "ood": OOD})
    history = trainer.run_history
    assert history.get_metric_names() == {
        "train_loss_epoch",
        "val_eval_loss_epoch",
        "val_mae",
        "ood_eval_loss_epoch",
        "ood_mae",
    }
    alone = {name: trainer.evaluate(data) for name, data in (("val", VAL), ("ood", OOD))}
    for name in ("val", "ood"):
        last_loss = history.get_metric_values(f"{name}_eval_loss_epoch")[-1]
        assert last_loss == pytest.approx(alone[name]["evaluation_loss"], rel=1e-6)
        assert history.get_metric_values(f"{name}_mae")[-1] == pytest.approx(
            alone[name]["evaluation_mae"], rel=1e-6
        )
    assert alone["ood"]["evaluation_loss"] > alone["val"]["evaluation_loss"]  # not the same set


def test_evaluate_returns_its_metrics_and_leaves_the_validation_series_alone() -> None:
    trainer = trained(eval_dataset=VAL)
    history = trainer.run_history
    series = {name: list(history.get_metric_values(name)) for name in ("mae", "eval_loss_epoch")}
    result = trainer.evaluate(OOD)
    assert set(result) == {"evaluation_loss", "evaluation_mae"}
    assert all(isinstance(value, float) for value in result.values())
    for name, values in series.items():
        assert list(history.get_metric_values(name)) == values  # nothing appended
    assert history.get_latest_metric("evaluation_mae") == result["evaluation_mae"]


def test_evaluate_with_a_prefix_and_several_sets() -> None:
    trainer = trained(eval_dataset=VAL)
    result = trainer.evaluate({"a": VAL, "b": DataLoader(OOD, batch_size=5)}, metric_prefix="test_")
    assert set(result) == {"test_a_loss", "test_a_mae", "test_b_loss", "test_b_mae"}
    assert result["test_a_loss"] == pytest.approx(trainer.evaluate(VAL)["evaluation_loss"])
    assert result["test_b_loss"] == pytest.approx(trainer.evaluate(OOD)["evaluation_loss"])


def test_evaluate_defaults_to_the_named_sets_of_the_last_run() -> None:
    trainer = trained(eval_dataset={"val": VAL, "ood": OOD})
    assert set(trainer.evaluate()) == {
        "evaluation_val_loss",
        "evaluation_val_mae",
        "evaluation_ood_loss",
        "evaluation_ood_mae",
    }


class SetRecorder(TrainerCallback):
    """What callbacks learn about the set of each eval event."""

    def __init__(self) -> None:
        self.epochs: list[tuple[str, Any, bool]] = []
        self.steps: list[Any] = []
        self.loaders: list[int] = []

    def on_eval_epoch_start(self, trainer: Trainer, eval_set: Any, **kwargs: Any) -> None:
        self.epochs.append(("start", eval_set, kwargs["sanity_check"]))

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps.append(trainer.eval_set)
        self.loaders.append(len(trainer.eval_dataloader.dataset))  # type: ignore[union-attr]

    def on_eval_epoch_end(self, trainer: Trainer, eval_set: Any, **kwargs: Any) -> None:
        self.epochs.append(("end", eval_set, kwargs["sanity_check"]))


def test_callbacks_know_which_set_each_eval_event_is_for() -> None:
    recorder = SetRecorder()
    trainer = make_trainer(make_model(), callbacks=(recorder,))
    trainer.train(TRAIN, 1, eval_dataset={"val": VAL, "small": OOD}, per_device_batch_size=8)
    assert recorder.epochs == [
        ("start", "val", False),
        ("end", "val", False),
        ("start", "small", False),
        ("end", "small", False),
    ]
    assert recorder.steps == ["val"] * 3 + ["small"] * 3
    assert set(trainer.eval_dataloaders) == {"val", "small"}
    assert trainer.eval_set is None  # outside an evaluation


def test_save_best_and_early_stopping_watch_any_set(tmp_path: Any) -> None:
    save_best = SaveBestModelCallback(
        save_path=tmp_path / "best.pt", watch_metric="ood_eval_loss_epoch"
    )
    stopping = EarlyStoppingCallback(
        watch_metric="ood_mae", early_stopping_patience=50, greater_is_better=False
    )
    trainer = make_trainer(make_model(), callbacks=(metrics(), save_best, stopping))
    trainer.train(TRAIN, 4, eval_dataset={"val": VAL, "ood": OOD}, per_device_batch_size=8)
    history = trainer.run_history
    assert save_best.best_metric == pytest.approx(
        min(history.get_metric_values("ood_eval_loss_epoch"))
    )
    assert stopping.best_metric == pytest.approx(min(history.get_metric_values("ood_mae")))
    saved = torch.load(tmp_path / "best.pt", weights_only=True)
    assert saved["ood_eval_loss_epoch"] == pytest.approx(save_best.best_metric)


def test_watching_the_unnamed_loss_with_named_sets_names_the_sets() -> None:
    stopping = EarlyStoppingCallback(watch_metric="eval_loss_epoch")
    trainer = make_trainer(make_model(), callbacks=(stopping,))
    with pytest.raises(ValueError, match=r"'val_eval_loss_epoch'"):
        trainer.train(TRAIN, 1, eval_dataset={"val": VAL, "ood": OOD})


def test_evaluating_every_n_epochs_and_after_the_last() -> None:
    trainer = make_trainer(make_model(), callbacks=(metrics(),))
    trainer.train(TRAIN, 5, eval_dataset=VAL, per_device_batch_size=8, eval_every_n_epochs=2)
    history = trainer.run_history
    assert len(history.get_metric_values("train_loss_epoch")) == 5
    assert len(history.get_metric_values("eval_loss_epoch")) == 3  # after epochs 2, 4 and 5
    assert len(history.get_metric_values("mae")) == 3
    assert trainer.run_config is not None
    assert trainer.run_config.eval_every_n_epochs == 2


def test_epochs_without_evaluation_do_not_count_as_no_improvement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # nothing improves after the first evaluation: patience 2 runs out at the third one
    stopping = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=1e9)
    trainer = make_trainer(make_model(), callbacks=(stopping,))
    trainer.train(TRAIN, 9, eval_dataset=VAL, per_device_batch_size=8, eval_every_n_epochs=2)
    assert trainer.stopped_by is not None
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 6  # not 4 or 3
    assert stopping.early_stopping_patience_counter == 2
    assert "has no new value" not in caplog.text  # skipped epochs are expected


def test_evaluating_every_n_epochs_changes_no_weight() -> None:
    every, rarely = make_trainer(make_model()), make_trainer(make_model())
    torch.manual_seed(1)  # the same shuffling for both
    every.train(TRAIN, 3, eval_dataset=VAL, per_device_batch_size=8)
    torch.manual_seed(1)
    rarely.train(TRAIN, 3, eval_dataset=VAL, per_device_batch_size=8, eval_every_n_epochs=3)
    for a, b in zip(clone_params(every.model), clone_params(rarely.model), strict=True):
        assert torch.equal(a, b)


def test_the_sanity_evaluation_changes_neither_weights_nor_history() -> None:
    plain, checked = make_trainer(make_model()), make_trainer(make_model())
    recorder = SetRecorder()
    checked.callback_handler.add_callback(recorder)
    common: dict[str, Any] = {"eval_dataset": {"val": VAL, "ood": OOD}, "per_device_batch_size": 8}
    torch.manual_seed(1)  # the same shuffling for both
    plain.train(TRAIN, 2, **common)
    torch.manual_seed(1)
    checked.train(TRAIN, 2, sanity_eval_batches=1, **common)
    for a, b in zip(clone_params(plain.model), clone_params(checked.model), strict=True):
        assert torch.equal(a, b)
    assert plain.run_history.state_dict() == checked.run_history.state_dict()
    assert recorder.epochs[:4] == [
        ("start", "val", True),
        ("end", "val", True),
        ("start", "ood", True),
        ("end", "ood", True),
    ]
    assert recorder.steps[:2] == ["val", "ood"]  # one batch of each


class StepCounter(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps += 1


def test_the_sanity_evaluation_catches_a_broken_eval_set_before_training() -> None:
    counter = StepCounter()
    trainer = make_trainer(make_model(), callbacks=(counter,))
    broken = TensorDataset(VAL.tensors[0], VAL.tensors[1][:, :0])  # targets of the wrong shape
    with pytest.raises(ValueError, match="shape"):
        trainer.train(TRAIN, 2, eval_dataset=broken, sanity_eval_batches=2)
    assert counter.steps == 0


@pytest.mark.parametrize(
    ("eval_dataset", "error", "match"),
    [
        ({}, ValueError, r"eval_dataset must be a dataset or a non-empty mapping"),
        ({1: VAL}, TypeError, r"eval_dataset's key must be a name that starts with a letter"),
        ({"a b": VAL}, ValueError, r"eval_dataset's key must be a name.*got 'a b'"),
        ({"val": None}, TypeError, r"eval_dataset\['val'\] must be a dataset"),
        ({"val": object()}, TypeError, r"eval_dataset\['val'\] must be a map-style dataset"),
    ],
)
def test_bad_eval_sets_are_refused_before_training(
    eval_dataset: Any, error: type[Exception], match: str
) -> None:
    trainer = make_trainer(make_model())
    before = clone_params(trainer.model)
    with pytest.raises(error, match=rf"Trainer\.train: {match}"):
        trainer.train(TRAIN, 1, eval_dataset=eval_dataset)
    assert all(torch.equal(a, b) for a, b in zip(before, clone_params(trainer.model), strict=True))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"eval_every_n_epochs": 0}, ValueError, r"eval_every_n_epochs must be a positive int"),
        ({"eval_every_n_epochs": 1.5}, TypeError, r"eval_every_n_epochs must be a positive int"),
        ({"sanity_eval_batches": -1}, ValueError, r"sanity_eval_batches must be an int >= 0"),
        ({"sanity_eval_batches": True}, TypeError, r"sanity_eval_batches must be an int >= 0"),
    ],
)
def test_bad_evaluation_schedules_are_refused(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=rf"Trainer\.train: {match}"):
        make_trainer(make_model()).train(TRAIN, 1, eval_dataset=VAL, **kwargs)


def test_evaluate_refuses_a_bad_prefix_and_settings_for_a_dataloader_set() -> None:
    trainer = make_trainer(make_model())
    with pytest.raises(TypeError, match=r"Trainer\.evaluate: metric_prefix must be a string"):
        trainer.evaluate(VAL, metric_prefix=None)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"per_device_batch_size must be None when dataset\['b'\] is a DataLoader",
    ):
        trainer.evaluate({"a": VAL, "b": DataLoader(OOD)}, per_device_batch_size=4)
