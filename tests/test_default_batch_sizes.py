"""evaluate() and predict() batch by the last train()'s per-device batch size (else 8)."""

from __future__ import annotations

from typing import Any

import torch
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.utils.data import DataLoader

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback


class CountSteps(TrainerCallback):
    """Counts evaluation and prediction steps."""

    def __init__(self) -> None:
        self.eval_steps = 0
        self.predict_steps = 0

    def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.eval_steps += 1

    def on_predict_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.predict_steps += 1

    def steps(self, run: Any) -> tuple[int, int]:
        self.eval_steps = self.predict_steps = 0
        run()
        return self.eval_steps, self.predict_steps


def test_evaluate_and_predict_batch_as_the_last_train() -> None:
    counter = CountSteps()
    model = make_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(counter,)
    )
    data = make_regression_dataset(32)

    def evaluate_then_predict() -> None:
        trainer.evaluate(data)
        trainer.predict(data)

    assert counter.steps(evaluate_then_predict) == (4, 4)  # before any train(): 8
    trainer.train(data, num_epochs=1, per_device_batch_size=2)
    assert counter.steps(evaluate_then_predict) == (16, 16)  # the training's 2
    trainer.train(data, num_epochs=1, per_device_batch_size=16)
    assert counter.steps(evaluate_then_predict) == (2, 2)  # the last train()'s 16
    trainer.evaluate(data, per_device_batch_size=4)  # an explicit size wins
    assert counter.steps(lambda: trainer.predict(data, per_device_batch_size=4)) == (0, 8)
    trainer.train(DataLoader(data, batch_size=4), num_epochs=1)  # a DataLoader's own size
    assert counter.steps(evaluate_then_predict)[0] == 8
