"""Real quick runs of examples/train_timm_model.py, on generated images and an image folder."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "train_timm_model.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_timm_model_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_image_folder(root: Path, classes: int, per_class: int) -> None:
    generator = torch.Generator().manual_seed(0)
    for label in range(classes):
        (root / f"class_{label}").mkdir(parents=True)
        for index in range(per_class):
            pixels = torch.randint(0, 256, (12, 12, 3), generator=generator, dtype=torch.uint8)
            Image.fromarray(pixels.numpy()).save(root / f"class_{label}" / f"{index}.png")


def test_quick_run_on_generated_images_ends_the_schedule(example: ModuleType) -> None:
    results = example.main(["--quick"])
    # 39 train images, batches of 8 without the last partial one: 4 updates x 2 epochs.
    assert results["num_updates"] == 8
    assert math.isfinite(results["eval_loss"])
    assert 0.0 <= results["accuracy"] <= 1.0
    assert results["last_lr"] == 1e-6  # timm's lr_min, reached at t_initial = 8 updates


def test_quick_run_on_an_image_folder(example: ModuleType, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "images", classes=3, per_class=8)
    results = example.main(["--quick", "--data_dir", str(tmp_path / "images")])
    # 24 images: 20 for training, 2 batches of 8 per epoch.
    assert results["num_updates"] == 4
    assert 0.0 <= results["accuracy"] <= 1.0


def test_image_folder_with_train_and_val_directories(example: ModuleType, tmp_path: Path) -> None:
    write_image_folder(tmp_path / "train", classes=2, per_class=3)
    write_image_folder(tmp_path / "val", classes=2, per_class=1)
    train_set, eval_set = example.image_folder_datasets(tmp_path, image_size=16)
    assert (len(train_set), len(eval_set)) == (6, 2)
    assert example.count_classes(train_set) == 2
    image, label = train_set[0]
    assert image.shape == (3, 16, 16)
    assert label == 0
