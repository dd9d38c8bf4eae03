"""ProgressBarCallback: moved by progress events; the running loss at redraws or every N."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset, make_trainer
from host_reads import HostReads
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ProgressBarCallback, TrainerCallback, get_default_callbacks
from pytorch_accel.events import BUILTIN_EVENTS


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> HostReads:
    return HostReads(monkeypatch)


class PostfixLog(TrainerCallback):
    """Records the training bar's postfix after every progress event (runs after the bar)."""

    order = 1_000

    def __init__(self, bar: ProgressBarCallback) -> None:
        self.bar = bar
        self.postfixes: list[str | None] = []

        self.at_epoch_end: list[str | None] = []

    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        self.postfixes.append(self.bar.pbar.postfix)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.at_epoch_end.append(self.bar.pbar.postfix)  # the bar is closed, its postfix kept


def reporting_every_step(trainer: Trainer) -> Trainer:
    trainer.progress_interval = 0  # a progress event after every step
    return trainer


def test_with_running_loss_off_the_loss_is_shown_at_epoch_ends_only(
    host_reads: HostReads, capsys: pytest.CaptureFixture[str]
) -> None:
    bar = ProgressBarCallback(show=True, running_loss=False)
    log = PostfixLog(bar)
    trainer = reporting_every_step(make_trainer(callbacks=(bar, log, *host_reads.callbacks)))
    trainer.train(make_regression_dataset(32), num_epochs=2, per_device_batch_size=4)
    assert host_reads.calls == []
    assert log.postfixes[:8] == [None] * 8  # nothing during the first epoch
    assert log.at_epoch_end == [
        f"loss={loss:.4g}" for loss in trainer.run_history.get_metric_values("train_loss_epoch")
    ]


class RedrawLog(PostfixLog):
    """Also records whether the bar redrew at each progress event, and the bar's title."""

    def __init__(self, bar: ProgressBarCallback, sleep: float) -> None:
        super().__init__(bar)
        self.sleep = sleep
        self.redraws = 0
        self.titles: list[str] = []
        self._drawn_at = 0.0

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._drawn_at = self.bar.pbar.last_print_t  # the bar opened first (a lower order)

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        time.sleep(self.sleep)

    def on_train_progress(self, trainer: Trainer, **kwargs: Any) -> None:
        super().on_train_progress(trainer, **kwargs)
        if self.bar.pbar.last_print_t != self._drawn_at:
            self.redraws += 1
        self._drawn_at = self.bar.pbar.last_print_t
        self.titles.append(self.bar.pbar.desc)


def test_by_default_the_running_loss_is_read_when_the_bar_redraws_only(
    host_reads: HostReads, capsys: pytest.CaptureFixture[str]
) -> None:
    bar = ProgressBarCallback(show=True)
    log = RedrawLog(bar, sleep=0.02)  # 5 steps per redraw (tqdm redraws at most every 0.1 s)
    trainer = reporting_every_step(make_trainer(callbacks=(bar, log, *host_reads.callbacks)))
    trainer.train(make_regression_dataset(96), num_epochs=2, per_device_batch_size=4)
    assert 0 < len(host_reads.calls) == log.redraws < 24  # 48 steps; one read per redraw
    assert any(postfix and postfix.startswith("loss=") for postfix in log.postfixes[:24])
    assert {title.split(":")[0] for title in log.titles} == {"train 1/2", "train 2/2"}


def test_an_interval_reads_the_running_loss_once_per_interval_only(
    host_reads: HostReads,
) -> None:
    bar = ProgressBarCallback(loss_update_interval=3, show=True)
    log = PostfixLog(bar)
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.0),  # a constant model: a known running loss
        callbacks=(bar, log, *host_reads.callbacks),
    )
    reporting_every_step(trainer)
    dataset = make_regression_dataset(40)
    trainer.train(  # 10 steps
        dataset, num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs={"shuffle": False}
    )
    assert host_reads.calls == ["item"] * 3  # after steps 3, 6 and 9
    shown = log.postfixes
    assert shown[:2] == [None, None]
    assert shown[2] == shown[3] == shown[4] != shown[5]
    inputs, targets = dataset.tensors
    with torch.no_grad():
        losses = ((model(inputs) - targets) ** 2).mean(dim=1)
    assert shown[8] == f"loss={losses[:36].mean().item():.4g}"  # the mean over 9 steps


def test_bad_interval_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"loss_update_interval must be a positive int or None"):
        ProgressBarCallback(loss_update_interval=0)


@pytest.mark.cuda
def test_on_cuda_the_loss_is_copied_without_waiting() -> None:
    bar = ProgressBarCallback(loss_update_interval=2, show=True)
    log = PostfixLog(bar)
    trainer = reporting_every_step(make_trainer(callbacks=(bar, log)))
    assert trainer.device.type == "cuda"
    trainer.train(make_regression_dataset(64), num_epochs=1, per_device_batch_size=4)
    # shown one interval late, once the copy into pinned memory has finished
    assert log.postfixes[:3] == [None, None, None]
    assert any(postfix and postfix.startswith("loss=") for postfix in log.postfixes[3:])


class CountLog(TrainerCallback):
    """Records (steps done, the training bar's count) at each progress event, after the bar."""

    order = 1_000

    def __init__(self, bar: ProgressBarCallback, sleep: float = 0.0) -> None:
        self.bar, self.sleep = bar, sleep
        self.steps = 0
        self.counts: list[tuple[int, int]] = []
        self.at_epoch_end: list[int] = []

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        time.sleep(self.sleep)
        self.steps += 1

    def on_train_progress(self, trainer: Trainer, steps_done: int, **kwargs: Any) -> None:
        self.counts.append((steps_done, self.bar.pbar.n))

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.at_epoch_end.append(self.bar.pbar.n)


def test_fast_steps_reach_the_bar_in_strides_and_the_epoch_end_is_exact() -> None:
    bar = ProgressBarCallback(show=True)
    log = CountLog(bar)
    trainer = make_trainer(callbacks=(bar, log))
    trainer.train(make_regression_dataset(256), num_epochs=1, per_device_batch_size=4)
    assert all(done == shown for done, shown in log.counts)
    assert len(log.counts) < log.steps == 64  # not one update per step
    assert log.at_epoch_end == [64]


def test_slow_steps_reach_the_bar_one_by_one() -> None:
    bar = ProgressBarCallback(show=True)
    log = CountLog(bar, sleep=0.06)  # slower than the trainer's 0.05 s progress interval
    trainer = make_trainer(callbacks=(bar, log))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert log.counts == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_the_default_callbacks_listen_to_no_per_step_event() -> None:
    per_step = {e for e in BUILTIN_EVENTS if "_step_" in e or e.startswith("on_backward_")}
    assert len(per_step) == 10  # train, eval and predict step start/end, backward, optimizer step
    trainer = make_trainer(callbacks=get_default_callbacks())
    assert per_step.isdisjoint(trainer.callback_handler.active_events)
    assert {"on_train_progress", "on_eval_progress"} <= trainer.callback_handler.active_events


def test_bars_are_off_where_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    bar = ProgressBarCallback()  # show=None: tqdm checks for a terminal
    trainer = make_trainer(callbacks=(bar,))
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert bar.pbar.disable
    assert capsys.readouterr().err == ""
