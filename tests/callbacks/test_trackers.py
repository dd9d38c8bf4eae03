"""TrackingCallback in real training runs: TensorBoard event files, the CSV file, trackers."""

from __future__ import annotations

import csv
import errno
import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from accelerate.tracking import GeneralTracker
from helpers import make_regression_dataset, make_trainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.trackers import TrackingCallback, hparams_of


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_tensorboard_scalars_and_hparams_match_the_run_history(tmp_path: Path) -> None:
    tracking = TrackingCallback(
        logging_dir=tmp_path / "runs",
        csv_path=tmp_path / "metrics.csv",
        project_name="demo",
        config={"lr": 0.05, "note": {"kind": "test"}},
    )
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=8,
    )
    trainer.evaluate(make_regression_dataset(12, seed=1))
    history = trainer.run_history

    scalars = read_scalars(tmp_path / "runs" / "demo")
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert [step for step, _ in scalars[name]] == [4, 8, 12]  # the updates at epoch ends
        assert [value for _, value in scalars[name]] == pytest.approx(
            history.get_metric_values(name), rel=1e-6
        )  # TensorBoard stores float32
    assert scalars["epoch"] == [(4, 1), (8, 2), (12, 3)]
    assert scalars["evaluation_loss"] == [
        (12, pytest.approx(history.get_latest_metric("evaluation_loss"), rel=1e-6))
    ]
    files = sorted(tmp_path.rglob("hparams.yml"), key=lambda path: float(path.parent.name))
    stored = [yaml.safe_load(path.read_text()) for path in files]
    assert len(stored) == 1  # one tracker run: evaluate() continues the training's
    assert stored[0]["num_epochs"] == 3
    assert stored[0]["train_dl_kwargs.batch_size"] == 8
    assert stored[0]["gradient_clip_value"] == "None"
    assert (stored[0]["lr"], stored[0]["note.kind"]) == (0.05, "test")
    assert len(tracking.trackers) == 1  # open until the run is over
    tracking.finish()
    assert tracking.trackers == []


def test_csv_has_one_row_per_epoch_with_exact_values(tmp_path: Path) -> None:
    path = tmp_path / "out" / "metrics.csv"
    trainer = make_trainer(callbacks=(TrackingCallback(log_with=(), csv_path=path),))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=2,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=8,
    )
    trainer.evaluate(make_regression_dataset(12, seed=1))
    history = trainer.run_history
    with open(path, newline="") as handle:
        header = next(csv.reader(handle))
    assert header == ["epoch", "eval_loss_epoch", "evaluation_loss", "train_loss_epoch", "update"]
    rows = read_csv(path)
    assert [row["epoch"] for row in rows] == ["1", "2"]
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert [float(row[name]) for row in rows] == history.get_metric_values(name)  # exact
    assert rows[0]["evaluation_loss"] == ""  # evaluated after epoch 2 only
    assert float(rows[1]["evaluation_loss"]) == history.get_latest_metric("evaluation_loss")
    assert not list(path.parent.glob(".*tmp*"))  # no temporary file left behind


def test_csv_continues_or_restarts_with_the_run_history(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    trainer = make_trainer(callbacks=(TrackingCallback(log_with=(), csv_path=path),))
    dataset = make_regression_dataset(16)
    trainer.train(dataset, num_epochs=2)
    trainer.train(dataset, num_epochs=1, reset_run_history=False)
    assert [row["epoch"] for row in read_csv(path)] == ["1", "2", "3"]
    trainer.train(dataset, num_epochs=1)  # a fresh run history: a fresh file
    assert [row["epoch"] for row in read_csv(path)] == ["1"]


class StopAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.run_history.current_epoch == 2 and kwargs["step"] == self.step:
            raise StopTrainingError("stop")


class RecordingTracker(GeneralTracker):
    """A custom tracker, as users write them for accelerate: it records what it receives."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    @property
    def tracker(self) -> list[tuple[str, Any]]:
        return self.calls

    def start(self) -> None:
        self.calls.append(("start", None))

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls.append(("config", values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", (step, values)))

    def finish(self) -> None:
        self.calls.append(("finish", None))


def test_a_custom_tracker_gets_config_metrics_per_epoch_and_a_stopped_epoch(
    tmp_path: Path,
) -> None:
    tracker = RecordingTracker()
    tracking = TrackingCallback(log_with=(tracker,), csv_path=tmp_path / "m.csv")
    trainer = make_trainer(callbacks=(tracking, StopAtStep(step=1)))
    trainer.train(make_regression_dataset(32), num_epochs=3, per_device_batch_size=8)
    kinds = [kind for kind, _ in tracker.calls]
    assert kinds == ["start", "config", "log", "log", "log"]  # open while the run may go on
    tracking.finish()
    assert tracker.calls[-1] == ("finish", None)
    config = tracker.calls[1][1]
    assert config["num_epochs"] == 3
    assert all(isinstance(value, bool | int | float | str) for value in config.values())
    losses = trainer.run_history.get_metric_values("train_loss_epoch")
    assert tracker.calls[2][1] == (4, {"train_loss_epoch": losses[0], "epoch": 1})
    assert tracker.calls[3][1] == (6, {"train_loss_epoch": losses[1], "epoch": 2})  # stopped
    step, step_metrics = tracker.calls[4][1]  # the step-level point at the end of the run
    assert step == trainer.num_updates == 6  # 4 updates, then 2 in the stopped epoch
    assert step_metrics["train_loss_step"] == pytest.approx((4 * losses[0] + 2 * losses[1]) / 6)
    assert step_metrics["lr"] == 0.05
    assert [row["epoch"] for row in read_csv(tmp_path / "m.csv")] == ["1", "2"]
    assert [row["step"] for row in read_csv(tmp_path / "m_steps.csv")] == ["6"]


def test_non_numeric_metrics_go_to_the_csv_only(tmp_path: Path) -> None:
    class RecordsAList(TrainerCallback):
        def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.run_history.update_metric("per_class", [0.5, 0.25])
            trainer.run_history.update_metric("as_tensor", torch.tensor(2.0))

    tracker = RecordingTracker()
    tracking = TrackingCallback(log_with=tracker, csv_path=tmp_path / "m.csv")
    trainer = make_trainer(callbacks=(RecordsAList(), tracking))
    trainer.train(make_regression_dataset(16), num_epochs=1)
    _, logged = tracker.calls[2][1]
    assert set(logged) == {"train_loss_epoch", "as_tensor", "epoch"}
    assert logged["as_tensor"] == 2.0
    assert read_csv(tmp_path / "m.csv")[0]["per_class"] == "[0.5, 0.25]"


def test_hparams_of_flattens_and_stringifies() -> None:
    flat = hparams_of(
        {
            "a": 1,
            "b": None,
            "c": {"d": True, "e": functools.partial(make_trainer, lr=0.1)},
            "f": torch.float32,
            "g": make_trainer,
            "h": object(),
        }
    )
    assert flat == {
        "a": 1,
        "b": "None",
        "c.d": True,
        "c.e": "partial",
        "f": "torch.float32",
        "g": "make_trainer",
        "h": "object",
    }


def test_bad_tracker_names_and_missing_packages_name_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(
        ValueError, match=r"log_with must be one of .*'tensorboard'.*got 'tensorbord'"
    ):
        TrackingCallback(log_with=("tensorbord",))
    with pytest.raises(TypeError, match=r"log_with must be one of"):
        TrackingCallback(log_with=(42,))  # type: ignore[arg-type]
    monkeypatch.setattr("accelerate.tracking.get_available_trackers", lambda: [])
    with pytest.raises(ImportError, match=r'pip install "pytorch-accel\[tracking\]"'):
        TrackingCallback(log_with="tensorboard")
    with pytest.raises(TypeError, match=r"csv_path must be a path"):
        TrackingCallback(log_with=(), csv_path=3)  # type: ignore[arg-type]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes to /dev/full")
def test_a_full_disk_for_the_step_csv_names_it(tmp_path: Path) -> None:
    # issue 29: a bare "[Errno 28] No space left on device"
    tracking = TrackingCallback(log_with=(), csv_path=tmp_path / "m.csv", log_every_n_updates=1)

    class Full(TrainerCallback):
        order = 2000  # after the row is written

        def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            path = tmp_path / "m_steps.csv"
            if path.exists() and not path.is_symlink():  # written: its next rows find no space
                path.unlink()
                path.symlink_to("/dev/full")

    trainer = make_trainer(callbacks=(tracking, Full()))
    message = (
        r"TrackingCallback: could not write '.*m_steps.csv': the disk is full; free some space, "
        r"or pass another csv_path to TrackingCallback"
    )
    with pytest.raises(OSError, match=message) as info:  # the rows are written at epoch ends
        trainer.train(make_regression_dataset(16), num_epochs=2, per_device_batch_size=4)
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value.__cause__, OSError)


def step_rows() -> list[tuple[int, dict[str, float]]]:
    """Logging points as a flush reads them: a column (grad_norm) appears at the third."""
    rows: list[tuple[int, dict[str, float]]] = []
    for step in range(1, 8):
        metrics = {"train_loss_step": 1.0 / step, "lr": 0.05, "samples_per_second": 100.0 + step}
        if step >= 3:
            metrics["grad_norm"] = 0.1 * step
        rows.append((step, metrics))
    return rows


def test_a_flush_of_several_rows_writes_the_csv_of_one_call_per_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # issue 44: a flush writes its rows with one open of the step CSV (log_steps)
    trainer = make_trainer()
    rows = step_rows()
    one_by_one = TrackingCallback(log_with=(), csv_path=tmp_path / "single" / "m.csv")
    together = TrackingCallback(log_with=(), csv_path=tmp_path / "together" / "m.csv")
    for callback in (one_by_one, together):
        assert callback.step_csv_path is not None
        callback.step_csv_path.parent.mkdir()
    for step, metrics in rows:
        one_by_one.log_step(trainer, metrics, step)
    with caplog.at_level("DEBUG", logger="pytorch_accel"):
        together.log_steps(trainer, rows[:2])  # the file starts
        together.log_steps(trainer, rows[2:5])  # a column appears: written whole
        together.log_steps(trainer, rows[5:])  # appended
    assert one_by_one.step_csv_path is not None
    assert together.step_csv_path is not None
    expected = one_by_one.step_csv_path.read_bytes()
    assert together.step_csv_path.read_bytes() == expected
    assert [row["step"] for row in read_csv(together.step_csv_path)] == [str(s) for s, _ in rows]
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        f"update {step}" for step, _ in rows
    ]


class EveryRow(TrackingCallback):
    def __init__(self, csv_path: Path) -> None:
        super().__init__(log_with=(), csv_path=csv_path, log_every_n_updates=1)
        self.steps: list[int] = []

    def log_step(self, trainer: Trainer, metrics: dict[str, float], step: int) -> None:
        self.steps.append(step)
        super().log_step(trainer, metrics, step)


def test_an_override_of_log_step_still_gets_each_row_of_a_flush(tmp_path: Path) -> None:
    tracking = EveryRow(tmp_path / "m.csv")
    trainer = make_trainer(callbacks=(tracking,))
    trainer.train(make_regression_dataset(24), num_epochs=2, per_device_batch_size=8)
    assert tracking.steps == [1, 2, 3, 4, 5, 6]
    assert [row["step"] for row in read_csv(tmp_path / "m_steps.csv")] == [
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
    ]
