"""Bad input gets a clear error at the entry point: argument, value received, and fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

from pytorch_accel import Trainer

pytestmark = pytest.mark.bad_input  # the catalogue: make bad-inputs

DATA = make_regression_dataset(16)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"num_epochs": 0},
            ValueError,
            r"num_epochs must be a positive int or None, got 0 \(int\)\. Pass num_epochs >= 1",
        ),
        ({"num_epochs": 1.5}, TypeError, r"num_epochs must be a positive int or None, got 1.5"),
        ({"num_epochs": True}, TypeError, r"num_epochs must be a positive int or None, got True"),
        (
            {"per_device_batch_size": -2},
            ValueError,
            r"per_device_batch_size must be a positive int or None, got -2",
        ),
        (
            {"gradient_accumulation_steps": 0},
            ValueError,
            r"gradient_accumulation_steps must be a positive int, got 0",
        ),
        (
            {"max_num_train_steps": 0},
            ValueError,
            r"max_num_train_steps must be a positive int or None, got 0",
        ),
        (
            {"gradient_clip_value": -1.0},
            ValueError,
            r"gradient_clip_value must be a positive number or None",
        ),
        (
            {"max_grad_norm": "1"},
            TypeError,
            r"max_grad_norm must be a positive number or None, got '1' \(str\)",
        ),
        (
            {"gradient_clip_value": 1.0, "max_grad_norm": 1.0},
            ValueError,
            r"max_grad_norm must be None when gradient_clip_value is set, got 1.0 \(float\)\. "
            r"Clip either",
        ),
        (
            {"create_scheduler_fn": "cosine"},
            TypeError,
            r"create_scheduler_fn must be a callable or None, got 'cosine'",
        ),
        (
            {"train_dataloader_kwargs": [1]},
            TypeError,
            r"train_dataloader_kwargs must be a dict or None",
        ),
        (
            {"per_device_batch_size": 32},
            ValueError,
            r"train_dataset must be at least one batch per process \(32 x 1",
        ),
    ],
)
def test_bad_train_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    arguments = {"num_epochs": 1, **kwargs}
    with pytest.raises(error, match=rf"Trainer\.train: {match}"):
        make_trainer().train(DATA, **arguments)


def test_empty_and_unsized_datasets() -> None:
    empty = TensorDataset(torch.zeros(0, 4), torch.zeros(0, 1))
    with pytest.raises(ValueError, match=r"Trainer\.train: train_dataset must be non-empty"):
        make_trainer().train(empty, num_epochs=1)
    with pytest.raises(ValueError, match=r"Trainer\.train: eval_dataset must be non-empty"):
        make_trainer().train(DATA, num_epochs=1, eval_dataset=empty)

    class Stream(IterableDataset[Any]):
        def __iter__(self) -> Any:
            return iter(())

    with pytest.raises(TypeError, match=r"eval_dataset must be a map-style dataset with __len__"):
        make_trainer().train(DATA, num_epochs=1, eval_dataset=Stream())
    with pytest.raises(ValueError, match=r"max_num_train_steps must be a positive int when"):
        make_trainer().train(Stream(), num_epochs=1)  # a stream needs a budget in updates


@pytest.mark.parametrize(
    ("returned", "error", "match"),
    [
        (1.0, TypeError, r"calculate_train_batch_loss must return a dict .* got float"),
        (
            {"model_outputs": 1},
            ValueError,
            r"calculate_train_batch_loss returned a dict without \['loss', 'batch_size'\]",
        ),
        ({"loss": torch.tensor(1.0)}, ValueError, r"without \['batch_size'\]"),
    ],
)
def test_bad_batch_loss_output(returned: object, error: type[Exception], match: str) -> None:
    class BadTrainer(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> Any:
            return returned

    with pytest.raises(error, match=match):
        make_trainer(trainer_class=BadTrainer).train(DATA, num_epochs=1)


def test_bad_eval_batch_loss_output() -> None:
    class BadTrainer(Trainer):
        def calculate_eval_batch_loss(self, batch: Any) -> Any:
            return (1.0,)

    with pytest.raises(TypeError, match=r"Trainer\.calculate_eval_batch_loss must return a dict"):
        make_trainer(trainer_class=BadTrainer).evaluate(DATA)


def test_bad_constructor_arguments() -> None:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"Trainer: model must be a torch.nn.Module, got 'model'"):
        Trainer("model", nn.MSELoss(), optimizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Trainer: optimizer must be a torch.optim.Optimizer"):
        Trainer(model, nn.MSELoss(), [0.1])  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"Trainer: loss_func must be a callable or None, got 'mse'"
    ):
        Trainer(model, "mse", optimizer)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Trainer: run_history must be a RunHistory or None"):
        Trainer(model, nn.MSELoss(), optimizer, run_history={})  # type: ignore[arg-type]


def test_missing_loss_func_with_default_steps() -> None:
    model = make_model()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(
        TypeError,
        match=r"Trainer\.train: Trainer's loss_func must be a callable while "
        r"calculate_train_batch_loss is not overridden and the batches are not dicts, got None "
        r"\(NoneType\)\. Pass a loss function to Trainer\(\.\.\.\), or override that step "
        r"method \(with dict batches, the model's output may carry its own 'loss'",
    ):
        trainer.train(DATA, num_epochs=1)
    with pytest.raises(
        TypeError, match=r"calculate_train_batch_loss and calculate_eval_batch_loss are not"
    ):
        trainer.train(DATA, num_epochs=1, eval_dataset=DATA)
    with pytest.raises(TypeError, match=r"Trainer\.evaluate: .* calculate_eval_batch_loss is not"):
        trainer.evaluate(DATA)


def test_missing_loss_func_is_checked_per_default_step() -> None:
    class OwnTrainStep(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            inputs, targets = batch
            loss = nn.functional.mse_loss(self.model(inputs), targets)
            return {"loss": loss, "model_outputs": None, "batch_size": len(targets)}

    model = make_model()
    trainer = OwnTrainStep(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(DATA, num_epochs=1)  # only the overridden step runs: no loss_func needed
    assert trainer.num_updates > 0
    with pytest.raises(TypeError, match=r"while calculate_eval_batch_loss is not overridden"):
        trainer.train(DATA, num_epochs=1, eval_dataset=DATA)


def test_evaluate_without_any_dataset() -> None:
    with pytest.raises(ValueError, match=r"Trainer\.evaluate: dataset must be a dataset, got None"):
        make_trainer().evaluate()
    with pytest.raises(
        ValueError, match=r"Trainer\.evaluate: per_device_batch_size must be a positive int"
    ):
        make_trainer().evaluate(DATA, per_device_batch_size=0)


def test_accelerator_with_its_own_accumulation_is_rejected() -> None:
    from accelerate import Accelerator

    class AccumulatingTrainer(Trainer):
        def _create_accelerator(self) -> Accelerator:
            return Accelerator(gradient_accumulation_steps=4)

    with pytest.raises(
        ValueError, match=r"gradient_accumulation_steps must be 1 on the Accelerator, got 4"
    ):
        make_trainer(trainer_class=AccumulatingTrainer)


def test_dataloader_settings_that_give_no_batch() -> None:
    with pytest.raises(
        ValueError, match=r"train_dataloader_kwargs must be settings that give at least one batch"
    ):
        make_trainer().train(
            DATA, num_epochs=1, max_num_train_steps=3, train_dataloader_kwargs={"batch_sampler": []}
        )
