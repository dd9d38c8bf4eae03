"""One output directory per run: ``Trainer(output_dir=...)``, ``train(run_name=...)``.

Real training on a tiny model; the callbacks write their real files, and the tests look at
where they landed.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    DEFAULT_CALLBACKS,
    DefaultPath,
    ModelEmaCallback,
    PlotMetricsCallback,
    RunPaths,
    RunRecordCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TrackingCallback,
    TrainerCallback,
)

RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(-\d+)?$")


def trainer_with(*callbacks: Any, output_dir: Path | None = None) -> Trainer:
    model = make_model()
    return Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(*DEFAULT_CALLBACKS, *callbacks),
        output_dir=output_dir,
    )


def train(trainer: Trainer, num_epochs: int = 1, **kwargs: Any) -> None:
    trainer.train(
        make_regression_dataset(32),
        num_epochs=num_epochs,
        eval_dataset=make_regression_dataset(8, seed=1),
        per_device_batch_size=8,
        **kwargs,
    )


def files_under(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file()}


def catalogue_callbacks() -> tuple[TrainerCallback, ...]:
    return (
        SaveBestModelCallback(),
        SaveTrainingStateCallback(),
        ModelEmaCallback(),
        PlotMetricsCallback(),
        TrackingCallback(log_with=("tensorboard",)),
    )


def test_without_output_dir_the_default_paths_are_todays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    callbacks = catalogue_callbacks()
    trainer = trainer_with(*callbacks)
    assert trainer.run_dir is None
    train(trainer)
    assert trainer.run_dir is None
    top = {path.name for path in tmp_path.iterdir()}
    assert {"best_model.pt", "training_states", "ema_model.pt", "metrics.png"} <= top
    assert {"metrics.csv", "runs"} <= top
    assert callbacks[0].save_path == Path("best_model.pt")  # as pytorch-accelerated's
    assert callbacks[1].training_states_dir() == Path("training_states")


def test_default_paths_live_in_one_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    callbacks = catalogue_callbacks()
    trainer = trainer_with(*callbacks, output_dir=Path("out"))
    run_dir = trainer.run_dir
    assert run_dir is not None
    assert run_dir.parent == Path("out")
    assert RUN_NAME.match(run_dir.name), run_dir.name
    train(trainer)
    assert [path.name for path in tmp_path.iterdir()] == ["out"]  # nothing in the working dir
    assert [path.name for path in Path("out").iterdir()] == [run_dir.name]
    files = files_under(run_dir)
    for expected in ("best_model.pt", "ema_model.pt", "metrics.png", "metrics.csv"):
        assert expected in files, files
    assert any(name.startswith("training_states/final/") for name in files)
    assert any(name.startswith("runs/pytorch-accel/events.out.tfevents") for name in files)
    assert callbacks[0].save_path == run_dir / "best_model.pt"
    assert callbacks[1].training_states_dir() == run_dir / "training_states"


def test_explicit_paths_win_even_when_they_spell_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    best = SaveBestModelCallback("best_model.pt")  # given, so relative to the working dir
    states = SaveTrainingStateCallback(save_dir=tmp_path / "states")
    plot = PlotMetricsCallback()
    plot.path = Path("assigned.png")  # set after construction: the user's, never moved
    trainer = trainer_with(best, states, plot, output_dir=Path("out"))
    train(trainer)
    assert (tmp_path / "best_model.pt").is_file()
    assert (tmp_path / "states" / "final").is_dir()
    assert (tmp_path / "assigned.png").is_file()
    assert trainer.run_dir is not None
    assert files_under(trainer.run_dir) == set()
    assert best.save_path == Path("best_model.pt")


def test_a_run_name_names_the_directory_for_this_call_and_later_ones(tmp_path: Path) -> None:
    best = SaveBestModelCallback()
    trainer = trainer_with(best, output_dir=tmp_path)
    first = trainer.run_dir
    train(trainer, run_name="stage-a")
    assert trainer.run_dir == tmp_path / "stage-a"
    assert (tmp_path / "stage-a" / "best_model.pt").is_file()
    train(trainer, reset_run_history=False)  # a later stage of the same run: same directory
    assert trainer.run_dir == tmp_path / "stage-a"
    train(trainer, run_name="stage-b")
    assert best.save_path == tmp_path / "stage-b" / "best_model.pt"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["stage-a", "stage-b"]
    assert first is not None
    assert not first.exists()  # the drawn name was never used, so never created


def test_trainers_created_in_the_same_second_get_different_directories(tmp_path: Path) -> None:
    trainers = [trainer_with(output_dir=tmp_path) for _ in range(3)]
    names = [trainer.run_dir.name for trainer in trainers if trainer.run_dir is not None]
    assert len(set(names)) == 3, names
    assert all(RUN_NAME.match(name) for name in names)


class StopAfterEpoch(TrainerCallback):
    """Ends the process's run after ``epoch``'s state is saved, as a kill would (no ``final``)."""

    order = 2000  # after SaveTrainingStateCallback's epoch save

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.run_history.current_epoch == self.epoch:
            raise SystemExit("killed")


def test_resume_latest_continues_the_run_with_the_newest_state(tmp_path: Path) -> None:
    old = trainer_with(SaveTrainingStateCallback(save_every_n_epochs=1), output_dir=tmp_path)
    train(old, run_name="older")  # a finished run, saved earlier
    saver = SaveTrainingStateCallback(save_every_n_epochs=1, save_at_end=False)
    killed = trainer_with(
        saver, TrackingCallback(log_with=()), StopAfterEpoch(1), output_dir=tmp_path
    )
    with pytest.raises(SystemExit):
        train(killed, num_epochs=3)
    killed_dir = killed.run_dir
    assert killed_dir is not None
    assert [path.name for path in (killed_dir / "training_states").iterdir()] == ["epoch-0001"]

    # the relaunched job: a new trainer, a new drawn name; "latest" finds the killed run
    relaunched = trainer_with(
        SaveTrainingStateCallback(save_every_n_epochs=1),
        TrackingCallback(log_with=()),
        output_dir=tmp_path,
    )
    assert relaunched.run_dir != killed_dir
    train(relaunched, num_epochs=3, resume_from="latest")
    assert relaunched.run_dir == killed_dir
    assert relaunched.resumed_from == killed_dir / "training_states" / "epoch-0001"
    assert len(relaunched.run_history.get_metric_values("train_loss_epoch")) == 3
    with (killed_dir / "metrics.csv").open() as file:  # one series, in one directory
        assert [row["epoch"] for row in csv.DictReader(file)] == ["1", "2", "3"]
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["older", killed_dir.name])

    # an explicit run name searches only that run: nothing there, so it starts afresh
    fresh = trainer_with(SaveTrainingStateCallback(), output_dir=tmp_path)
    train(fresh, run_name="fresh", resume_from="latest")
    assert fresh.resumed_from is None
    assert fresh.run_dir == tmp_path / "fresh"


def test_resume_latest_with_an_explicit_save_dir_searches_it_as_given(tmp_path: Path) -> None:
    states = tmp_path / "states"
    first = trainer_with(SaveTrainingStateCallback(states), output_dir=tmp_path / "out")
    train(first)
    again = trainer_with(SaveTrainingStateCallback(states), output_dir=tmp_path / "out")
    drawn = again.run_dir
    train(again, num_epochs=2, resume_from="latest")
    assert again.resumed_from == states / "final"
    assert again.run_dir == drawn  # the run keeps its own directory


class SeesRunDir(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[Path | None] = []
        self.out_dir = DefaultPath("results")
        self._run_paths = RunPaths(out_dir=self.out_dir)

    def place_outputs(self, run_dir: Path) -> None:
        self._run_paths.place(self, run_dir)

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen.append(trainer.run_dir)
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.out_dir) / "note.txt").write_text("written\n")


def test_a_dry_run_chooses_and_creates_no_run_directory(tmp_path: Path) -> None:
    sees, best = SeesRunDir(), SaveBestModelCallback()
    trainer = trainer_with(sees, best, output_dir=tmp_path / "out")
    drawn = trainer.run_dir
    train(trainer, dry_run=True, run_name="named")
    assert not (tmp_path / "out").exists()
    assert trainer.run_dir == drawn
    assert sees.seen[0] is not None
    assert not sees.seen[0].is_relative_to(tmp_path)  # inside the dry run's temporary dir
    train(trainer)
    assert sees.seen[1] == drawn
    assert drawn is not None
    assert files_under(drawn) == {"best_model.pt", "results/note.txt"}


def test_a_callback_of_ones_own_follows_the_run_directory(tmp_path: Path) -> None:
    sees = SeesRunDir()
    trainer = trainer_with(sees, output_dir=tmp_path)
    train(trainer, run_name="mine")
    assert (tmp_path / "mine" / "results" / "note.txt").is_file()
    assert sees.out_dir == str(tmp_path / "mine" / "results")  # the attribute's type is kept


def test_evaluate_writes_the_default_files_in_the_run_directory(tmp_path: Path) -> None:
    tracking = TrackingCallback(log_with=())
    trainer = trainer_with(tracking, output_dir=tmp_path)
    trainer.evaluate(make_regression_dataset(8), per_device_batch_size=4)
    assert trainer.run_dir is not None
    assert tracking.csv_path == trainer.run_dir / "metrics.csv"
    assert (trainer.run_dir / "metrics.csv").is_file()


def test_a_run_record_without_a_directory_is_the_run_directory(tmp_path: Path) -> None:
    record = RunRecordCallback(log_with=(), plot=False)
    trainer = trainer_with(record, output_dir=tmp_path)
    train(trainer, run_name="recorded")
    for name in ("config.json", "environment.json", "train.log", "metrics.csv"):
        assert (tmp_path / "recorded" / name).is_file(), name


@pytest.mark.bad_input
def test_a_run_record_without_a_directory_needs_an_output_dir() -> None:
    trainer = trainer_with(RunRecordCallback(log_with=(), plot=False))
    with pytest.raises(ValueError, match=r"RunRecordCallback.*directory.*output_dir='runs'"):
        train(trainer)


@pytest.mark.bad_input
def test_run_name_needs_an_output_dir_and_one_directory_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Trainer.train.*run_name.*output_dir='runs'"):
        train(trainer_with(), run_name="a")
    trainer = trainer_with(output_dir=tmp_path)
    for bad in ("a/b", "..", ""):
        with pytest.raises(ValueError, match=r"Trainer.train.*run_name.*a directory name"):
            train(trainer, run_name=bad)
    with pytest.raises(TypeError, match=r"Trainer.train.*run_name.*a directory name"):
        train(trainer, run_name=3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.bad_input
def test_output_dir_must_be_a_directory_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(TypeError, match=r"Trainer.*output_dir.*a directory path"):
        trainer_with(output_dir=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Trainer.*output_dir.*existing file"):
        trainer_with(output_dir=tmp_path / "file")


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in files_under(directory)}


@pytest.mark.bad_input
def test_a_second_trainer_never_overwrites_a_run_of_the_same_name(tmp_path: Path) -> None:
    first = trainer_with(SaveTrainingStateCallback(save_every_n_epochs=1), output_dir=tmp_path)
    train(first, num_epochs=2, run_name="baseline")
    run_dir = tmp_path / "baseline"
    before = _snapshot(run_dir)
    assert {"training_states/epoch-0001", "training_states/final"} <= {
        str(Path(name).parent) for name in before
    }

    second = trainer_with(SaveTrainingStateCallback(save_every_n_epochs=1), output_dir=tmp_path)
    with pytest.raises(
        ValueError,
        match=r"Trainer.train: run_name='baseline'.*"
        + re.escape(repr(str(run_dir)))
        + r" already holds another run's files.*another run_name.*resume_from='latest'.*"
        r"move or delete that directory",
    ):
        train(second, num_epochs=1, run_name="baseline")
    assert _snapshot(run_dir) == before  # not a byte changed

    # The ways on: another name, or continuing that run; and a trainer's own later stages.
    train(second, num_epochs=1, run_name="baseline-2")
    train(second, num_epochs=1, run_name="baseline-2", reset_run_history=False)
    third = trainer_with(SaveTrainingStateCallback(save_every_n_epochs=1), output_dir=tmp_path)
    train(third, num_epochs=3, run_name="baseline", resume_from="latest")
    assert third.resumed_from == run_dir / "training_states" / "final"


def test_an_empty_run_directory_made_beforehand_is_used(tmp_path: Path) -> None:
    (tmp_path / "prepared").mkdir()
    trainer = trainer_with(TrackingCallback(log_with=()), output_dir=tmp_path)
    train(trainer, run_name="prepared")
    assert "metrics.csv" in files_under(tmp_path / "prepared")


@pytest.mark.bad_input
def test_a_run_directory_linking_out_of_the_output_dir_is_refused(tmp_path: Path) -> None:
    output_dir, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    output_dir.mkdir()
    elsewhere.mkdir()
    (output_dir / "linked").symlink_to(elsewhere, target_is_directory=True)
    trainer = trainer_with(TrackingCallback(log_with=()), output_dir=output_dir)
    with pytest.raises(
        ValueError,
        match=r"Trainer.train: run_name='linked'.*is a link to "
        + re.escape(repr(str(elsewhere)))
        + r", outside the output directory.*another run_name, or remove the link",
    ):
        train(trainer, run_name="linked")
    assert list(elsewhere.iterdir()) == []
    # A link to a directory inside the output root is not "out of" it.
    (output_dir / "inside").mkdir()
    (output_dir / "alias").symlink_to(output_dir / "inside", target_is_directory=True)
    train(trainer, run_name="alias")
    assert "metrics.csv" in files_under(output_dir / "inside")
