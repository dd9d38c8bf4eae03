"""Real runs of the core examples in examples/: imported by path, on tiny data.

Each example trains for a few seconds in this process, with network connections refused;
`distributed.py` also runs in 2 real processes under `torch.distributed.run`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from helpers import load_example, make_image_folder, run_process_group, succeeded

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"


def _reset_accelerate_state() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Iterator[None]:
    # Every Trainer creates an Accelerator, whose state lives in process-wide singletons.
    _reset_accelerate_state()
    yield
    _reset_accelerate_state()


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny models gain nothing from a second intra-op thread, and on a busy 2-core machine
    # two spinning threads per process make these runs several times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    # The examples must never download data or weights: any connection attempt fails the test.
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"an example tried to open a network connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _spy_on_train(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[Any]:
    """Make `module.train` record what it returns, so a test can call `main` and inspect it."""
    results: list[Any] = []
    original: Callable[..., Any] = module.train

    def spy(*args: Any, **kwargs: Any) -> Any:
        results.append(original(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(module, "train", spy)
    return results


def _accuracy(model: torch.nn.Module, dataset: Any) -> float:
    features, labels = dataset.tensors
    with torch.no_grad():
        return float((model(features).argmax(dim=-1) == labels).float().mean())


# ------------------------------------------------------------ train_with_metrics_in_callback


@pytest.fixture(scope="module")
def metrics_example() -> ModuleType:
    return load_example("train_with_metrics_in_callback")


def test_metrics_callback_records_accuracy_and_f1_every_epoch(
    metrics_example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainers = _spy_on_train(monkeypatch, metrics_example)

    results = metrics_example.main(["--subset", "400", "--num_epochs", "3"])

    history = trainers[0].run_history
    for name in ("accuracy", "f1"):
        values = history.get_metric_values(name)
        assert len(values) == 3
        assert all(0.0 <= value <= 1.0 for value in values)
    assert {"test_accuracy", "test_f1", "test_loss"} <= history.get_metric_names()
    assert history.metric_name_prefix == ""
    assert results["accuracy"] > 0.6  # chance is 0.1
    assert results == {name: history.get_latest_metric(name) for name in results}


def test_metrics_callback_values_match_a_direct_computation(metrics_example: ModuleType) -> None:
    from sklearn.metrics import f1_score

    args = metrics_example.parse_args(["--subset", "400", "--num_epochs", "2"])
    trainer = metrics_example.train(args)

    _, eval_dataset, test_dataset = metrics_example.load_datasets(400)
    model = trainer.get_model().eval()
    history = trainer.run_history
    assert history.get_latest_metric("accuracy") == pytest.approx(_accuracy(model, eval_dataset))
    assert history.get_latest_metric("test_accuracy") == pytest.approx(
        _accuracy(model, test_dataset)
    )
    features, labels = test_dataset.tensors
    with torch.no_grad():
        predictions = model(features).argmax(dim=-1)
    expected_f1 = f1_score(labels, predictions, average="macro", labels=list(range(10)))
    assert history.get_latest_metric("test_f1") == pytest.approx(expected_f1, abs=1e-6)


# ----------------------------------------------------------------------- custom_training_step


@pytest.fixture(scope="module")
def custom_step_example() -> ModuleType:
    return load_example("custom_training_step")


def test_model_computing_its_own_loss_learns(
    custom_step_example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    history = custom_step_example.main(["--quick"])

    losses = history["train_loss_epoch"]
    assert len(losses) == 3
    assert losses[-1] < 0.5 * losses[0]
    assert history["accuracy"][-1] > 0.8  # chance is about 0.5
    assert "final eval accuracy" in capsys.readouterr().out


def test_collate_fn_pads_and_masks(custom_step_example: ModuleType) -> None:
    dataset = custom_step_example.TokenSequenceDataset(2, seed=0, min_length=2, max_length=9)
    samples = [dataset[0], dataset[1]]
    batch = custom_step_example.collate_token_batch(samples)

    longest = max(len(sample["input_ids"]) for sample in samples)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, longest)
    assert batch["attention_mask"].sum(dim=1).tolist() == [len(s["input_ids"]) for s in samples]
    assert batch["labels"].shape == (2,)


def test_trainer_reads_loss_and_logits_from_objects_and_dicts(
    custom_step_example: ModuleType,
) -> None:
    model = custom_step_example.SequenceClassifier()
    trainer = custom_step_example.ModelLossTrainer(
        model, loss_func=None, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    dataset = custom_step_example.TokenSequenceDataset(4, seed=0)
    batch = custom_step_example.collate_token_batch([dataset[i] for i in range(4)])

    output = trainer.calculate_train_batch_loss(batch)
    assert output["batch_size"] == 4
    assert output["model_outputs"].shape == (4, 2)
    assert output["loss"].requires_grad
    as_dict = {"loss": output["loss"], "logits": output["model_outputs"]}
    assert custom_step_example.output_field(as_dict, "loss") is output["loss"]
    assert not trainer.calculate_eval_batch_loss(batch)["loss"].requires_grad


# ---------------------------------------------------------------------- gradient_accumulation


@pytest.fixture(scope="module")
def accumulation_example() -> ModuleType:
    return load_example("gradient_accumulation")


def test_effective_batch_size_and_clipping(accumulation_example: ModuleType) -> None:
    results = accumulation_example.main(["--quick", "--max_grad_norm", "0.05"])

    # 400 train samples / 8 per batch = 50 micro-batches per epoch, 4 per update.
    assert results["per_device_batch_size"] == 8
    assert results["num_processes"] == 1
    assert results["gradient_accumulation_steps"] == 4
    assert results["train_total_batch_size"] == 8 * 1 * 4
    assert results["num_update_steps_per_epoch"] == math.ceil(50 / 4) == 13
    assert results["num_updates"] == results["scheduler_steps"] == 3 * 13
    # Clipping binds: unclipped, the norms reach about 0.9 (see a run with the default 1.0).
    assert 0.045 < results["max_clipped_grad_norm"] <= 0.05 + 1e-5
    losses = results["train_loss_epoch"]
    assert losses[-1] < losses[0]


def test_effective_batch_size_follows_the_options(
    accumulation_example: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _spy_on_train(monkeypatch, accumulation_example)
    argv = ["--quick", "--num_epochs", "1", "--batch_size", "16"]

    results = accumulation_example.main([*argv, "--gradient_accumulation_steps", "3"])

    assert results["train_total_batch_size"] == 16 * 1 * 3
    # 25 micro-batches, 3 per update: the last, short window is an update too.
    assert results["num_update_steps_per_epoch"] == results["num_updates"] == 9
    config = runs[0][1].run_config
    accumulation_example.check_effective_batch_size(config, 16, 3)
    wrong = dataclasses.replace(config, train_total_batch_size=16 * 3 * 2)
    with pytest.raises(AssertionError, match="train_total_batch_size"):
        accumulation_example.check_effective_batch_size(wrong, 16, 3)


# -------------------------------------------------------------------------- transfer_learning


@pytest.fixture(scope="module")
def transfer_example() -> ModuleType:
    return load_example("transfer_learning")


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-class image folder of noisy 16x16 PNGs: 12 train and 6 val images per class."""
    return make_image_folder(tmp_path_factory.mktemp("images"))


def test_transfer_learning_on_an_image_folder_beats_chance(
    transfer_example: ModuleType, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainers = _spy_on_train(monkeypatch, transfer_example)
    argv = ["--data_dir", str(image_folder), "--image_size", "16", "--num_workers", "0"]

    accuracy = transfer_example.main([*argv, "--freeze_backbone", "--num_epochs", "3"])

    assert accuracy > 0.6  # chance is 1/3; seeds 0-5 give 0.61 to 0.83
    trainer = trainers[0]
    assert len(trainer.run_history.get_metric_values("accuracy")) == 3
    model = trainer.get_model()
    assert model.fc.out_features == 3
    assert [name for name, p in model.named_parameters() if p.requires_grad] == [
        "fc.weight",
        "fc.bias",
    ]
    # StepLR every 7 epochs, in optimizer updates: 36 images / batch 4 = 9 updates per epoch.
    assert trainer.run_config.num_update_steps_per_epoch == 9
    assert trainer.scheduler.step_size == 9 * 7


def test_transfer_learning_loads_local_weights_and_never_downloads(
    transfer_example: ModuleType, tmp_path: Path
) -> None:
    from torchvision import models

    source = models.resnet18(weights=None)  # the ImageNet layout: a 1000-class head
    torch.save(source.state_dict(), tmp_path / "resnet18.pth")
    torch.save({"model_state_dict": source.state_dict()}, tmp_path / "checkpoint.pt")

    for file_name in ("resnet18.pth", "checkpoint.pt"):
        model = transfer_example.create_model("resnet18", 3, weights=tmp_path / file_name)
        assert torch.equal(model.conv1.weight, source.conv1.weight)
        assert model.fc.out_features == 3
    fresh = transfer_example.create_model("resnet18", 3)
    assert not torch.equal(fresh.conv1.weight, source.conv1.weight)
    with pytest.raises(ValueError, match="does not fit the backbone"):
        transfer_example.create_model("resnet34", 3, weights=tmp_path / "resnet18.pth")


def test_transfer_learning_replaces_sequential_heads(transfer_example: ModuleType) -> None:
    from torchvision import models

    model = models.mobilenet_v3_small(weights=None)
    assert transfer_example.replace_head(model, 5) == "classifier.3."
    assert model.classifier[3].out_features == 5


# -------------------------------------------------------------------------------- distributed


@pytest.fixture(scope="module")
def distributed_example() -> ModuleType:
    return load_example("distributed")


def test_distributed_example_in_one_process_writes_a_checkpoint(
    distributed_example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint_path = tmp_path / "out" / "model.pt"
    results = distributed_example.main(["--quick", "--checkpoint", str(checkpoint_path)])

    assert results["num_processes"] == 1
    losses = results["train_loss_epoch"]
    assert losses[-1] < losses[0]
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["num_processes"] == 1
    assert checkpoint["final_eval_loss"] == results["final_eval_loss"]
    assert "optimizer_state_dict" in checkpoint
    out = capsys.readouterr().out
    assert "number of processes: 1" in out


def test_distributed_help_shows_the_launch_commands(
    distributed_example: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        distributed_example.parse_args(["--help"])

    out = capsys.readouterr().out
    for command in (
        "torchrun --nproc_per_node 2 examples/distributed.py",
        "accelerate launch --multi_gpu --num_processes 2 examples/distributed.py",
        "ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 examples/distributed.py",
        "accelerate launch --multi_gpu --num_processes <gpus> examples/distributed.py",
    ):
        assert command in out


@pytest.mark.distributed
def test_distributed_example_in_two_processes(tmp_path: Path) -> None:
    checkpoint_path = tmp_path / "model.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)  # the trainer sets up gloo on a CPU-only machine
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(EXAMPLES / "distributed.py"),
        "--quick",
        "--checkpoint",
        str(checkpoint_path),
    ]
    returncode, output = run_process_group(command, env=env, cwd=REPO_ROOT, timeout=180)
    # "checkpoint written" comes after save_checkpoint's barrier, the example's last collective
    finished = succeeded(returncode, output, after_last_collective="checkpoint written to")
    assert finished, output[-4000:]

    assert output.count("number of processes: 2") == 1, output[-4000:]
    assert output.count("final eval loss: ") == 1
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["num_processes"] == 2
    assert not list(tmp_path.glob(".*.tmp-*"))  # written atomically, no leftovers
