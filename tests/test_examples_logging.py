"""examples/log_sample_predictions.py: images in TensorBoard at each epoch, a run record."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
from helpers import load_example
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("log_sample_predictions")


def test_sample_predictions_reach_tensorboard_once_per_epoch(
    example: ModuleType, tmp_path: Path
) -> None:
    record = example.main(
        ["--subset", "300", "--num_epochs", "2", "--num_images", "6", "--output_dir", str(tmp_path)]
    )
    events = EventAccumulator(str(record / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("sample_predictions")
    assert [image.step for image in images] == [1, 2]
    assert images[0].encoded_image_string.startswith(b"\x89PNG")
    assert (images[0].width, images[0].height) > (36, 36)  # a grid of 6 framed 36x36 digits
    assert json.loads((record / "hyperparameters.json").read_text())["hidden"] == 64
    steps = [event.step for event in events.Scalars("train_loss_step")]
    assert steps == [10, 16]  # 240 samples in batches of 32: 8 updates per epoch


def test_frames_are_green_where_right_and_red_where_wrong(example: ModuleType) -> None:
    import torch

    images = torch.zeros(2, 1, 8, 8)
    grid = example.draw_predictions(images, torch.tensor([3, 4]), torch.tensor([3, 5]))
    assert grid.shape == (2, 3, 36, 36)
    assert grid[0, :, 0, 0].tolist() == pytest.approx(list(example.GREEN))
    assert grid[1, :, 0, 0].tolist() == pytest.approx(list(example.RED))
    assert grid[:, :, 2:-2, 2:-2].abs().sum() == 0  # the digits themselves are untouched
