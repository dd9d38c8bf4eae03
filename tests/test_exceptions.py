"""on_exception and Ctrl-C: fired once; trackers and records closed; a saved interrupt resumes."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import (
    ProgressBarCallback,
    RunRecordCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
)
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.training_state import find_training_states


class Seen(TrainerCallback):
    """Records every on_exception it gets."""

    def __init__(self) -> None:
        self.seen: list[tuple[BaseException, str]] = []

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self.seen.append((exception, kwargs["where"]))


class RaisesAtStep(TrainerCallback):
    """Raises ``error`` (a ``StopTrainingError`` too) at the end of step ``at`` (1-based)."""

    def __init__(self, error: BaseException, at: int = 3) -> None:
        self.error, self.at, self.steps = error, at, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps += 1
        if self.steps == self.at:
            raise self.error


class Interrupts(TrainerCallback):
    """Sends this process SIGINT (a real Ctrl-C) during step ``at`` (1-based)."""

    def __init__(self, at: int) -> None:
        self.at, self.steps = at, 0

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps += 1
        if self.steps == self.at:
            signal.raise_signal(signal.SIGINT)


def data() -> Any:
    return make_regression_dataset(32)


def test_fired_once_with_the_exception_from_train_evaluate_and_predict() -> None:
    seen = Seen()
    error = ValueError("boom in a callback")
    trainer = make_trainer(callbacks=(seen, RaisesAtStep(error)))
    with pytest.raises(ValueError, match="boom in a callback"):
        trainer.train(data(), num_epochs=1, per_device_batch_size=4)
    assert seen.seen == [(error, "train")]
    trainer.callback_handler.remove_callback(RaisesAtStep)

    class FailsToPredict(Trainer):
        def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
            raise RuntimeError("eval failed")

        def calculate_predict_batch(self, batch: Any) -> Any:
            raise RuntimeError("predict failed")

    model = make_model()
    failing = make_trainer(model, callbacks=(seen,), trainer_class=FailsToPredict)
    with pytest.raises(RuntimeError, match="eval failed"):
        failing.evaluate(data())
    with pytest.raises(RuntimeError, match="predict failed"):
        failing.predict(data())
    assert [(str(e), where) for e, where in seen.seen[1:]] == [
        ("eval failed", "evaluate"),
        ("predict failed", "predict"),
    ]


def test_not_fired_for_a_stop_and_once_through_nested_entry_points() -> None:
    seen = Seen()
    stopped = make_trainer(callbacks=(seen, RaisesAtStep(StopTrainingError("enough"))))
    stopped.train(data(), num_epochs=1, per_device_batch_size=4)
    assert str(stopped.stopped_by) == "enough"
    assert seen.seen == []
    # a dry run calls train() inside train(): the exception passes two entry points
    error = ValueError("in a dry run")
    failing = make_trainer(callbacks=(seen, RaisesAtStep(error, at=1)))
    with pytest.raises(ValueError, match="in a dry run"):
        failing.train(data(), num_epochs=1, dry_run=True)
    assert seen.seen == [(error, "train")]


def test_an_error_in_a_handler_is_logged_and_does_not_hide_the_original(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(TrainerCallback):
        order = -1  # before the one that records

        def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
            raise RuntimeError("the handler broke")

    seen = Seen()
    error = ValueError("the original")
    trainer = make_trainer(callbacks=(Broken(), seen, RaisesAtStep(error)))
    logger = logging.getLogger("pytorch_accel")
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(ValueError, match="the original"):
            trainer.train(data(), num_epochs=1, per_device_batch_size=4)
    finally:
        logger.removeHandler(caplog.handler)
    assert seen.seen == [(error, "train")]  # the next listener still got it
    assert "Broken.on_exception raised while handling ValueError from train()" in caplog.text
    assert "the handler broke" in caplog.text  # with its traceback


def test_ctrl_c_closes_the_record_the_trackers_and_the_bars(tmp_path: Path) -> None:
    record = RunRecordCallback(tmp_path / "run", log_with=("tensorboard",), plot=False)
    bars, seen = ProgressBarCallback(show=True), Seen()
    trainer = make_trainer(callbacks=(record, bars, seen, Interrupts(at=5)))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(data(), num_epochs=2, per_device_batch_size=4)
    assert [type(e) for e, _ in seen.seen] == [KeyboardInterrupt]
    outcome = json.loads(record.path("outcome").read_text())
    expected = {"status": "interrupted", "epochs": 0, "updates": 4, "error": "KeyboardInterrupt"}
    assert outcome == expected
    assert (
        record.path("log")
        .read_text()
        .splitlines()[-1]
        .endswith("run interrupted at update 4: KeyboardInterrupt")
    )
    assert record.trackers == []  # finished: TensorBoard's file is flushed and closed
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert bars.pbar.disable  # closed (tqdm disables a closed bar)
    # a completed run says so, and a stopped one gives the stop's message
    trainer.callback_handler.remove_callback(Interrupts)
    trainer.train(data(), num_epochs=1, per_device_batch_size=4)
    assert json.loads(record.path("outcome").read_text())["status"] == "completed"


def test_any_other_error_is_recorded_as_failed(tmp_path: Path) -> None:
    record = RunRecordCallback(tmp_path / "run", log_with=(), plot=False)
    trainer = make_trainer(callbacks=(record, RaisesAtStep(ValueError("bad batch"), at=2)))
    with pytest.raises(ValueError, match="bad batch"):
        trainer.train(data(), num_epochs=1, per_device_batch_size=4)
    outcome = json.loads(record.path("outcome").read_text())
    assert (outcome["status"], outcome["error"]) == ("failed", "ValueError: bad batch")


def test_save_on_interrupt_saves_a_state_that_resumes_exactly(tmp_path: Path) -> None:
    def run(*callbacks: TrainerCallback, **kwargs: Any) -> Trainer:
        trainer = make_trainer(
            make_model(), callbacks=callbacks, optimizer_class=torch.optim.AdamW, lr=0.01
        )
        trainer.train(data(), num_epochs=2, per_device_batch_size=4, seed=3, **kwargs)
        return trainer

    uninterrupted = run()
    saves = SaveTrainingStateCallback(tmp_path / "states", save_on_interrupt=True)
    before = signal.getsignal(signal.SIGINT)
    record = RunRecordCallback(tmp_path / "run", log_with=(), plot=False)
    with pytest.raises(KeyboardInterrupt):
        run(saves, record, Interrupts(at=11))  # in the second epoch
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    states = find_training_states(tmp_path / "states")
    assert [state.name for state in states] == ["interrupted-00000011"]  # the step finished
    outcome = json.loads(record.path("outcome").read_text())
    assert outcome["status"] == "interrupted"
    assert "Interrupted (Ctrl-C): the training state was saved" in outcome["error"]
    record = RunRecordCallback(tmp_path / "resumed", log_with=(), plot=False)
    resumed = run(SaveTrainingStateCallback(tmp_path / "states"), record, resume_from="latest")
    assert resumed.run_history.get_metric_values("train_loss_epoch") == (
        uninterrupted.run_history.get_metric_values("train_loss_epoch")
    )
    for a, b in zip(clone_params(resumed.model), clone_params(uninterrupted.model), strict=True):
        assert torch.equal(a, b)


def test_without_save_on_interrupt_ctrl_c_interrupts_at_once_and_restores_handlers(
    tmp_path: Path,
) -> None:
    saves = SaveTrainingStateCallback(tmp_path / "states")
    before = signal.getsignal(signal.SIGTERM)
    trainer = make_trainer(callbacks=(saves, Interrupts(at=3)))
    with pytest.raises(KeyboardInterrupt):
        trainer.train(data(), num_epochs=1, per_device_batch_size=4)
    assert trainer.num_updates == 2  # interrupted inside the third step
    assert signal.getsignal(signal.SIGTERM) is before
    assert find_training_states(tmp_path / "states") == []  # no final state


def test_a_batch_size_search_announces_no_trial_that_ran_out_of_memory() -> None:
    from test_micro_batches import OutOfMemoryAbove

    seen = Seen()
    model = OutOfMemoryAbove(37, in_backward=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(seen,))
    assert trainer.find_batch_size(make_regression_dataset(128)) == 32  # 64 ran out of memory
    assert seen.seen == []
    trainer.callback_handler.add_callback(RaisesAtStep(ValueError("search failed"), at=1))
    with pytest.raises(ValueError, match="search failed"):  # any other error is announced
        trainer.find_batch_size(make_regression_dataset(128))
    assert [(str(e), where) for e, where in seen.seen] == [("search failed", "find_batch_size")]


def test_an_error_in_find_lr_is_announced_once() -> None:
    seen = Seen()
    error = ValueError("boom in a sweep")
    trainer = make_trainer(callbacks=(seen,))

    def failing_loss(batch: Any) -> dict[str, Any]:
        raise error

    trainer.calculate_train_batch_loss = failing_loss  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="boom in a sweep"):
        trainer.find_lr(data(), per_device_batch_size=4, num_steps=5)
    assert seen.seen == [(error, "find_lr")]
