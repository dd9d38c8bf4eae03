"""examples/progressive_resizing.py on a tiny generated image folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from helpers import make_image_folder

EXAMPLE = Path(__file__).parents[1] / "examples" / "progressive_resizing.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("progressive_resizing", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_three_stages_continue_one_run_and_keep_the_best(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load()
    data = make_image_folder(tmp_path / "images", train=8, val=4)
    trainers = []
    original = example.train_in_stages

    def spy(args: object) -> object:
        trainers.append(original(args))
        return trainers[-1]

    monkeypatch.setattr(example, "train_in_stages", spy)
    best = example.main(
        [
            "--data_dir",
            str(data),
            "--model",
            "resnet10t",
            "--image_sizes",
            "8",
            "12",
            "16",
            "--epochs_per_stage",
            "2",
            "--batch_size",
            "8",
            "--patience",
            "10",
            "--output",
            str(tmp_path / "best.pt"),
            "--num_workers",
            "0",
        ]
    )
    history = trainers[0].run_history
    accuracy = history.get_metric_values("accuracy")
    assert len(accuracy) == 6  # 3 stages x 2 epochs, one continued run
    assert history.current_epoch == 7
    assert best == max(accuracy)
    assert 0.0 <= best <= 1.0
    assert (tmp_path / "best.pt").is_file()  # and its weights were loaded at the end
