"""The evaluate-and-predict example, run for real on a subset of the digits."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import load_example


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("evaluate_and_predict")


def test_two_eval_sets_then_evaluate_and_predict(example: ModuleType, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    results = example.main(["--subset", "600", "--num_epochs", "3", "--save_dir", str(tmp_path)])
    assert set(results) == {
        "val_accuracy",
        "noisy_accuracy",
        "test_loss",
        "test_accuracy",
        "predicted_accuracy",
    }
    assert results["val_accuracy"] > 0.6  # chance is 0.1
    assert results["noisy_accuracy"] < results["val_accuracy"]  # the shifted set is harder
    # predict()'s outputs give the accuracy evaluate() computed, sample for sample
    assert results["predicted_accuracy"] == pytest.approx(results["test_accuracy"], abs=1e-6)
    assert (tmp_path / "best.pt").is_file()


def test_the_run_history_keeps_each_set_apart(example: ModuleType, tmp_path: Path) -> None:
    args = example.parse_args(["--subset", "300", "--num_epochs", "3", "--save_dir", str(tmp_path)])
    trainer, test_metrics = example.train(args, tmp_path)
    history = trainer.run_history
    assert len(history.get_metric_values("train_loss_epoch")) == 3
    for name in ("val_eval_loss_epoch", "val_accuracy", "noisy_eval_loss_epoch", "noisy_accuracy"):
        assert len(history.get_metric_values(name)) == 2  # after epochs 2 and 3
    assert "accuracy" not in history.get_metric_names()
    assert set(test_metrics) == {"test_loss", "test_accuracy"}
