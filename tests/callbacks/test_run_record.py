"""RunRecordCallback in real runs: every file present and parseable, the log, the trackers."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import logging
import os
import sys
from pathlib import Path

import pytest
import yaml
from helpers import make_regression_dataset, make_trainer, open_files_under, small_filesystem
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import pytorch_accel
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    RunRecordCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
)
from pytorch_accel.callbacks.run_record import RUN_RECORD_FILES


@pytest.fixture
def record(tmp_path: Path) -> RunRecordCallback:
    record = RunRecordCallback(
        tmp_path / "run", hyperparameters={"lr": 0.05, "model": {"width": 8}}, log_every_n_updates=3
    )
    trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, record))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=2,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=4,
        max_grad_norm=5.0,
    )
    return record


def test_every_file_is_written_and_parseable(record: RunRecordCallback) -> None:
    run = record.directory
    for role in RUN_RECORD_FILES:
        assert record.path(role).is_file(), role
    config = json.loads(record.path("config").read_text())
    assert config["run_config"]["num_epochs"] == 2
    assert config["run_config"]["max_grad_norm"] == 5.0
    assert config["run_config"]["train_dl_kwargs"]["batch_size"] == 4
    assert config["train"]["train_dataset_size"] == 32
    assert config["trainer"]["optimizer"]["class"] == "SGD"
    assert config["trainer"]["optimizer"]["param_groups"][0]["lr"] == 0.05
    assert "RunRecordCallback" in config["trainer"]["callbacks"]
    assert json.loads(record.path("hyperparameters").read_text()) == {
        "lr": 0.05,
        "model": {"width": 8},
    }
    env = json.loads(record.path("environment").read_text())
    assert env["versions"]["pytorch_accel"] == pytorch_accel.__version__
    assert env["devices"]["num_processes"] == 1
    assert env["command"]["argv"]
    assert env["git"] is None or len(env["git"]["commit"]) == 40
    summary = json.loads(record.path("model_summary").read_text())
    assert [module["name"] for module in summary["modules"]] == ["0", "1", "2"]
    assert [module["trainable"] for module in summary["modules"]] == [40, 0, 9]
    assert (summary["trainable"], summary["frozen"], summary["total"]) == (49, 0, 49)
    assert "Linear(in_features=4, out_features=8" in record.path("model_summary_text").read_text()
    with open(record.path("metrics"), newline="") as handle:
        assert [row["epoch"] for row in csv.DictReader(handle)] == ["1", "2"]
    with open(record.path("step_metrics"), newline="") as handle:
        steps = list(csv.DictReader(handle))
    assert [row["step"] for row in steps] == ["3", "6", "9", "12", "15", "16"]
    assert record.path("plot").read_bytes()[:4] == b"\x89PNG"
    assert not list(run.glob(".*tmp*"))  # every file was replaced atomically


def test_the_log_file_holds_the_console_lines(
    record: RunRecordCallback,
) -> None:
    lines = record.path("log").read_text().splitlines()
    messages = [line.split(" INFO ", 1)[1] for line in lines]
    assert messages[0] == f"run record: {record.directory}"
    assert (
        messages[1] == "training: 2 epochs, 16 updates, 4 samples per update (1 process, float32)"
    )
    assert [m.split("  ")[0] for m in messages[2:-1]] == ["epoch 1/2", "epoch 2/2"]
    assert messages[-1] == "run completed at update 16"  # and outcome.json says the same
    outcome = {"status": "completed", "epochs": 2, "updates": 16, "error": None}
    assert json.loads(record.path("outcome").read_text()) == outcome
    assert record.path("log").name not in {
        getattr(handler, "baseFilename", "")
        for handler in logging.getLogger("pytorch_accel").handlers
    }  # closed at the end of the run


def test_the_trackers_get_the_hyperparameters_and_step_series(
    record: RunRecordCallback,
) -> None:
    (hparams,) = list((record.directory / "tensorboard").rglob("hparams.yml"))
    stored = yaml.safe_load(hparams.read_text())
    assert (stored["lr"], stored["model.width"], stored["num_epochs"]) == (0.05, 8, 2)
    events = EventAccumulator(str(record.directory / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train_loss_step")] == [3, 6, 9, 12, 15, 16]
    assert [event.step for event in events.Scalars("eval_loss_epoch")] == [8, 16]  # updates


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"directory": 3}, TypeError, r"directory must be a path or None, got 3"),
        ({"directory": "r", "hyperparameters": [1]}, TypeError, r"hyperparameters must be"),
        ({"directory": "r", "plot": "yes"}, TypeError, r"plot must be None or a bool, got 'yes'"),
        ({"directory": "r", "log_every_n_updates": 0}, ValueError, r"log_every_n_updates"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        RunRecordCallback(**arguments)  # type: ignore[arg-type]


def test_a_run_that_raised_keeps_later_runs_out_of_its_log(tmp_path: Path) -> None:
    class Broken(RunRecordCallback):
        def on_train_epoch_end(self, trainer: pytorch_accel.Trainer, **kwargs: object) -> None:
            raise RuntimeError("broken")

    record = Broken(tmp_path / "run", log_every_n_updates=None)
    with pytest.raises(RuntimeError, match="broken"):
        make_trainer(callbacks=(*DEFAULT_CALLBACKS, record)).train(
            make_regression_dataset(8), num_epochs=2, per_device_batch_size=4
        )
    failed_log = record.path("log").read_text()
    later = make_trainer(callbacks=DEFAULT_CALLBACKS)  # logs its console lines
    later.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
    assert record.path("log").read_text() == failed_log  # the later run's lines went elsewhere
    assert str(record.path("log")) not in {
        getattr(handler, "baseFilename", "")
        for handler in logging.getLogger("pytorch_accel").handlers
    }


class KillAtUpdate(TrainerCallback):
    """Raise after update ``update``, as a killed process stops writing (after the others)."""

    order = 2000

    def __init__(self, update: int) -> None:
        self.update = update

    def on_optimizer_step_end(self, trainer: pytorch_accel.Trainer, **kwargs: object) -> None:
        if trainer.num_updates == self.update:
            raise RuntimeError("killed")


def train_recorded(directory: Path, *extra: TrainerCallback, **arguments: object) -> None:
    """3 epochs of 8 updates, a step row every update, a training state every 3 updates."""
    record = RunRecordCallback(directory / "run", log_every_n_updates=1, plot=False)
    states = SaveTrainingStateCallback(directory / "states", save_every_n_steps=3)
    trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, record, states, *extra))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        eval_dataset=make_regression_dataset(8, seed=1),
        per_device_batch_size=4,
        **arguments,  # type: ignore[arg-type]
    )


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_resumed_run_continues_its_metrics_files_without_gaps_or_repeats(
    tmp_path: Path,
) -> None:
    # issue 29: the step file restarted at the resumed update (rows 1-14 lost, 16 and 17
    # written twice to TensorBoard), the epoch file at the resumed epoch (epoch 1 lost)
    train_recorded(tmp_path / "whole")
    with pytest.raises(RuntimeError, match="killed"):
        train_recorded(tmp_path, KillAtUpdate(17))  # in epoch 3; the last state: update 15
    run = tmp_path / "run"
    before = read_rows(run / "metrics_steps.csv")
    assert [row["step"] for row in before] == [str(step) for step in range(1, 18)]
    assert [row["epoch"] for row in read_rows(run / "metrics.csv")] == ["1", "2"]
    with open(run / "metrics_steps.csv", "a") as handle:
        handle.write("1")  # a row a kill cut short: the file is read up to it

    train_recorded(tmp_path, resume_from="latest")  # a fresh trainer, as a new process
    steps = read_rows(run / "metrics_steps.csv")
    assert [row["step"] for row in steps] == [str(step) for step in range(1, 25)]
    assert steps[:15] == before[:15]  # the rows of the saved updates, as written
    whole = read_rows(tmp_path / "whole" / "run" / "metrics_steps.csv")
    assert [row["train_loss_step"] for row in steps] == [row["train_loss_step"] for row in whole]
    epochs = read_rows(run / "metrics.csv")
    assert epochs == read_rows(tmp_path / "whole" / "run" / "metrics.csv")  # an exact resume
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train_loss_step")] == list(range(1, 25))


class PointAtFullDevice(TrainerCallback):
    """Once ``path`` is written, make it a link to ``/dev/full``: its next write finds no space.

    (The step rows are written when the logging points are read: at the first epoch's end.)
    """

    order = 2000

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_optimizer_step_end(self, trainer: pytorch_accel.Trainer, **kwargs: object) -> None:
        if self.path.exists() and not self.path.is_symlink():
            self.path.unlink()
            self.path.symlink_to("/dev/full")


def assert_record_closed(record: RunRecordCallback) -> None:
    assert open_files_under(record.directory) == []
    assert not open_files_under(Path("/dev/full"))
    assert record.trackers == []
    assert not any(
        isinstance(handler, logging.FileHandler)
        for handler in logging.getLogger("pytorch_accel").handlers
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes to /dev/full")
@pytest.mark.parametrize("role", ["step_metrics", "log"])
def test_a_full_disk_during_the_run_names_the_file_and_closes_the_record(
    tmp_path: Path, role: str
) -> None:
    # issue 29: a bare "[Errno 28] No space left on device" killed train() (the step file) or
    # went to stderr while the run went on (train.log), and the record's files stayed open
    record = RunRecordCallback(tmp_path / "run", log_every_n_updates=1, plot=False)
    if role == "log":
        record.directory.mkdir()
        record.path("log").symlink_to("/dev/full")
        full: tuple[TrainerCallback, ...] = ()
    else:
        full = (PointAtFullDevice(record.path(role)),)
    trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, record, *full))
    message = (
        rf"RunRecordCallback: could not write '.*{RUN_RECORD_FILES[role]}': the disk is full; "
        "free some space, or give RunRecordCallback a directory elsewhere"
    )
    with pytest.raises(OSError, match=message) as info:
        trainer.train(make_regression_dataset(16), num_epochs=3, per_device_batch_size=4)
    assert info.value.errno == errno.ENOSPC
    assert trainer.num_updates < 12  # it stopped there, at the first write that failed
    assert_record_closed(record)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mounts a Linux tmpfs")
@pytest.mark.parametrize("fill_at", [0, 3])
def test_a_full_disk_for_the_records_files_names_them_and_closes_the_record(
    tmp_path: Path, fill_at: int
) -> None:
    # issue 29: the error named the file, but the log file (and trackers) stayed open
    with small_filesystem(tmp_path / "small", "256k") as disk:

        class Fill(TrainerCallback):
            def on_optimizer_step_end(self, trainer: pytorch_accel.Trainer, **kw: object) -> None:
                if trainer.num_updates == fill_at:
                    fill(disk)

        record = RunRecordCallback(disk / "run", log_every_n_updates=None, plot=False)
        if fill_at == 0:
            fill(disk)
        trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, record, Fill()))
        written = "config.json" if fill_at == 0 else "metrics.csv"
        with pytest.raises(OSError, match=rf"could not write '.*{written}': the disk is full"):
            trainer.train(make_regression_dataset(16), num_epochs=2, per_device_batch_size=4)
        assert_record_closed(record)


def fill(disk: Path) -> None:
    usage = os.statvfs(disk)
    with contextlib.suppress(OSError):
        (disk / "filler").write_bytes(b"\0" * (usage.f_bavail * usage.f_frsize))
