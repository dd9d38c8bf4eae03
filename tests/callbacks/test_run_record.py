"""RunRecordCallback in real runs: every file present and parseable, the log, the trackers."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import yaml
from helpers import make_regression_dataset, make_trainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import pytorch_accel
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, RunRecordCallback
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
    assert messages[1] == "training: 2 epochs, 16 updates, 4 samples per update"
    assert [m.split("  ")[0] for m in messages[2:]] == ["epoch 1/2", "epoch 2/2"]
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
    assert [event.step for event in events.Scalars("eval_loss_epoch")] == [1, 2]


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"directory": 3}, TypeError, r"RunRecordCallback: directory must be a path, got 3"),
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
