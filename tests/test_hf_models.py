"""Hugging Face models and dict batches through the default step methods, with no subclass.

A ``transformers`` model built from a tiny config (never downloaded), a hand-written module
returning a dict, and a ``loss_func`` over dict batches: train, evaluate, predict and
``MetricsCallback`` work as they do for ``(inputs, targets)`` batches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import TokenDataset, make_tiny_bert
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, MetricsCallback

transformers = pytest.importorskip("transformers")
torchmetrics = pytest.importorskip("torchmetrics")

UNSHUFFLED = {"shuffle": False}


def test_a_transformers_model_trains_evaluates_and_predicts_with_no_subclass() -> None:
    data = TokenDataset(24)
    model = make_tiny_bert()
    accuracy = MetricsCallback(torchmetrics.classification.MulticlassAccuracy(2, average="micro"))
    trainer = Trainer(
        model, None, torch.optim.AdamW(model.parameters(), lr=1e-3), (*DEFAULT_CALLBACKS, accuracy)
    )
    trainer.train(
        data, num_epochs=2, eval_dataset=TokenDataset(16, seed=1), per_device_batch_size=8
    )

    history = trainer.run_history
    assert len(history.get_metric_values("train_loss_epoch")) == 2
    assert 0 <= history.get_latest_metric("multiclass_accuracy") <= 1
    results = trainer.evaluate(TokenDataset(16, seed=2))
    assert set(results) >= {"evaluation_loss", "evaluation_multiclass_accuracy"}
    logits = trainer.predict(TokenDataset(10, seed=3), per_device_batch_size=4)
    assert isinstance(logits, torch.Tensor)
    assert logits.shape == (10, 2)


def test_the_loss_of_dict_batches_is_the_models_and_the_weights_match_a_hand_written_loop() -> None:
    data = TokenDataset(16)
    reference = make_tiny_bert()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference.train()
    for _ in range(2):
        for batch in DataLoader(data, batch_size=4):
            reference(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    model = make_tiny_bert()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.train(data, num_epochs=2, per_device_batch_size=4, train_dataloader_kwargs=UNSHUFFLED)
    for ours, theirs in zip(trainer.get_model().parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


class DictModule(nn.Module):
    """A hand-written module that takes keyword inputs and returns a dict, loss included."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.linear(features)
        out: dict[str, Any] = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def dict_collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {
        "features": torch.stack([s[0] for s in samples]),
        "labels": torch.stack([s[1] for s in samples]),
    }


def classification_data(num_samples: int = 20) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(num_samples, 4, generator=generator)
    return TensorDataset(features, features.argmax(1).clamp(max=2))


def test_a_module_returning_a_dict_with_its_loss() -> None:
    torch.manual_seed(0)
    model = DictModule()
    accuracy = MetricsCallback(torchmetrics.classification.MulticlassAccuracy(3, average="micro"))
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), (accuracy,))
    data = classification_data()
    trainer.train(data, num_epochs=2, eval_dataset=data, collate_fn=dict_collate)
    assert trainer.run_history.get_latest_metric("eval_loss_epoch") > 0
    assert 0 <= trainer.run_history.get_latest_metric("multiclass_accuracy") <= 1
    predictions = trainer.predict(data, collate_fn=dict_collate)
    assert predictions.shape == (20, 3)  # the logits, not the dict


def test_a_loss_func_over_dict_batches_reads_the_labels() -> None:
    torch.manual_seed(0)
    model = DictModule()
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    data = classification_data()
    trainer.train(data, num_epochs=1, eval_dataset=data, collate_fn=dict_collate)
    inputs, targets = data.tensors
    with torch.no_grad():
        expected = nn.functional.cross_entropy(trainer.get_model()(inputs)["logits"], targets)
    assert trainer.evaluate(data, collate_fn=dict_collate)["evaluation_loss"] == pytest.approx(
        expected.item(), abs=1e-6
    )


@pytest.mark.bad_input
def test_a_dict_batch_without_labels_and_a_loss_func_is_a_clear_error() -> None:
    model = DictModule()
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())

    def features_only(samples: list[Any]) -> dict[str, torch.Tensor]:
        return {"features": torch.stack([s[0] for s in samples])}

    with pytest.raises(
        ValueError,
        match=r"calculate_train_batch_loss: with a loss_func, a dict batch gives the targets as "
        r"'labels', got keys \['features'\]",
    ):
        trainer.train(classification_data(), num_epochs=1, collate_fn=features_only)


@pytest.mark.bad_input
def test_a_model_output_without_a_loss_and_no_loss_func_is_a_clear_error() -> None:
    model = DictModule()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())

    def features_only(samples: list[Any]) -> dict[str, torch.Tensor]:
        return {"features": torch.stack([s[0] for s in samples])}

    with pytest.raises(
        ValueError,
        match=r"calculate_train_batch_loss: with loss_func=None the model's output must carry "
        r"its loss \('loss'\), got dict without one \(batch keys \['features'\]\)\. Put the "
        r"targets in the batch as 'labels'",
    ):
        trainer.train(classification_data(), num_epochs=1, collate_fn=features_only)
    assert trainer.num_updates == 0


@pytest.mark.bad_input
def test_no_loss_func_with_tuple_batches_from_a_stream_is_a_clear_error() -> None:
    class Stream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
        def __iter__(self) -> Any:
            return iter(classification_data())

    model = DictModule()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())
    with pytest.raises(
        TypeError,
        match=r"Trainer\.calculate_train_batch_loss: Trainer's loss_func is None, which the "
        r"default step accepts only for dict batches .* got a list batch",
    ):
        trainer.train(Stream(), max_num_train_steps=2)
