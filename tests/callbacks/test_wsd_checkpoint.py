"""WSDCheckpointCallback: real runs save before and after every decay, and continue from them."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import LearningRateRecorder, make_regression_dataset, make_trainer
from torch.optim.lr_scheduler import StepLR

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.callbacks.wsd_checkpoint import WSDCheckpointCallback
from pytorch_accel.schedulers import WSDLrScheduler


class WeightsAfterEachUpdate(TrainerCallback):
    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        state = trainer.get_model().state_dict()
        self.weights[trainer.num_updates] = {k: v.clone() for k, v in state.items()}


def train_wsd(callbacks: tuple[Any, ...], **scheduler_options: Any) -> Trainer:
    trainer = make_trainer(callbacks=callbacks, lr=0.1)
    options = {"num_checkpoints": 2, "decay_phase_ratio": 0.25, "lr_min": 0.01}
    trainer.train(
        make_regression_dataset(40),  # 10 batches of 4, windows of 3, 3, 3, 1: 4 updates
        num_epochs=4,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(**{**options, **scheduler_options}),
    )
    return trainer


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def test_saves_before_and_after_each_decay(tmp_path: Path) -> None:
    callback = WSDCheckpointCallback(save_dir=tmp_path / "wsd")
    weights, recorder = WeightsAfterEachUpdate(), LearningRateRecorder()
    trainer = train_wsd((callback, weights, recorder), num_warmup_epochs=1)

    # 16 updates, checkpoints after 8 and 16, decays of 2 updates: 7-8 and 15-16.
    assert trainer.scheduler.get_checkpoint_steps() == [8, 16]
    names = [path.name for path in callback.saved_checkpoints]
    assert names == [
        "checkpoint_6_wsd_pre_decay.pt",
        "checkpoint_8_wsd_post_decay.pt",
        "checkpoint_14_wsd_pre_decay.pt",
        "checkpoint_16_wsd_post_decay.pt",
    ]
    assert sorted(path.name for path in (tmp_path / "wsd").iterdir()) == sorted(names)
    lrs = recorder.first_group
    assert lrs[5] == 0.1 > lrs[6] > lrs[7] == 0.1 * 0.01  # updates 6, 7, 8
    for path in callback.saved_checkpoints:
        checkpoint = load(path)
        step = checkpoint["step"]
        assert checkpoint["checkpoint_type"] in path.name
        assert checkpoint["total_steps"] == 16
        assert checkpoint["decay_phase_ratio"] == 0.25
        assert checkpoint["scheduler_state_dict"]["_num_updates"] == step
        for key, value in weights.weights[step].items():
            assert torch.equal(checkpoint["model_state_dict"][key], value)


def test_post_decay_checkpoints_can_leave_out_the_optimizer(tmp_path: Path) -> None:
    callback = WSDCheckpointCallback(tmp_path, save_optimizer=False, save_scheduler=False)
    train_wsd((callback,), num_checkpoints=1)
    pre, post = (load(path) for path in callback.saved_checkpoints)
    assert {"optimizer_state_dict", "scheduler_state_dict"} <= set(pre)
    assert not {"optimizer_state_dict", "scheduler_state_dict"} & set(post)


def test_a_continuation_run_starts_from_a_pre_decay_checkpoint(tmp_path: Path) -> None:
    first = WSDCheckpointCallback(tmp_path / "first")
    train_wsd((first,), num_checkpoints=1, num_warmup_epochs=1)
    pre_decay = first.saved_checkpoints[0]
    assert pre_decay.name == "checkpoint_12_wsd_pre_decay.pt"

    class ModelAtStart(TrainerCallback):
        def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
            self.state = {k: v.clone() for k, v in trainer.get_model().state_dict().items()}

    second = WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=pre_decay)
    at_start, recorder = ModelAtStart(), LearningRateRecorder()
    trainer = train_wsd(
        (second, at_start, recorder),
        num_checkpoints=1,
        num_warmup_epochs=1,
        is_continuation_from_checkpoint=True,
    )
    saved = load(pre_decay)["model_state_dict"]
    assert all(torch.equal(at_start.state[key], value) for key, value in saved.items())
    # No warmup; the base LR comes from the loaded state; the final decay ends the run.
    assert trainer.scheduler.num_warmup_steps == 0
    assert recorder.first_group[:12] == [0.1] * 12
    assert recorder.first_group[-1] == 0.1 * 0.01
    assert [path.name for path in second.saved_checkpoints] == [
        "checkpoint_12_wsd_pre_decay.pt",
        "checkpoint_16_wsd_post_decay.pt",
    ]


@pytest.mark.parametrize(
    "create_scheduler_fn", [None, functools.partial(StepLR, step_size=2)], ids=["none", "steplr"]
)
def test_needs_a_wsd_scheduler(tmp_path: Path, create_scheduler_fn: Any) -> None:
    trainer = make_trainer(callbacks=(WSDCheckpointCallback(tmp_path),))
    with pytest.raises(ValueError, match=r"trainer.scheduler must be a WSDLrScheduler.*create_"):
        trainer.train(
            make_regression_dataset(8),
            num_epochs=1,
            per_device_batch_size=4,
            create_scheduler_fn=create_scheduler_fn,
        )


def test_rejects_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"WSDCheckpointCallback: save_dir must be a str or os"):
        WSDCheckpointCallback(save_dir=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"initial_checkpoint must be a str"):
        WSDCheckpointCallback(initial_checkpoint=["a.pt"])  # type: ignore[arg-type]
    callback = WSDCheckpointCallback(tmp_path, initial_checkpoint=tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match=r"missing\.pt"):
        train_wsd((callback,))
