"""TrainerWithTimmScheduler steps timm schedulers exactly like timm's own training loop."""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import Any

import pytest
import torch
from helpers import LearningRateRecorder, make_model, make_regression_dataset, make_trainer
from timm.scheduler import CosineLRScheduler
from torch.optim.lr_scheduler import StepLR

from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.timm_trainer import TimmScheduler, TrainerWithTimmScheduler

EPOCHS, UPDATES_PER_EPOCH = 4, 4  # 22 samples in batches of 2, windows of 3: 3, 3, 3, 2


def timm_reference(make_scheduler: Any, epochs: int, updates_per_epoch: int) -> list[float]:
    """The LR of every update in timm's loop (timm/train.py), stepped by hand."""
    optimizer = torch.optim.SGD(make_model().parameters(), lr=0.1)
    scheduler = make_scheduler(optimizer)
    lrs, num_updates = [], 0
    for epoch in range(epochs):
        for _ in range(updates_per_epoch):
            lrs.append(optimizer.param_groups[0]["lr"])
            num_updates += 1
            scheduler.step_update(num_updates=num_updates)
        scheduler.step(epoch + 1)
    return lrs


def train_timm(make_scheduler: Any, *, with_eval: bool, callbacks: tuple[Any, ...] = ()) -> Any:
    trainer = make_trainer(callbacks=callbacks, lr=0.1, trainer_class=TrainerWithTimmScheduler)
    trainer.train(
        make_regression_dataset(22),
        num_epochs=EPOCHS,
        eval_dataset=make_regression_dataset(6, seed=1) if with_eval else None,
        per_device_batch_size=2,
        gradient_accumulation_steps=3,
        create_scheduler_fn=make_scheduler,
    )
    return trainer


PER_UPDATE = functools.partial(
    CosineLRScheduler,
    t_initial=P.TOTAL_NUM_UPDATE_STEPS,
    warmup_t=P.NUM_UPDATE_STEPS_PER_EPOCH,
    warmup_lr_init=1e-3,
    lr_min=1e-4,
    t_in_epochs=False,
)
PER_EPOCH = functools.partial(
    CosineLRScheduler, t_initial=P.NUM_EPOCHS, warmup_t=1, warmup_lr_init=1e-3, lr_min=1e-4
)


@pytest.mark.parametrize("with_eval", [False, True], ids=["no_eval", "eval"])
@pytest.mark.parametrize(
    ("factory", "reference"),
    [
        (
            PER_UPDATE,
            functools.partial(
                CosineLRScheduler,
                t_initial=16,
                warmup_t=4,
                warmup_lr_init=1e-3,
                lr_min=1e-4,
                t_in_epochs=False,
            ),
        ),
        (
            PER_EPOCH,
            functools.partial(
                CosineLRScheduler, t_initial=4, warmup_t=1, warmup_lr_init=1e-3, lr_min=1e-4
            ),
        ),
    ],
    ids=["per_update", "per_epoch"],
)
def test_timm_cosine_with_warmup_matches_timms_own_loop(
    factory: Any, reference: Any, with_eval: bool
) -> None:
    recorder = LearningRateRecorder()
    trainer = train_timm(factory, with_eval=with_eval, callbacks=(recorder,))
    expected = timm_reference(reference, EPOCHS, UPDATES_PER_EPOCH)
    assert trainer.num_updates == EPOCHS * UPDATES_PER_EPOCH
    assert recorder.first_group == expected
    assert recorder.first_group[0] == 1e-3
    assert len(set(recorder.first_group)) > 3  # the schedule really moves


class CallLog:
    """A timm-style scheduler that records how it is stepped."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.updates: list[int] = []
        self.epochs: list[tuple[int, float | None]] = []

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        self.updates.append(num_updates)

    def step(self, epoch: int, metric: float | None = None) -> None:
        self.epochs.append((epoch, metric))


def test_counts_restart_with_each_run_and_the_eval_loss_is_the_metric() -> None:
    trainer = train_timm(CallLog, with_eval=True)
    log = trainer.scheduler
    assert isinstance(log, TimmScheduler)
    assert log.updates == list(range(1, 17))
    eval_losses = trainer.run_history.get_metric_values("eval_loss_epoch")
    assert log.epochs == [
        (epoch, loss) for epoch, loss in zip(range(1, 5), eval_losses, strict=True)
    ]

    trainer.train(
        make_regression_dataset(8),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=CallLog,
        reset_run_history=False,
    )
    assert trainer.scheduler.updates == [1, 2, 3, 4]
    assert trainer.scheduler.epochs == [(1, None), (2, None)]


def test_max_num_train_steps_still_ends_the_epoch_for_the_scheduler() -> None:
    trainer = make_trainer(trainer_class=TrainerWithTimmScheduler)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=5,
        per_device_batch_size=4,
        max_num_train_steps=6,
        create_scheduler_fn=CallLog,
    )
    assert trainer.scheduler.updates == [1, 2, 3, 4, 5, 6]
    assert [epoch for epoch, _ in trainer.scheduler.epochs] == [1, 2]


def test_rejects_a_torch_scheduler() -> None:
    trainer = make_trainer(trainer_class=TrainerWithTimmScheduler)
    with pytest.raises(TypeError, match=r"create_scheduler_fn must be a function returning a timm"):
        trainer.train(
            make_regression_dataset(8),
            num_epochs=1,
            per_device_batch_size=4,
            create_scheduler_fn=functools.partial(StepLR, step_size=1),
        )


def test_importing_pytorch_accel_does_not_import_timm() -> None:
    code = (
        "import sys; import pytorch_accel, pytorch_accel.timm_trainer, pytorch_accel.schedulers, "
        "pytorch_accel.finetuning, pytorch_accel.callbacks.wsd_checkpoint; "
        "assert 'timm' not in sys.modules, 'timm was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
