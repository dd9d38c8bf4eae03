"""Real runs of examples/train_digits.py: imported by path, and as a script."""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "train_digits.py"


def _reset_accelerate_state() -> None:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    # Each Trainer creates an Accelerator; accelerate keeps its state in process-wide
    # singletons, so every test starts and ends with a clean one.
    _reset_accelerate_state()
    yield
    _reset_accelerate_state()


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_datasets_are_scaled_float_images_with_int_labels(example: ModuleType) -> None:
    train_dataset, eval_dataset = example.load_digits_datasets()

    assert (len(train_dataset), len(eval_dataset)) == (1437, 360)
    images, labels = train_dataset.tensors
    assert images.shape == (1437, 1, 8, 8)
    assert images.dtype == torch.float32
    assert labels.dtype == torch.int64
    assert 0.0 <= float(images.min()) <= float(images.max()) <= 1.0
    assert set(eval_dataset.tensors[1].tolist()) == set(range(10))


def test_split_is_deterministic_and_works_for_tiny_subsets(example: ModuleType) -> None:
    first, _ = example.load_digits_datasets(subset=200)
    second, _ = example.load_digits_datasets(subset=200)
    assert torch.equal(first.tensors[0], second.tensors[0])

    train_dataset, eval_dataset = example.load_digits_datasets(subset=12)
    assert (len(train_dataset), len(eval_dataset)) == (9, 3)


def test_main_returns_accuracy_well_above_chance(
    example: ModuleType, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pytorch_accel")
    accuracy = example.main(["--subset", "400", "--num_epochs", "3"])

    assert isinstance(accuracy, float)
    assert 0.0 <= accuracy <= 1.0
    # Seed 42 gives 0.8875; seeds 0-7 all give more than 0.83. Chance is 0.1.
    assert accuracy > 0.7
    out = capsys.readouterr().out
    assert f"final eval accuracy: {accuracy:.3f}" in out
    epoch_lines = [record.getMessage() for record in caplog.records if "epoch " in record.msg]
    assert [line.split("  ")[0] for line in epoch_lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    for metric in ("train_loss", "eval_loss", "accuracy"):  # one line per epoch, every metric
        assert all(f"  {metric} " in line for line in epoch_lines)


def test_run_history_has_every_metric_for_every_epoch(example: ModuleType) -> None:
    trainer = example.train(example.parse_args(["--subset", "300", "--num_epochs", "2"]))

    history = trainer.run_history
    assert {"train_loss_epoch", "eval_loss_epoch", "accuracy"} <= history.get_metric_names()
    for name in ("train_loss_epoch", "eval_loss_epoch", "accuracy"):
        values = history.get_metric_values(name)
        assert len(values) == 2
        assert all(math.isfinite(value) for value in values)
    assert all(0.0 <= value <= 1.0 for value in history.get_metric_values("accuracy"))
    # The placeholders resolved to 2 epochs x ceil(240 / 32) = 8 updates per epoch.
    assert trainer.scheduler.total_steps == 16
    assert trainer.num_updates == 16


def test_same_seed_gives_same_accuracy(example: ModuleType) -> None:
    argv = ["--subset", "300", "--num_epochs", "1", "--seed", "7"]
    first = example.main(argv)
    _reset_accelerate_state()
    second = example.main(argv)

    assert first == second


def test_rejects_non_positive_options(example: ModuleType) -> None:
    with pytest.raises(SystemExit):
        example.parse_args(["--num_epochs", "0"])


def test_script_runs_end_to_end() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--subset", "300", "--num_epochs", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert "final eval accuracy" in result.stdout
    # Piped: one line per epoch on stdout, and no progress bar or carriage return anywhere.
    epoch_lines = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split("  ")[0] for line in epoch_lines] == ["epoch 1/1"]
    assert "\r" not in result.stdout + result.stderr
