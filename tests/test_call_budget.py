"""Python calls per training step stay within a fixed budget over a hand-written loop."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS

BUDGET = 150  # extra Python function calls per step allowed over the hand-written loop


def count_calls(run: Callable[[], Any]) -> int:
    calls = [0]

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls[0]


def hand_written(dataset: TensorDataset) -> Callable[[], None]:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def run() -> None:
        for inputs, targets in DataLoader(dataset, batch_size=4, shuffle=True):
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    return run


def trainer_run(dataset: TensorDataset) -> Callable[[], None]:
    model = make_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), DEFAULT_CALLBACKS
    )

    def run() -> None:
        trainer.train(dataset, num_epochs=1, per_device_batch_size=4)

    return run


def per_step(make: Callable[[TensorDataset], Callable[[], None]]) -> float:
    """Calls per step, by differencing an epoch of 40 and one of 20 steps (fixed costs cancel)."""
    short, long = make_regression_dataset(80), make_regression_dataset(160)
    run_short, run_long = make(short), make(long)
    run_short(), run_long()  # warm caches and lazy imports
    return (count_calls(run_long) - count_calls(run_short)) / 20


def test_trainer_step_costs_at_most_the_budget_in_python_calls() -> None:
    hand, trainer = per_step(hand_written), per_step(trainer_run)
    assert trainer <= hand + BUDGET, (trainer, hand)
