"""Shared fixtures: tiny regression data, and a clean accelerate state for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from helpers import make_regression_dataset
from torch.utils.data import TensorDataset


@pytest.fixture(autouse=True)
def _reset_accelerate_state() -> Iterator[None]:
    """Give every test a fresh accelerate singleton state, and a fixed seed."""
    torch.manual_seed(0)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def regression_dataset() -> TensorDataset:
    """64 samples of a noisy linear target with 4 features."""
    return make_regression_dataset(64)


@pytest.fixture
def small_eval_dataset() -> TensorDataset:
    """20 samples from the same distribution, seeded differently."""
    return make_regression_dataset(20, seed=1)
