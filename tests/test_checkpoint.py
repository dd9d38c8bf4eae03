"""Checkpoint files: round trip, atomic writes, and clear errors on bad files."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from torch.optim.lr_scheduler import StepLR


def trained_trainer() -> object:
    trainer = make_trainer(optimizer_class=torch.optim.AdamW)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        create_scheduler_fn=functools.partial(StepLR, step_size=1, gamma=0.5),
    )
    return trainer


def test_round_trip_restores_model_optimizer_scheduler_and_extras(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"epoch": 3, "best": torch.tensor(0.25)})
    saved = clone_params(trainer.get_model())
    lr = trainer.optimizer.param_groups[0]["lr"]

    fresh = make_trainer(make_model(seed=7), optimizer_class=torch.optim.AdamW)
    fresh.train(
        make_regression_dataset(16),
        num_epochs=1,
        create_scheduler_fn=functools.partial(StepLR, step_size=1, gamma=0.9),
    )
    checkpoint = fresh.load_checkpoint(path)
    assert checkpoint["epoch"] == 3
    assert checkpoint["best"].item() == 0.25
    assert set(checkpoint) == {
        "model_state_dict",
        "optimizer_state_dict",
        "scheduler_state_dict",
        "epoch",
        "best",
    }
    for loaded, expected in zip(clone_params(fresh.get_model()), saved, strict=True):
        assert torch.equal(loaded, expected)
    assert fresh.optimizer.param_groups[0]["lr"] == lr
    assert fresh.scheduler.state_dict()["gamma"] == 0.5
    assert fresh.optimizer.state_dict()["state"][0]["exp_avg"].shape == saved[0].shape


def test_optional_parts_are_left_out(tmp_path: Path) -> None:
    trainer = trained_trainer()
    trainer.save_checkpoint(tmp_path / "weights.pt", save_optimizer=False, save_scheduler=False)
    assert set(torch.load(tmp_path / "weights.pt", weights_only=True)) == {"model_state_dict"}


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"version": 1})
    before = path.read_bytes()
    with pytest.raises(Exception, match=r"pickle|lambda|Can.t"):
        trainer.save_checkpoint(path, checkpoint_kwargs={"version": 2, "bad": lambda: None})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary file left


def test_truncated_missing_and_mismatched_checkpoints(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:100])
    with pytest.raises(
        ValueError, match=r"could not read '.*truncated.pt': it is truncated, corrupt"
    ):
        trainer.load_checkpoint(truncated)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint file at '.*missing.pt'"):
        trainer.load_checkpoint(tmp_path / "missing.pt")
    other = make_trainer(torch.nn.Linear(4, 1))
    with pytest.raises(ValueError, match=r"'.*model.pt' does not fit this model"):
        other.load_checkpoint(path)
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by save_checkpoint"):
        trainer.load_checkpoint(tmp_path / "foreign.pt")


def test_compiled_model_checkpoint_loads_into_a_plain_model(tmp_path: Path) -> None:
    model = make_model()
    trainer = make_trainer(torch.compile(model, backend="eager"))
    trainer.train(make_regression_dataset(16), num_epochs=1)
    trainer.save_checkpoint(tmp_path / "compiled.pt")
    keys = torch.load(tmp_path / "compiled.pt", weights_only=True)["model_state_dict"].keys()
    assert not any(key.startswith("_orig_mod") for key in keys)
    plain = make_trainer(make_model(seed=5))
    plain.load_checkpoint(tmp_path / "compiled.pt", load_optimizer=False)
    for loaded, expected in zip(plain.get_model().parameters(), model.parameters(), strict=True):
        assert torch.equal(loaded, expected)
