"""examples/progressive_resizing.py on a tiny generated image folder."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from helpers import make_image_folder

from pytorch_accel._checkpointing.checkpoint import load_checkpoint_file

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
            "--log_dir",
            str(tmp_path / "logs"),
        ]
    )
    trainer = trainers[0]
    history = trainer.run_history
    accuracy = history.get_metric_values("accuracy")
    assert len(accuracy) == 6  # 3 stages x 2 epochs, one continued run
    assert history.current_epoch == 7
    assert best == max(accuracy[-2:])  # the last stage's best
    assert 0.0 <= best <= 1.0
    # the model handed back is the last stage's best, whatever an earlier stage scored
    checkpoint = load_checkpoint_file(tmp_path / "best.pt")
    assert checkpoint["epoch"] in (5, 6)
    for name, tensor in trainer.get_model().state_dict().items():
        assert torch.equal(tensor, checkpoint["model_state_dict"][name]), name
    # one run: the step series goes on across the stages, in one TensorBoard run
    with open(tmp_path / "logs" / "metrics_steps.csv", newline="") as handle:
        steps = [int(row["step"]) for row in csv.DictReader(handle)]
    assert steps == [6, 12, 18]  # 6 updates per stage (3 batches of 8, 2 epochs)
    assert trainer.global_num_updates == 18
    run_dir = tmp_path / "logs" / "progressive_resizing"
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1
