"""skip_failing_batches in evaluate(), the eval epochs of train(), and predict()."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from test_failing_batches import RunsOutOfMemory, collate, poisoned, trainer, without
from torch.utils.data import DataLoader

from pytorch_accel import SkipFailingBatches, Trainer
from pytorch_accel.callbacks import TrainerCallback


def test_evaluate_skips_failing_batches_and_counts_them() -> None:
    base = make_model()
    guarded = trainer(RunsOutOfMemory(copy.deepcopy(base)))
    results = guarded.evaluate(poisoned((2, 9)), per_device_batch_size=4, skip_failing_batches=3)
    reference = trainer(copy.deepcopy(base)).evaluate(without((2, 9)), per_device_batch_size=4)
    assert results["evaluation_skipped_batches"] == 2
    assert results["evaluation_loss"] == pytest.approx(reference["evaluation_loss"], rel=1e-6)
    with pytest.raises(torch.OutOfMemoryError):  # without the policy: fails as before
        guarded.evaluate(poisoned((2,)), per_device_batch_size=4)


class SkippedEvalSteps(TrainerCallback):
    def __init__(self) -> None:
        self.skipped = 0

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        self.skipped += bool(batch_output.get("skipped"))


def test_the_eval_epochs_of_train_follow_its_policy_with_a_limit_per_epoch() -> None:
    base = make_model()
    steps = SkippedEvalSteps()
    guarded = trainer(RunsOutOfMemory(copy.deepcopy(base)), steps)
    arguments: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 4, "seed": 0}
    # 2 failing eval batches per epoch, 4 over the run: the limit (3) counts per eval epoch
    guarded.train(
        make_regression_dataset(32),
        eval_dataset=poisoned((2, 9)),
        skip_failing_batches=3,
        **arguments,
    )
    reference = trainer(copy.deepcopy(base))
    reference.train(make_regression_dataset(32), eval_dataset=without((2, 9)), **arguments)
    history = guarded.run_history
    assert history.get_metric_values("eval_skipped_batches") == [2, 2]
    assert history.get_metric_values("train_skipped_batches") == [0, 0]
    assert history.get_metric_values("eval_loss_epoch") == pytest.approx(
        reference.run_history.get_metric_values("eval_loss_epoch"), rel=1e-6
    )
    assert steps.skipped == 4
    failing = trainer(RunsOutOfMemory(make_model()))
    with pytest.raises(RuntimeError, match=r"Trainer.train: 2 evaluation batches failed in one"):
        failing.train(
            make_regression_dataset(32),
            eval_dataset=poisoned((2, 9)),
            skip_failing_batches=1,
            **arguments,
        )


class PredictSteps(TrainerCallback):
    def __init__(self) -> None:
        self.skipped: list[bool] = []

    def on_predict_step_end(
        self, trainer: Trainer, batch: Any, predictions: Any, **kwargs: Any
    ) -> None:
        self.skipped.append(kwargs.get("skipped", False))
        assert (predictions is None) == kwargs.get("skipped", False)


def test_predict_skips_failing_and_empty_batches_and_says_which(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = make_model()
    steps = PredictSteps()
    guarded = trainer(RunsOutOfMemory(copy.deepcopy(base)), steps)
    logger = logging.getLogger("pytorch_accel")
    logger.addHandler(caplog.handler)
    try:
        outputs = guarded.predict(poisoned((2, 9)), per_device_batch_size=4, skip_failing_batches=5)
    finally:
        logger.removeHandler(caplog.handler)
    expected = trainer(copy.deepcopy(base)).predict(without((2, 9)), per_device_batch_size=4)
    assert torch.equal(outputs, expected)  # 56 rows: the samples of batches 2 and 9 are missing
    assert guarded.run_history.get_latest_metric("predict_skipped_batches") == [2, 9]
    assert [i for i, skipped in enumerate(steps.skipped) if skipped] == [2, 9]
    assert "Trainer.predict: skipped batches [2, 9]" in caplog.text
    # an empty batch (skip_empty), and a clean prediction records an empty list
    data = make_regression_dataset(8)
    loader = DataLoader(data, batch_sampler=[[0, 1, 2, 3], [], [4, 5, 6, 7]], collate_fn=collate)  # type: ignore[arg-type]
    policy = SkipFailingBatches(max_skipped=1)
    assert guarded.predict(loader, skip_failing_batches=policy).shape == (8, 1)
    assert guarded.run_history.get_latest_metric("predict_skipped_batches") == [1]
    guarded.predict(data, skip_failing_batches=1)
    assert guarded.run_history.get_latest_metric("predict_skipped_batches") == []


def test_the_policy_of_train_does_not_carry_over_to_a_later_evaluate_or_predict() -> None:
    guarded = trainer(RunsOutOfMemory(make_model()))
    guarded.train(poisoned((1,)), num_epochs=1, per_device_batch_size=4, skip_failing_batches=3)
    assert guarded.run_history.get_metric_values("train_skipped_batches") == [1]
    with pytest.raises(torch.OutOfMemoryError):
        guarded.evaluate(poisoned((1,)), per_device_batch_size=4)
    with pytest.raises(torch.OutOfMemoryError):
        guarded.predict(poisoned((1,)), per_device_batch_size=4)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("entry", "value", "error", "match"),
    [
        ("evaluate", "all", TypeError, r"Trainer.evaluate: skip_failing_batches must be None"),
        ("predict", 0, ValueError, r"Trainer.predict: skip_failing_batches must be a positive"),
    ],
)
def test_bad_policies_are_refused_by_evaluate_and_predict(
    entry: str, value: object, error: type[Exception], match: str
) -> None:
    method = getattr(trainer(make_model()), entry)
    with pytest.raises(error, match=match):
        method(make_regression_dataset(8), skip_failing_batches=value)
