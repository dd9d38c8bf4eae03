"""Shared fixtures: tiny regression data, and a clean accelerate state for every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from helpers import make_regression_dataset
from torch.utils.data import TensorDataset


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the tests marked ``cuda`` where there is no CUDA device (as on CI)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cpu_unless_marked_cuda(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Train on the CPU, as CI does, even where a GPU is present; tests marked ``cuda`` use it.

    The tests compare against references computed on the CPU, so on a GPU machine they would
    compare devices rather than behaviour.
    """
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setenv("ACCELERATE_USE_CPU", "true")


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
