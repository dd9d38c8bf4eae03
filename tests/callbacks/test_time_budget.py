"""TimeBudgetCallback: stops at a check once over budget, saves a state to resume, checks input."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
from helpers import RecordingCallback, clone_params, make_regression_dataset, make_trainer

from pytorch_accel.callbacks import SaveTrainingStateCallback, TimeBudgetCallback
from pytorch_accel.training_state import find_training_states

TINY = 1e-9  # over after any step: the first check stops the run, whatever the machine's speed


def test_an_exhausted_budget_stops_at_the_first_check_through_the_stop_events() -> None:
    recorder = RecordingCallback()
    budget = TimeBudgetCallback(max_time=TINY, check_every_n_steps=3)
    trainer = make_trainer(callbacks=(budget, recorder))
    trainer.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    assert trainer.num_updates == 3
    assert budget.stopped
    assert budget.elapsed > 0
    assert trainer.stopped_by is not None
    assert "Time budget of 1e-09 s reached after 3 updates" in str(trainer.stopped_by)
    assert recorder.events[-2:] == ["on_stop_training_error", "on_training_run_end"]


def test_an_ample_budget_changes_nothing() -> None:
    budget = TimeBudgetCallback(max_time=datetime.timedelta(hours=1))
    with_budget = make_trainer(callbacks=(budget,))
    with_budget.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    plain = make_trainer()
    plain.train(make_regression_dataset(64), num_epochs=2, per_device_batch_size=4)
    assert with_budget.stopped_by is None
    assert not budget.stopped
    assert with_budget.num_updates == 32
    for a, b in zip(clone_params(with_budget.model), clone_params(plain.model), strict=True):
        assert torch.equal(a, b)


def test_with_a_saver_it_saves_a_state_that_resume_latest_continues_exactly(
    tmp_path: Path,
) -> None:
    dataset = make_regression_dataset(64)
    reference = make_trainer()
    reference.train(dataset, num_epochs=2, per_device_batch_size=4, max_grad_norm=1.0)

    def saver() -> SaveTrainingStateCallback:
        return SaveTrainingStateCallback(tmp_path, preemption_signals=())

    first = make_trainer(callbacks=(saver(), TimeBudgetCallback(TINY, check_every_n_steps=5)))
    first.train(dataset, num_epochs=2, per_device_batch_size=4, max_grad_norm=1.0)
    assert [path.name for path in find_training_states(tmp_path)] == ["time-limit-00000005"]
    assert "time-limit-00000005" in str(first.stopped_by)
    second = make_trainer(callbacks=(saver(), TimeBudgetCallback(3600)))
    second.train(
        dataset, num_epochs=2, per_device_batch_size=4, max_grad_norm=1.0, resume_from="latest"
    )
    assert second.resumed_from == tmp_path / "time-limit-00000005"
    for a, b in zip(clone_params(second.model), clone_params(reference.model), strict=True):
        assert torch.equal(a, b)
    assert [p.name for p in find_training_states(tmp_path)][-1] == "final"


def test_the_budget_is_checked_at_epoch_ends_too() -> None:
    budget = TimeBudgetCallback(max_time=TINY, check_every_n_steps=1000)
    trainer = make_trainer(callbacks=(budget,))
    trainer.train(make_regression_dataset(64), num_epochs=3, per_device_batch_size=4)
    assert trainer.num_updates == 16
    assert trainer.run_history.current_epoch == 2


@pytest.mark.parametrize(
    ("max_time", "error", "match"),
    [
        (0, ValueError, "max_time must be a finite duration > 0"),
        (float("inf"), ValueError, "max_time must be a finite duration > 0"),
        (datetime.timedelta(0), ValueError, "max_time must be a finite duration > 0"),
        ("1h", TypeError, "max_time must be seconds or a datetime.timedelta"),
        (True, TypeError, "max_time must be seconds or a datetime.timedelta"),
    ],
)
def test_bad_budgets_are_refused(max_time: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        TimeBudgetCallback(max_time)  # type: ignore[arg-type]


def test_bad_check_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="check_every_n_steps must be a positive int"):
        TimeBudgetCallback(10, check_every_n_steps=0)
