"""Dry runs touch nothing of the user's; overfit runs train on a fixed small subset."""

from __future__ import annotations

import contextlib
import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import RecordingCallback, clone_params, make_regression_dataset, make_trainer
from torch.utils.data import DataLoader

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    RunRecordCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
    redirected_paths,
)


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory``, with its size and modification time."""
    return {
        str(path.relative_to(directory)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


class SeesDryRunDir(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[Path | None] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen.append(trainer.dry_run_dir)


def test_a_dry_run_goes_through_every_callback_and_changes_nothing_of_the_users(
    tmp_path: Path,
) -> None:
    states, best = tmp_path / "states", tmp_path / "best.pt"
    recorder, sees = RecordingCallback(), SeesDryRunDir()
    callbacks = (
        *DEFAULT_CALLBACKS,
        SaveTrainingStateCallback(states, save_every_n_steps=1, max_checkpoints=1),
        SaveBestModelCallback(save_path=best, save_top_k=2),
        recorder,
        sees,
    )
    trainer = make_trainer(callbacks=callbacks, optimizer_class=torch.optim.Adam)
    data, eval_data = make_regression_dataset(64), make_regression_dataset(16, seed=1)
    trainer.train(data, num_epochs=1, eval_dataset=eval_data, per_device_batch_size=4)
    files, history = snapshot(tmp_path), trainer.run_history.state_dict()
    weights, optimizer = clone_params(trainer.model), copy.deepcopy(trainer.optimizer.state_dict())
    recorder.events.clear()

    trainer.train(data, num_epochs=5, eval_dataset=eval_data, per_device_batch_size=4, dry_run=True)

    assert recorder.events.count("on_train_step_end") == 2
    assert recorder.events.count("on_eval_step_end") == 2
    # then the round trip of a training state, which fires the save and load events
    assert recorder.events[-2:] == ["on_save_training_state", "on_load_training_state"]
    assert recorder.events.index("on_training_run_end") < len(recorder.events) - 2
    assert snapshot(tmp_path) == files  # no state written or deleted, no best model replaced
    assert trainer.run_history.state_dict() == history
    for a, b in zip(clone_params(trainer.model), weights, strict=True):
        assert torch.equal(a, b)
    restored = trainer.optimizer.state_dict()["state"]
    for index, state in optimizer["state"].items():
        assert torch.equal(restored[index]["exp_avg"], state["exp_avg"])
    dry_dir = sees.seen[-1]
    assert dry_dir is not None
    assert dry_dir.parent == Path(tempfile.gettempdir())
    assert not dry_dir.exists()
    assert trainer.dry_run_dir is None
    assert trainer.limit_train_batches is None


class ListsDryRunFiles(TrainerCallback):
    """Lists the files under the dry run's directory at the end of each run (after the record)."""

    order = 200

    def __init__(self) -> None:
        self.files: list[list[str]] = []

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        directory = trainer.dry_run_dir
        found = [] if directory is None else directory.rglob("*")
        self.files.append(sorted(path.name for path in found if path.is_file()))


def test_a_dry_run_after_a_real_run_leaves_its_run_record_untouched(tmp_path: Path) -> None:
    record_dir = tmp_path / "runs" / "x"
    record = RunRecordCallback(record_dir, {"lr": 0.01}, log_with=(), plot=False)
    lister = ListsDryRunFiles()
    trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, record, lister))
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=3, eval_dataset=data, per_device_batch_size=4)
    files = snapshot(tmp_path)
    contents = {name: (tmp_path / name).read_bytes() for name in files}
    assert {"config.json", "environment.json", "train.log"} <= {Path(n).name for n in files}

    trainer.train(data, num_epochs=3, eval_dataset=data, per_device_batch_size=4, dry_run=True)

    assert snapshot(tmp_path) == files  # no file written, replaced or added (mtime too)
    assert {name: (tmp_path / name).read_bytes() for name in files} == contents
    written = lister.files[-1]  # the dry run wrote its record in its temporary directory
    for name in ("config.json", "hyperparameters.json", "environment.json", "train.log"):
        assert name in written
    assert record.directory == record_dir
    assert record.csv_path == record_dir / "metrics.csv"
    assert record.logging_dir == str(record_dir)


class WritesNotes(TrainerCallback):
    """A user callback that writes a file and declares where (as docs/callbacks.md shows)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.written: list[Path] = []

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        return redirected_paths(self, directory, "out_dir")

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "notes.txt").write_text(str(trainer.num_updates))
        self.written.append(self.out_dir)


def test_a_user_callback_that_declares_its_outputs_is_redirected(tmp_path: Path) -> None:
    notes = WritesNotes(tmp_path / "notes")
    trainer = make_trainer(callbacks=(notes,))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4, dry_run=1)
    assert not (tmp_path / "notes").exists()
    assert notes.written[-1].name == "notes"
    assert notes.written[-1].parent.parent.parent.parent == Path(tempfile.gettempdir())
    assert notes.out_dir == tmp_path / "notes"


def test_a_dry_run_before_training_does_not_change_the_run() -> None:
    data = make_regression_dataset(64)
    settings: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 4}
    plain = make_trainer()
    plain.train(data, **settings)
    checked = make_trainer()
    checked.train(data, **settings, dry_run=3)
    assert checked.num_updates == 3
    checked.train(data, **settings)
    for a, b in zip(clone_params(checked.model), clone_params(plain.model), strict=True):
        assert torch.equal(a, b)


def test_overfit_batches_trains_and_evaluates_on_the_same_first_batches() -> None:
    trainer = make_trainer(lr=0.1)
    trainer.train(
        make_regression_dataset(64), num_epochs=30, per_device_batch_size=4, overfit_batches=2
    )
    assert trainer.num_updates == 60
    assert trainer.train_dataloader is not None
    assert len(trainer.train_dataloader) == 2
    history = trainer.run_history
    losses = history.get_metric_values("eval_loss_epoch")
    assert losses[-1] < losses[0] / 10  # the model memorises its 8 samples


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"dry_run": 0}, ValueError, "dry_run must be a positive int"),
        ({"dry_run": "yes"}, TypeError, "dry_run must be a positive int"),
        ({"overfit_batches": 0}, ValueError, "overfit_batches must be a positive int"),
        ({"dry_run": True, "overfit_batches": 2}, ValueError, "overfit_batches must be None"),
    ],
)
def test_bad_dry_run_arguments_are_refused(
    settings: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make_trainer().train(make_regression_dataset(16), num_epochs=1, **settings)


def test_overfit_needs_a_dataset() -> None:
    loader = DataLoader(make_regression_dataset(16), batch_size=4)
    with pytest.raises(ValueError, match="overfit_batches must be None when train_dataset is"):
        make_trainer().train(loader, num_epochs=1, overfit_batches=2)
