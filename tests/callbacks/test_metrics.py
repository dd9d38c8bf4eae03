"""MetricsCallback in real training runs: names, values, custom preparation, edge cases."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryAccuracy, MulticlassAccuracy
from torchmetrics.regression import MeanSquaredError

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.metrics import MetricsCallback, default_prepare, metric_name_of


class CountSamples(Metric):
    """Counts the targets it is given: each sample must be seen exactly once."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("count", default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        self.count += targets.shape[0]

    def compute(self) -> torch.Tensor:
        return self.count


def classification_data(samples: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, 4, generator=generator)
    return TensorDataset(inputs, torch.randint(0, 3, (samples,), generator=generator))


def classifier_trainer(callbacks: tuple[Any, ...], lr: float = 0.1) -> Trainer:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    return Trainer(
        model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=lr), callbacks
    )


def accuracy_of(model: nn.Module, dataset: TensorDataset) -> float:
    inputs, targets = dataset.tensors
    with torch.no_grad():
        return (model(inputs).argmax(dim=1) == targets).float().mean().item()


def test_eval_accuracy_is_exact_and_named_after_the_metric_class() -> None:
    metrics = MetricsCallback(MulticlassAccuracy(num_classes=3, average="micro"))
    trainer = classifier_trainer((metrics,))
    eval_set = classification_data(21, seed=1)  # batches of 4: the last one is short
    trainer.train(
        classification_data(40), num_epochs=2, eval_dataset=eval_set, per_device_batch_size=4
    )
    values = trainer.run_history.get_metric_values("multiclass_accuracy")
    assert len(values) == 2
    assert isinstance(values[-1], float)
    assert values[-1] == accuracy_of(trainer.get_model(), eval_set)
    assert "train_multiclass_accuracy" not in trainer.run_history.get_metric_names()

    trainer.evaluate(eval_set)  # an evaluation run records under the same name
    assert trainer.run_history.get_metric_values("multiclass_accuracy")[-1] == values[-1]


def test_collection_with_prefixes_and_training_metrics_counts_every_sample_once() -> None:
    collection = {
        "accuracy": MulticlassAccuracy(num_classes=3, average="micro"),
        "n": CountSamples(),
    }
    metrics = MetricsCallback(collection, train=True, prefix="val_", train_prefix="fit_")
    trainer = classifier_trainer((metrics,), lr=0.0)  # fixed weights: train accuracy is exact
    train_set, eval_set = classification_data(30), classification_data(21, seed=1)
    trainer.train(train_set, num_epochs=2, eval_dataset=eval_set, per_device_batch_size=8)
    history = trainer.run_history
    assert {"val_accuracy", "val_n", "fit_accuracy", "fit_n"} <= history.get_metric_names()
    assert history.get_metric_values("val_n") == [21, 21]  # reset between epochs
    assert history.get_metric_values("fit_n") == [30, 30]
    assert history.get_latest_metric("val_accuracy") == accuracy_of(trainer.get_model(), eval_set)
    assert history.get_latest_metric("fit_accuracy") == accuracy_of(trainer.get_model(), train_set)
    assert metrics.train_metrics is not metrics.eval_metrics  # separate states


def test_default_prepare_passes_regression_outputs_through() -> None:
    metrics = MetricsCallback(MeanSquaredError())
    model = make_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=(metrics,)
    )
    trainer.train(
        make_regression_dataset(32),
        num_epochs=1,
        eval_dataset=make_regression_dataset(20, seed=1),
        per_device_batch_size=8,
    )
    history = trainer.run_history
    # MSE over the eval set is the sample-weighted mean of the batch losses
    assert history.get_latest_metric("mean_squared_error") == pytest.approx(
        history.get_latest_metric("eval_loss_epoch"), rel=1e-6
    )


def test_custom_prepare_argument_and_override() -> None:
    def positive(batch: Any, batch_output: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_output["model_outputs"].squeeze(1) > 0, batch[1].squeeze(1) > 0

    class Subclassed(MetricsCallback):
        def prepare(self, batch: Any, batch_output: Any) -> tuple[Any, Any]:
            return positive(batch, batch_output)

    by_argument = MetricsCallback(BinaryAccuracy(), name="sign_accuracy", prepare=positive)
    by_override = Subclassed(BinaryAccuracy(), name="sign_accuracy_2")
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(by_argument, by_override),
    )
    eval_set = make_regression_dataset(20, seed=1)
    trainer.train(make_regression_dataset(32), num_epochs=1, eval_dataset=eval_set)
    inputs, targets = eval_set.tensors
    with torch.no_grad():
        expected = ((model(inputs) > 0) == (targets > 0)).float().mean().item()
    assert trainer.run_history.get_latest_metric("sign_accuracy") == expected
    assert trainer.run_history.get_latest_metric("sign_accuracy_2") == expected


class EvaluateAtStep(TrainerCallback):
    """Starts an intermediate evaluation after the given training step of the first epoch."""

    def __init__(self, step: int) -> None:
        self.step, self.done = step, False

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if kwargs["step"] == self.step and not self.done:
            self.done = True
            trainer.run_eval_epoch()


def test_intermediate_evaluation_is_recorded_apart_and_leaves_training_metrics_alone() -> None:
    metrics = MetricsCallback({"n": CountSamples()}, train=True)
    trainer = classifier_trainer((metrics, EvaluateAtStep(step=1)))
    trainer.train(
        classification_data(32),
        num_epochs=1,
        eval_dataset=classification_data(12, seed=1),
        per_device_batch_size=4,
    )
    history = trainer.run_history
    assert history.get_metric_values("intermediate_n") == [12]
    assert history.get_metric_values("n") == [12]
    assert history.get_metric_values("train_n") == [32]  # not reset by the evaluation


class StopAtFirstStep(TrainerCallback):
    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        raise StopTrainingError("stop")


def test_an_epoch_without_updates_records_nothing() -> None:
    metrics = MetricsCallback(MulticlassAccuracy(num_classes=3), train=True)
    trainer = classifier_trainer((metrics, StopAtFirstStep()))
    trainer.train(classification_data(16), num_epochs=1, eval_dataset=classification_data(8))
    assert not {n for n in trainer.run_history.get_metric_names() if "accuracy" in n}


def test_metrics_move_to_the_device_and_do_not_sync_themselves() -> None:
    metric = MulticlassAccuracy(num_classes=3)
    metrics = MetricsCallback(MetricCollection([metric]))
    trainer = classifier_trainer((metrics,))
    trainer.evaluate(classification_data(8))
    assert metric.device == trainer.device
    assert metric.distributed_available_fn() is False  # inputs are gathered already
    # the collection's key, with evaluate()'s prefix
    assert "evaluation_MulticlassAccuracy" in trainer.run_history.get_metric_names()


def test_names_and_prepare_defaults() -> None:
    assert metric_name_of(MulticlassAccuracy(num_classes=3)) == "multiclass_accuracy"
    assert metric_name_of(MeanSquaredError()) == "mean_squared_error"
    logits, targets = torch.tensor([[0.1, 0.9], [2.0, -1.0]]), torch.tensor([1, 0])
    predictions, same_targets = default_prepare((None, targets), {"model_outputs": logits})
    assert predictions.tolist() == [1, 0]
    assert same_targets is targets
    with pytest.raises(
        ValueError, match=r"no 'model_outputs'.*pass MetricsCallback\(\.\.\., prepare="
    ):
        default_prepare((None, targets), {"loss": 0.0})


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"metrics must be a torchmetrics Metric"):
        MetricsCallback(nn.Linear(1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"name must be None with a MetricCollection"):
        MetricsCallback({"a": MeanSquaredError()}, name="mse")
    with pytest.raises(TypeError, match=r"prepare must be a callable"):
        MetricsCallback(MeanSquaredError(), prepare="argmax")  # type: ignore[arg-type]
