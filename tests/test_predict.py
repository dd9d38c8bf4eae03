"""Trainer.predict in one process: every sample once, in order, on the CPU by default."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from pytorch_accel import PredictOutputsError, Trainer
from pytorch_accel.callbacks import TrainerCallback

DATA = make_regression_dataset(21)  # not a multiple of the batch size


def expected(trainer: Trainer, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return trainer.get_model()(inputs)


def test_outputs_in_dataset_order_model_mode_and_random_state_kept() -> None:
    trainer = make_trainer(nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)))
    trainer.model.train()
    state = torch.get_rng_state()
    predictions = trainer.predict(DATA, per_device_batch_size=4)
    assert torch.equal(torch.get_rng_state(), state)
    assert trainer.model.training  # eval mode only inside predict()
    trainer.model.eval()
    assert predictions.device.type == "cpu"
    assert torch.allclose(predictions, expected(trainer, DATA.tensors[0]))


class InputsOnly(Dataset[torch.Tensor]):
    def __init__(self, inputs: torch.Tensor) -> None:
        self.inputs = inputs

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.inputs[index]


def test_a_dataset_of_inputs_only_and_a_dataloader() -> None:
    trainer = make_trainer()
    inputs = DATA.tensors[0]
    reference = expected(trainer, inputs)
    assert torch.allclose(trainer.predict(InputsOnly(inputs), per_device_batch_size=5), reference)
    loader = DataLoader(TensorDataset(inputs), batch_size=6)
    assert torch.allclose(trainer.predict(loader), reference)


class Collect(TrainerCallback):
    def __init__(self) -> None:
        self.batches: list[torch.Tensor] = []
        self.events: list[str] = []

    def on_predict_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append("start")

    def on_predict_step_end(
        self, trainer: Trainer, batch: Any, predictions: Any, **kwargs: Any
    ) -> None:
        self.batches.append(predictions)

    def on_predict_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append("end")


def test_streaming_to_a_callback_without_keeping_the_outputs() -> None:
    collect = Collect()
    trainer = make_trainer(callbacks=(collect,))
    assert trainer.predict(DATA, per_device_batch_size=4, keep_outputs=False) is None
    assert collect.events == ["start", "end"]
    assert [len(batch) for batch in collect.batches] == [4, 4, 4, 4, 4, 1]
    assert torch.allclose(torch.cat(collect.batches), expected(trainer, DATA.tensors[0]))


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = make_model()

    def forward(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.body(inputs)
        return {"value": out, "doubled": 2 * out}


class Probabilities(Trainer):
    def calculate_predict_batch(self, batch: Any) -> Any:
        return torch.sigmoid(super().calculate_predict_batch(batch))


def test_structured_outputs_and_an_overridden_predict_step() -> None:
    trainer = make_trainer(TwoHeads())
    predictions = trainer.predict(DATA, per_device_batch_size=8)
    assert set(predictions) == {"value", "doubled"}
    assert torch.allclose(predictions["doubled"], 2 * predictions["value"])
    model = make_model()
    probabilities = Probabilities(model, nn.MSELoss(), torch.optim.SGD(model.parameters()), ())
    assert torch.allclose(
        probabilities.predict(DATA), torch.sigmoid(expected(probabilities, DATA.tensors[0]))
    )


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"data": DataLoader(DATA, batch_size=4), "per_device_batch_size": 4},
            ValueError,
            r"per_device_batch_size must be None when data is a DataLoader",
        ),
        (
            {"data": DataLoader(DATA, batch_size=4, shuffle=True)},
            ValueError,
            r"data must be a DataLoader that is not shuffled.*shuffle=False",
        ),
        (
            {"data": DATA, "dataloader_kwargs": {"shuffle": True}},
            ValueError,
            r"dataloader_kwargs\['shuffle'\] must be False",
        ),
        (
            {"data": DATA, "per_device_batch_size": 0},
            ValueError,
            r"per_device_batch_size must be a",
        ),
        ({"data": 3}, TypeError, r"data must be a map-style dataset"),
        ({"data": DATA, "batch_size": 4}, TypeError, r"unknown argument .batch_size.. Did you"),
    ],
)
def test_bad_predict_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=rf"Trainer\.predict: {match}"):
        make_trainer().predict(**kwargs)


class PredictInsideTraining(TrainerCallback):
    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.predict(DATA)


@pytest.mark.bad_input
def test_predict_from_inside_train_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"Trainer\.predict: called while train\(\) is running"):
        make_trainer(callbacks=(PredictInsideTraining(),)).train(DATA, num_epochs=1)


# ------------------------------------------------- outputs that cannot be concatenated (issue 29)


class Returning(Trainer):
    """Counts its predict batches; returns what ``shape`` makes of the model's outputs."""

    def __init__(self, shape: Any, callbacks: tuple[Any, ...] = ()) -> None:
        model = make_model()
        super().__init__(model, nn.MSELoss(), torch.optim.SGD(model.parameters()), callbacks)
        self.shape, self.calls = shape, 0

    def calculate_predict_batch(self, batch: Any) -> Any:
        self.calls += 1
        return self.shape(self.model(batch[0]), self.calls)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("shape", "error", "match"),
    [
        (lambda out, _: out.mean(), ValueError, r"a 0-d tensor as its output \(tensor\("),
        (
            lambda out, _: {"value": out, "label": ["cat"] * len(out)},
            TypeError,
            r"a str as outputs\['label'\]\[0\] \('cat'\)",
        ),
        (lambda out, _: (out, None), TypeError, r"a NoneType as outputs\[1\] \(None\)"),
    ],
)
def test_outputs_that_never_concatenate_fail_after_the_first_batch(
    shape: Any, error: type[Exception], match: str
) -> None:
    trainer = Returning(shape)
    with pytest.raises(error, match=rf"Trainer\.predict: calculate_predict_batch returned {match}"):
        trainer.predict(DATA, per_device_batch_size=4)
    assert trainer.calls == 1  # not the 6 batches, all lost, of before


@pytest.mark.bad_input
def test_outputs_of_varying_length_are_all_kept_in_the_error() -> None:
    trainer = Returning(lambda out, calls: out.repeat(1, calls))  # batch i: i + 1 columns
    with pytest.raises(
        PredictOutputsError, match=r"has shape \(4, 2\) in batch 1 and \(4, 1\) in batch 0"
    ) as info:
        trainer.predict(DATA, per_device_batch_size=4)
    batches = info.value.batches
    shapes = [tuple(batch.shape) for batch in batches]
    assert shapes == [(4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (1, 6)]
    reference = expected(trainer, DATA.tensors[0])
    assert torch.allclose(torch.cat([batch[:, :1] for batch in batches]), reference)


@pytest.mark.bad_input
def test_a_list_of_samples_is_a_structure_and_its_batches_are_kept() -> None:
    trainer = Returning(lambda out, _: list(out))  # one tensor per sample: 4, ..., 4, then 1
    with pytest.raises(
        PredictOutputsError, match=r"batch 5's outputs have another structure"
    ) as info:
        trainer.predict(DATA, per_device_batch_size=4)
    assert [len(batch) for batch in info.value.batches] == [4, 4, 4, 4, 4, 1]


def test_outputs_not_kept_are_not_checked() -> None:
    collect = Collect()
    trainer = Returning(lambda out, _: out.mean(), callbacks=(collect,))
    assert trainer.predict(DATA, per_device_batch_size=4, keep_outputs=False) is None
    assert [batch.ndim for batch in collect.batches] == [0] * 6
