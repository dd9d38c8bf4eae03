"""A catalogue of bad inputs, grouped by entry point: each gets a clear error (or a warning).

Every message names the call, the argument, the value received and the fix. The cases here
were silent, confusing or late before (see tests/test_errors.py for the older catalogue).
"""

from __future__ import annotations

import functools
import math
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from torch import nn
from torch.utils.data import Dataset

from pytorch_accel import Trainer, TrainerPlaceholderValues
from pytorch_accel.callbacks import (
    EarlyStoppingCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    StopTrainingError,
    TerminateOnNaNCallback,
    TrainerCallback,
)

pytestmark = pytest.mark.bad_input  # the catalogue: make bad-inputs

DATA = make_regression_dataset(16)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05)


# ------------------------------------------------------------------------------ Trainer(...)


@pytest.mark.parametrize("callbacks", [None, "ProgressBarCallback", 3])
def test_callbacks_that_are_not_an_iterable_of_callbacks(callbacks: Any) -> None:
    model = make_model()
    with pytest.raises(TypeError, match=r"Trainer: callbacks must be an iterable of callbacks"):
        Trainer(model, nn.MSELoss(), sgd(model), callbacks=callbacks)


@pytest.mark.parametrize("callback", ["ProgressBarCallback", print, object()])
def test_a_callback_that_is_not_a_callback(callback: object) -> None:
    with pytest.raises(TypeError, match=r"a callback must be a TrainerCallback instance or class"):
        make_trainer(callbacks=(callback,))


def test_a_model_without_parameters() -> None:
    with pytest.raises(ValueError, match=r"Trainer: model must have parameters to train"):
        Trainer(nn.ReLU(), nn.MSELoss(), torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1))


def test_an_optimizer_over_another_models_parameters() -> None:
    with pytest.raises(ValueError, match=r"optimizer must be over the model's parameters"):
        Trainer(make_model(), nn.MSELoss(), sgd(make_model()))


# --------------------------------------------------------------------- callback registration


class NoPrefix(TrainerCallback):
    def train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        pass


class Capitalised(TrainerCallback):
    def On_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:  # noqa: N802
        pass


class NoKwargs(TrainerCallback):
    def on_train_epoch_end(self, trainer: Trainer) -> None:  # type: ignore[override]
        pass


@pytest.mark.parametrize(
    ("callback", "error", "match"),
    [
        (NoPrefix, ValueError, r"NoPrefix.train_epoch_end looks like the event 'on_train_epoch"),
        (Capitalised, ValueError, r"On_train_epoch_end looks like the event 'on_train_epoch_end'"),
        (NoKwargs, TypeError, r"NoKwargs.on_train_epoch_end must accept \*\*kwargs"),
    ],
)
def test_event_methods_that_would_never_or_wrongly_be_called(
    callback: type[TrainerCallback], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_trainer(callbacks=(callback(),))


# ------------------------------------------------------------------------------ train(...)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reset_run_history": "no"}, TypeError, r"reset_run_history must be True or False"),
        ({"resume_from": 123}, TypeError, r"resume_from must be a directory path, 'latest'"),
        ({"batch_size": 32}, TypeError, r"unknown argument 'batch_size'. Did you mean per_dev"),
        ({"epochs": 2}, TypeError, r"unknown argument 'epochs'. Did you mean num_epochs"),
    ],
)
def test_bad_train_keywords(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=rf"Trainer\.train: {match}"):
        make_trainer().train(DATA, **{"num_epochs": 1, **kwargs})


def test_unknown_evaluate_keyword() -> None:
    with pytest.raises(TypeError, match=r"Trainer\.evaluate: unknown argument 'batch_size'"):
        make_trainer().evaluate(DATA, batch_size=4)


@pytest.mark.parametrize(
    ("attribute", "value", "extra"),
    [
        ("limit_train_batches", 0, {}),
        ("limit_train_batches", -1, {}),
        ("limit_train_batches", 0, {"max_num_train_steps": 3}),
        ("limit_eval_batches", 0, {"eval_dataset": DATA}),
    ],
)
def test_batch_limits_that_are_not_positive(
    attribute: str, value: int, extra: dict[str, Any]
) -> None:
    trainer = make_trainer()
    setattr(trainer, attribute, value)
    with pytest.raises(ValueError, match=rf"trainer\.{attribute} must be a positive int"):
        trainer.train(DATA, num_epochs=1, **extra)


class Reentering(TrainerCallback):
    def __init__(self, call: str) -> None:
        self.call = call

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.call == "train":
            trainer.train(DATA, num_epochs=1)
        else:
            trainer.evaluate(DATA)


@pytest.mark.parametrize("call", ["train", "evaluate"])
def test_train_or_evaluate_from_inside_train(call: str) -> None:
    trainer = make_trainer(callbacks=(Reentering(call),))
    with pytest.raises(RuntimeError, match=rf"Trainer\.{call}: called while train\(\) is running"):
        trainer.train(DATA, num_epochs=1)


def test_an_eval_set_that_gives_no_batch() -> None:
    with pytest.raises(
        ValueError, match=r"eval_dataloader_kwargs must be settings that give at least one batch"
    ):
        make_trainer().train(
            DATA,
            num_epochs=1,
            eval_dataset=make_regression_dataset(4),
            eval_dataloader_kwargs={"drop_last": True},
        )
    with pytest.raises(ValueError, match=r"Trainer\.evaluate: dataloader_kwargs must be settings"):
        make_trainer().evaluate(make_regression_dataset(4), dataloader_kwargs={"drop_last": True})


def test_a_loss_that_does_not_reduce() -> None:
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(reduction="none"), sgd(model), callbacks=())
    with pytest.raises(ValueError, match=r"loss_func must be a loss that reduces to one value"):
        trainer.train(DATA, num_epochs=1)
    with pytest.raises(ValueError, match=r"Trainer\.evaluate: .* reduces to one value"):
        trainer.evaluate(DATA)


@pytest.mark.parametrize(
    ("factory", "error", "match"),
    [
        (lambda: None, TypeError, r"create_scheduler_fn could not be called with the optimizer"),
        (lambda optimizer: None, ValueError, r"create_scheduler_fn's result must be a scheduler"),
        (
            lambda optimizer: 5,
            TypeError,
            r"create_scheduler_fn's result must be a scheduler \(an object with a step\(\) "
            r"method\), got 5 \(int\)\. Return a scheduler built on the optimizer",
        ),
        (
            functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=3),
            ValueError,
            r"OneCycleLR.total_steps must be at least this run's 4 optimizer updates, got 3",
        ),
        (
            functools.partial(
                torch.optim.lr_scheduler.StepLR,
                step_size=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH / 3,
            ),
            ValueError,
            r"create_scheduler_fn's StepLR argument step_size must be an int, got 0.666\d* "
            r"\(float\) .* Use // instead of /",
        ),
    ],
)
def test_bad_scheduler_factories(factory: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=rf"Trainer\.train: {match}"):
        make_trainer().train(
            DATA, num_epochs=2, per_device_batch_size=8, create_scheduler_fn=factory
        )


def test_a_misspelt_placeholder_lists_the_valid_ones() -> None:
    with pytest.raises(
        AttributeError, match=r"no placeholder 'NUM_EPOCH'. Did you mean NUM_EPOCHS"
    ):
        TrainerPlaceholderValues.NUM_EPOCH  # noqa: B018


# ------------------------------------------------------------------- the default step methods


class Items(Dataset[Any]):
    def __init__(self, make: Any) -> None:
        self.make = make

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        return self.make(torch.randn(4))


@pytest.mark.parametrize(
    ("dataset", "layout"),
    [
        (Items(lambda x: x), "a Tensor"),
        (Items(lambda x: (x,)), "a list of 1"),
    ],
)
def test_batches_the_default_steps_cannot_read(dataset: Dataset[Any], layout: str) -> None:
    with pytest.raises(
        TypeError,
        match=rf"calculate_train_batch_loss: the default step reads batches as \(inputs, "
        rf"targets\), got {layout}\. .*override calculate_train_batch_loss",
    ):
        make_trainer().train(dataset, num_epochs=1, per_device_batch_size=4)
    with pytest.raises(TypeError, match=rf"calculate_eval_batch_loss: .* got {layout}"):
        make_trainer().evaluate(dataset, per_device_batch_size=4)


def test_a_dict_batch_without_labels_for_the_loss_func() -> None:
    dataset = Items(lambda x: {"inputs": x, "targets": x[:1]})
    with pytest.raises(
        ValueError,
        match=r"calculate_train_batch_loss: with a loss_func, a dict batch gives the targets as "
        r"'labels', got keys \['inputs', 'targets'\]\. Add 'labels' to the batch",
    ):
        make_trainer().train(dataset, num_epochs=1, per_device_batch_size=4)
    with pytest.raises(ValueError, match=r"calculate_eval_batch_loss: .* got keys \['inputs'"):
        make_trainer().evaluate(dataset, per_device_batch_size=4)


def test_a_python_float_loss() -> None:
    model = make_model()
    trainer = Trainer(model, lambda out, y: float(nn.functional.mse_loss(out, y)), sgd(model), ())
    with pytest.raises(TypeError, match=r"returned a loss of type float .* not loss.item\(\)"):
        trainer.train(DATA, num_epochs=1)


def test_a_loss_that_does_not_require_grad() -> None:
    model = make_model()
    optimizer = sgd(model)
    model.requires_grad_(False)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    with pytest.raises(ValueError, match=r"returned a loss that does not require grad .* frozen"):
        trainer.train(DATA, num_epochs=1)


def test_targets_that_broadcast_against_the_outputs() -> None:
    inputs, targets = DATA.tensors
    flat = torch.utils.data.TensorDataset(inputs, targets.squeeze(1))  # (B,) against (B, 1)
    with pytest.raises(ValueError, match=r"Trainer\.train: the loss function got outputs and tar"):
        make_trainer().train(flat, num_epochs=1)
    with pytest.raises(ValueError, match=r"Trainer\.evaluate: .* different shapes"):
        make_trainer().evaluate(flat)


# ----------------------------------------------------------------------------- checkpoints


def test_checkpoint_kwargs_that_would_not_load(tmp_path: Path) -> None:
    trainer = make_trainer()
    with pytest.raises(
        TypeError, match=r"save_checkpoint: checkpoint_kwargs\['source'\] is a PosixPath.*str\(p"
    ):
        trainer.save_checkpoint(tmp_path / "model.pt", checkpoint_kwargs={"source": tmp_path})
    assert not (tmp_path / "model.pt").exists()


def test_a_checkpoint_of_another_optimizer_loads_nothing(tmp_path: Path) -> None:
    make_trainer().save_checkpoint(tmp_path / "sgd.pt")  # SGD with momentum 0
    adamw = make_trainer(make_model(seed=1), optimizer_class=torch.optim.AdamW)
    before = [p.clone() for p in adamw.model.parameters()]
    with pytest.raises(
        ValueError,
        match=r"'.*sgd.pt' does not fit this optimizer: it was saved by another kind of "
        r"optimizer \(with settings \['dampening', 'momentum', 'nesterov'\]",
    ):
        adamw.load_checkpoint(tmp_path / "sgd.pt")
    assert all(torch.equal(a, b) for a, b in zip(adamw.model.parameters(), before, strict=True))
    adamw.load_checkpoint(tmp_path / "sgd.pt", load_optimizer=False)  # the weights alone fit


# ----------------------------------------------------------------------- callback arguments


def test_save_paths_of_the_wrong_kind(tmp_path: Path) -> None:
    a_file = tmp_path / "states"
    a_file.write_text("not a directory")
    with pytest.raises(ValueError, match=r"save_dir must be a directory path.*an existing file"):
        SaveTrainingStateCallback(a_file)
    with pytest.raises(ValueError, match=r"save_path must be a file path.*an existing directory"):
        SaveBestModelCallback(tmp_path)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP])
def test_preemption_signals_that_cannot_be_caught(signum: int) -> None:
    with pytest.raises(ValueError, match=r"preemption_signals must be signals a process can catch"):
        SaveTrainingStateCallback(preemption_signals=(signal.SIGTERM, signum))


@pytest.mark.parametrize("interval", [-1.0, float("nan"), "soon"])
def test_a_preemption_check_interval_that_is_no_duration(interval: Any) -> None:
    with pytest.raises((TypeError, ValueError), match=r"preemption_check_interval"):
        SaveTrainingStateCallback(preemption_check_interval=interval)


def test_async_save_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match=r"SaveTrainingStateCallback.*async_save.*'yes'"):
        SaveTrainingStateCallback(async_save="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("callback", [EarlyStoppingCallback, SaveBestModelCallback])
def test_watching_a_score_without_a_direction_warns(callback: Any) -> None:
    with pytest.warns(UserWarning, match=r"watching 'accuracy' as lower-is-better"):
        callback(watch_metric="accuracy")
    with warnings.catch_warnings():  # an explicit direction, or a loss: no warning
        warnings.simplefilter("error")
        callback(watch_metric="accuracy", greater_is_better=True)
        callback(watch_metric="eval_loss_epoch")
        callback(watch_metric="accuracy", greater_is_better=False)


def test_an_eval_set_named_train_would_mix_with_the_training_metrics() -> None:
    with pytest.raises(
        ValueError,
        match=r"Trainer\.train: eval_dataset's key must be a name other than 'train', got "
        r"'train' \(str\)\. 'train_' is the prefix of training metrics",
    ):
        make_trainer().train(DATA, num_epochs=1, eval_dataset={"train": DATA, "val": DATA})


# ------------------------------------------------------------------------------ predict(...)


def test_keep_outputs_that_is_not_a_bool() -> None:
    with pytest.raises(
        TypeError,
        match=r"Trainer\.predict: keep_outputs must be a bool, got 'no' \(str\)\. Pass "
        r"keep_outputs=True or keep_outputs=False\.",
    ):
        make_trainer().predict(DATA, keep_outputs="no")  # type: ignore[arg-type]


def test_predict_refuses_to_drop_samples() -> None:
    trainer = make_trainer()
    with pytest.raises(
        ValueError,
        match=r"Trainer\.predict: dataloader_kwargs\['drop_last'\] must be False, got True "
        r"\(bool\)\. predict\(\) returns an output for every sample",
    ):
        trainer.predict(DATA, per_device_batch_size=5, dataloader_kwargs={"drop_last": True})
    loader = torch.utils.data.DataLoader(DATA, batch_size=5, drop_last=True)
    with pytest.raises(ValueError, match=r"Trainer\.predict: data must be a DataLoader that keeps"):
        trainer.predict(loader)
    assert trainer.predict(DATA, per_device_batch_size=5).shape[0] == len(DATA)


# ------------------------------------------------------------------------------ streams


class _Stream(torch.utils.data.IterableDataset[Any]):
    def __iter__(self) -> Any:
        for index in range(16):
            yield DATA[index]


def test_several_workers_over_a_stream_warn_that_each_replays_it() -> None:
    trainer = make_trainer()
    with pytest.warns(UserWarning, match=r"IterableDataset with num_workers=2: each worker"):
        trainer.train(
            _Stream(),
            max_num_train_steps=2,
            per_device_batch_size=4,
            train_dataloader_kwargs={"num_workers": 2},
        )
    with warnings.catch_warnings():  # one worker reads the stream once: no warning
        warnings.simplefilter("error")
        trainer.train(_Stream(), max_num_train_steps=2, per_device_batch_size=4)


# -------------------------------------------------------------------------- the run's outcome


def test_an_early_stop_is_visible_on_the_trainer() -> None:
    model = make_model()
    nan_loss = lambda out, y: nn.functional.mse_loss(out, y) * 0 + math.nan  # noqa: E731
    trainer = Trainer(model, nan_loss, sgd(model), callbacks=(TerminateOnNaNCallback(),))
    trainer.train(DATA, num_epochs=3)
    assert isinstance(trainer.stopped_by, StopTrainingError)
    assert "nan" in str(trainer.stopped_by).lower()
    trainer.loss_func = nn.MSELoss()
    trainer.train(DATA, num_epochs=1)
    assert trainer.stopped_by is None
