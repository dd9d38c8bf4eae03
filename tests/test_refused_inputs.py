"""Inputs that trained silently wrong or failed obscurely, now clear (issue 41, items 7-10, 12).

Token counts that are negative, NaN or not numbers; an empty pass under the default callbacks;
an evaluation whose every batch was skipped; a model returning a tuple, or a per-sample loss;
accelerate's own trackers, and a negative logging weight.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import (
    TinyTokenModel,
    VariableLengthTokens,
    counting_collate,
    make_model,
    make_regression_dataset,
)
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset, default_collate

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback


def trainer_of(kind: type[Trainer] = Trainer, **kwargs: Any) -> Trainer:
    model = make_model()
    return kind(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), **kwargs)


# ------------------------------------------------------------------ 7: token counts


class Counted(Trainer):
    """Returns ``num_items`` from ``counts``, one per step, round and round."""

    counts: tuple[Any, ...] = ()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        return {**output, "num_items": self.counts[self._state.step % len(self.counts)]}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("counts", "smallest"),
    [
        ((torch.tensor(-4),), "-4.0"),  # the epoch's loss was -3.92
        ((torch.tensor(4), torch.tensor(-4)), "-4.0"),  # mixed signs: a NaN loss
        ((torch.tensor(4.0), torch.tensor(math.nan)), "nan"),
    ],
)
def test_negative_or_nan_token_counts_on_the_device_are_refused_at_the_epoch_end(
    counts: tuple[Any, ...], smallest: str
) -> None:
    """Read where the epoch's loss is read: no host sync per step."""
    trainer = trainer_of(Counted)
    trainer.counts = counts  # type: ignore[attr-defined]
    with pytest.raises(
        ValueError,
        match=rf"Trainer\.train: batch_output\['num_items'\] .* must be at least 0; the "
        rf"smallest in this train epoch \(train_loss_epoch\) was {smallest}\. Return the number "
        r"of loss elements",
    ):
        trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert "train_loss_epoch" not in trainer.run_history.get_metric_names()


@pytest.mark.bad_input
@pytest.mark.parametrize("count", [-4, -0.5, math.nan, math.inf])
def test_negative_or_nan_token_counts_in_python_are_refused_at_once(count: float) -> None:
    trainer = trainer_of(Counted)
    trainer.counts = (count,)  # type: ignore[attr-defined]
    with pytest.raises(
        ValueError,
        match=r"Trainer\.calculate_train_batch_loss: batch_output\['num_items'\] must be the "
        rf"number of loss elements .*, at least 0, got {count!r}\. Count them",
    ):
        trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)


def string_count_collate(samples: list[Any]) -> dict[str, Any]:
    batch: dict[str, Any] = default_collate(samples)
    batch["num_items_in_batch"] = "12"
    return batch


@pytest.mark.bad_input
def test_a_string_token_count_in_a_dict_batch_is_refused_before_the_model_gets_it() -> None:
    """transformers raised a raw TypeError from inside the model's loss."""
    model = TinyTokenModel()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(
        TypeError,
        match=r"Trainer\.calculate_train_batch_loss: batch\['num_items_in_batch'\], returned "
        r"as batch_output\['num_items'\] must be the number of loss elements .* got str "
        r"\('12'\)",
    ):
        trainer.train(
            VariableLengthTokens(8),
            num_epochs=1,
            per_device_batch_size=2,
            collate_fn=string_count_collate,
        )


def test_valid_token_counts_still_train() -> None:
    model = TinyTokenModel()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(
        VariableLengthTokens(8),
        num_epochs=1,
        per_device_batch_size=2,
        collate_fn=counting_collate(),
    )
    assert math.isfinite(trainer.run_history.get_latest_metric("train_loss_epoch"))


# ------------------------------------------------------ 8: an empty pass, default callbacks


class EmptyStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(())


class GeneratorObject(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Returns the same generator object on every pass: the second pass is empty."""

    def __init__(self) -> None:
        data = make_regression_dataset(8)
        self.samples = (data[index] for index in range(len(data)))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.samples


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("dataset", "match"),
    [
        (EmptyStream, r"Epoch 1 got no batch .*: the dataset or stream is empty"),
        (GeneratorObject, r"Epoch 2 got no batch .*a generator function, not a generator object"),
    ],
)
def test_an_empty_pass_is_a_value_error_with_the_default_callbacks(
    dataset: type[IterableDataset[Any]], match: str
) -> None:
    """It was the "train_loss_epoch is nan" stop of TerminateOnNaNCallback."""
    trainer = trainer_of(callbacks=DEFAULT_CALLBACKS)
    with pytest.raises(ValueError, match=rf"Trainer\.train: train_dataset must be .*{match}"):
        trainer.train(dataset(), num_epochs=3, max_num_train_steps=20, per_device_batch_size=2)
    history = trainer.run_history
    recorded = (
        history.get_metric_values("train_loss_epoch")
        if "train_loss_epoch" in history.get_metric_names()
        else []
    )
    assert all(math.isfinite(loss) for loss in recorded)  # no NaN of the empty pass
    assert trainer.stopped_by is None


# ---------------------------------------------------- 9: every batch failed and was skipped


class AlwaysOutOfMemory(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        raise torch.OutOfMemoryError("no room")

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        raise torch.OutOfMemoryError("no room")


@pytest.mark.bad_input
def test_an_evaluation_whose_every_batch_was_skipped_raises_instead_of_a_nan_loss() -> None:
    trainer = trainer_of(AlwaysOutOfMemory)
    with pytest.raises(
        RuntimeError,
        match=r"Trainer\.evaluate: every evaluation batch of the epoch failed and was skipped "
        r"\(2 of 2; skip_failing_batches allows 10\), so it has no loss to record; the last: "
        r"OutOfMemoryError: no room\.",
    ):
        trainer.evaluate(
            make_regression_dataset(8), per_device_batch_size=4, skip_failing_batches=10
        )


@pytest.mark.bad_input
def test_a_training_epoch_whose_every_batch_was_skipped_raises_the_same() -> None:
    trainer = trainer_of(AlwaysOutOfMemory, callbacks=DEFAULT_CALLBACKS)
    with pytest.raises(
        RuntimeError, match=r"Trainer\.train: every training batch of the epoch failed"
    ):
        trainer.train(
            make_regression_dataset(8),
            num_epochs=1,
            per_device_batch_size=4,
            skip_failing_batches=10,
        )


# ------------------------------------------------- 10: tuple outputs and per-sample losses


class TupleModel(nn.Module):
    """``(loss, predictions)``, as transformers returns with ``return_dict=False``."""

    def __init__(self, per_sample: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)
        self.per_sample = per_sample

    def forward(
        self, inputs: torch.Tensor, labels: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        predictions = self.layer(inputs)
        if labels is None:
            return (predictions,)
        squared = (predictions - labels) ** 2
        return (squared.mean(dim=1) if self.per_sample else squared.mean(), predictions)


class DictModel(TupleModel):
    def forward(  # type: ignore[override]
        self, inputs: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        loss, predictions = super().forward(inputs, labels)
        return {"loss": loss, "logits": predictions}


class DictData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, with_labels: bool = True) -> None:
        self.data, self.with_labels = make_regression_dataset(16), with_labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        inputs, targets = self.data[index]
        return {"inputs": inputs, "labels": targets} if self.with_labels else {"inputs": inputs}


def train_without_loss_func(model: nn.Module, data: Any) -> Trainer:
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.05), callbacks=())
    trainer.train(data, num_epochs=2, per_device_batch_size=4)
    return trainer


def test_a_tuple_output_whose_first_element_is_the_loss_trains_as_a_dict_output_does() -> None:
    """transformers' convention: with labels and return_dict=False, outputs[0] is the loss."""
    tuple_run = train_without_loss_func(TupleModel(), DictData())
    dict_run = train_without_loss_func(DictModel(), DictData())
    history = "train_loss_epoch"
    assert tuple_run.run_history.get_metric_values(
        history
    ) == dict_run.run_history.get_metric_values(history)
    assert tuple_run.evaluate(DictData(), per_device_batch_size=4) == dict_run.evaluate(
        DictData(), per_device_batch_size=4
    )


@pytest.mark.bad_input
def test_a_tuple_output_without_a_loss_first_is_explained() -> None:
    with pytest.raises(
        ValueError,
        match=r"with loss_func=None the model returned a tuple of 2 and its first element, "
        r"where transformers puts the loss, is a tensor of shape \(4,\)\. Return the loss first",
    ):
        train_without_loss_func(TupleModel(per_sample=True), DictData())


@pytest.mark.bad_input
def test_a_tuple_output_of_a_batch_without_labels_says_so() -> None:
    with pytest.raises(ValueError, match=r"returned a tuple of 1 and the batch has no 'labels'"):
        train_without_loss_func(TupleModel(), DictData(with_labels=False))


class PerSampleLoss(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        inputs, targets = batch
        losses = ((self.model(inputs) - targets) ** 2).mean(dim=1)
        return {"loss": losses, "model_outputs": None, "batch_size": len(targets)}


@pytest.mark.bad_input
def test_a_per_sample_loss_is_told_to_reduce_it() -> None:
    """It was torch's "grad can be implicitly created only for scalar outputs"."""
    with pytest.raises(
        ValueError,
        match=r"Trainer\.calculate_train_batch_loss returned a loss of shape \(4,\), not one "
        r"number: .* Reduce it, e.g\. loss\.mean\(\)",
    ):
        trainer_of(PerSampleLoss).train(
            TensorDataset(*make_regression_dataset(8).tensors),
            num_epochs=1,
            per_device_batch_size=4,
        )


def test_a_transformers_model_with_return_dict_false_trains() -> None:
    pytest.importorskip("transformers")
    from helpers import make_tiny_gpt2

    class TupleGPT2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = make_tiny_gpt2()

        def forward(self, **batch: Any) -> Any:
            return self.model(**batch, return_dict=False)

    model = TupleGPT2()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(VariableLengthTokens(8), num_epochs=1, per_device_batch_size=4)
    assert math.isfinite(trainer.run_history.get_latest_metric("train_loss_epoch"))
    assert math.isfinite(
        trainer.evaluate(VariableLengthTokens(8), per_device_batch_size=4)["evaluation_loss"]
    )


# ------------------------------------------- 12: accelerate's trackers, the logging weight


@pytest.mark.bad_input
@pytest.mark.parametrize("log_with", ["tensorboard", ["wandb"]])
def test_accelerate_trackers_are_refused_pointing_to_the_tracking_callback(
    log_with: Any, tmp_path: Any
) -> None:
    """accelerate's trackers were accepted and never sent anything."""
    model = make_model()
    with pytest.raises(
        ValueError,
        match=r"Trainer: accelerator_kwargs\['log_with'\] must be left out \(the trainer sends "
        r"nothing to the Accelerator's trackers\), got .*TrackingCallback\(log_with=.*"
        r"docs/trackers\.md",
    ):
        Trainer(
            model,
            nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.1),
            accelerator_kwargs={"log_with": log_with, "project_dir": str(tmp_path)},
        )


class LogsWithWeight(TrainerCallback):
    def __init__(self, weight: Any) -> None:
        self.weight = weight

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.log("value", 1.0, weight=self.weight)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("weight", "error", "expected"),
    [
        (-1, ValueError, "a finite number at least 0"),
        (math.nan, ValueError, "a finite number at least 0"),
        (math.inf, ValueError, "a finite number at least 0"),
        (True, TypeError, "a number"),
        (torch.ones(2), ValueError, "a one-element tensor or a number"),
    ],
)
def test_a_negative_nan_or_non_numeric_logging_weight_is_refused(
    weight: Any, error: type[Exception], expected: str
) -> None:
    trainer = trainer_of(callbacks=(LogsWithWeight(weight),))
    with pytest.raises(
        error, match=rf"Trainer\.log: weight must be {expected}, got .*Pass e\.g\. weight="
    ):
        trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)


def test_a_zero_weight_is_accepted() -> None:
    """A process with nothing to report logs the name with weight 0 (docs/multi-process.md)."""
    trainer = trainer_of(callbacks=(LogsWithWeight(0),))
    trainer.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
    assert math.isnan(trainer.run_history.get_latest_metric("train_value_epoch"))
