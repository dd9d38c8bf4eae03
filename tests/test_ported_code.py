"""Code written the way pytorch-accelerated's users write it, with only the import changed.

Each block below is that library's documented usage (its examples and API), run on tiny data.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import (
    Trainer,
    TrainerPlaceholderValues,
    accelerate_notebook_launcher,
    logger,
    notebook_launcher,
)
from pytorch_accel.callbacks import (
    CallbackMethodNotImplementedError,
    LimitBatchesCallback,
    LogMetricsCallback,
    ModelEmaCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    StopTrainingError,
    TerminateOnNaNCallback,
    TrainerCallback,
    WSDCheckpointCallback,
)
from pytorch_accel.run_config import TrainerRunConfig
from pytorch_accel.schedulers import CosineLrScheduler, WSDLrScheduler
from pytorch_accel.tracking import LossTracker
from pytorch_accel.trainer import (
    DEFAULT_CALLBACKS,
    MoveModulesToDeviceCallback,
    TrainerWithTimmScheduler,
    remove_padding,
    set_seed,
    worker_init_fn,
)
from pytorch_accel.utils import (
    LIMIT_BATCHES_ENV_VAR,
    DataLoaderSlice,
    LimitBatches,
    ModelEma,
    local_process_zero_first,
    local_process_zero_only,
    world_process_zero_only,
)

DATA = make_regression_dataset(32)


def test_the_names_resolve_to_pytorch_accel_objects() -> None:
    assert accelerate_notebook_launcher is notebook_launcher
    assert logger.name == "pytorch_accel"
    assert issubclass(TrainerWithTimmScheduler, Trainer)
    assert (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        LogMetricsCallback,
    ) == DEFAULT_CALLBACKS
    assert issubclass(CallbackMethodNotImplementedError, Exception)
    assert callable(set_seed)
    assert isinstance(TrainerPlaceholderValues.NUM_EPOCHS, TrainerPlaceholderValues)


# ------------------------------------------------ examples/core/custom_callback_event.py


class MNISTModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(784, 16), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.main(input.view(input.shape[0], -1))


class VerifyBatchCallback(TrainerCallback):
    def verify_train_batch(self, trainer: Trainer, xb: torch.Tensor, yb: torch.Tensor) -> None:
        self.seen = getattr(self, "seen", 0) + 1
        assert xb.shape[0] == trainer.run_config.train_per_device_batch_size
        assert xb.shape[1:] == (1, 28, 28)
        assert yb.shape[0] == trainer.run_config.train_per_device_batch_size


class TrainerWithCustomCallbackEvent(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        xb, yb = batch
        self.callback_handler.call_event("verify_train_batch", trainer=self, xb=xb, yb=yb)
        return super().calculate_train_batch_loss(batch)


def test_an_undeclared_custom_event_reaches_the_callbacks_that_define_it() -> None:
    images = torch.rand(40, 1, 28, 28)
    dataset = TensorDataset(images, torch.randint(0, 10, (40,)))
    model = MNISTModel()
    verify = VerifyBatchCallback()
    trainer = TrainerWithCustomCallbackEvent(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9),
        callbacks=(verify, TerminateOnNaNCallback, PrintProgressCallback, LogMetricsCallback),
    )
    trainer.train(
        train_dataset=dataset,
        eval_dataset=dataset,
        train_dataloader_kwargs={"drop_last": True},
        num_epochs=2,
        per_device_batch_size=8,
    )
    assert verify.seen == 10
    with pytest.raises(ValueError, match=r"unknown event 'verify_test_batch'.*No callback defines"):
        trainer.callback_handler.call_event("verify_test_batch", trainer=trainer)


# --------------------------------------------------------------------------------- utils


def test_utils_helpers() -> None:
    assert len(DataLoaderSlice(DataLoader(DATA, batch_size=4), 3)) == 3
    assert len(list(DataLoaderSlice(DataLoader(DATA, batch_size=4), 3))) == 3
    padded = torch.tensor([[1.0, 2.0], [3.0, -1.0], [-1.0, -1.0]])
    assert torch.equal(remove_padding(padded, -1), padded[:2])
    assert local_process_zero_only(lambda: 7)() == 7
    assert local_process_zero_first(lambda: 8)() == 8
    assert world_process_zero_only(lambda: 9)() == 9
    loader = DataLoader(DATA, batch_size=4, num_workers=1, worker_init_fn=worker_init_fn)
    assert len(list(loader)) == 8


def test_model_ema_averages_and_copies_integer_buffers() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    ema = ModelEma(model, decay=0.5)
    before = ema.module[0].weight.clone()
    with torch.no_grad():
        model[0].weight.add_(2.0)
    model.train()
    model(torch.randn(4, 2))
    ema.update(model)
    assert torch.allclose(ema.module[0].weight, (before + model[0].weight) / 2)
    assert int(ema.module[1].num_batches_tracked) == 1
    ema.set(model)
    assert torch.equal(ema.module[0].weight, model[0].weight)


def test_limit_batches_with_both_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    with LimitBatches(2):
        assert os.environ[LIMIT_BATCHES_ENV_VAR] == "2"
        trainer = Trainer(model := make_model(), nn.MSELoss(), torch.optim.SGD(model.parameters()))
    assert any(isinstance(cb, LimitBatchesCallback) for cb in trainer.callback_handler)
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", "3")
    with pytest.warns(DeprecationWarning, match="PT_ACC_LIMIT_BATCHES is pytorch-accelerated"):
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters()))
    assert trainer.limit_train_batches == 3


def test_loss_tracker_takes_python_floats() -> None:
    tracker = LossTracker()
    tracker.update(torch.tensor(2.0).item(), 4)
    tracker.update(4.0, 4)
    assert tracker.average == pytest.approx(3.0)


def test_run_config_built_with_that_librarys_fields() -> None:
    fields = dict(
        num_epochs=3,
        train_per_device_batch_size=8,
        train_dl_kwargs={},
        eval_per_device_batch_size=8,
        eval_dl_kwargs={},
        gradient_accumulation_steps=2,
        gradient_clip_value=None,
        train_total_batch_size=16,
        eval_total_batch_size=8,
        num_update_steps_per_epoch=5,
        num_local_update_steps_per_epoch=5,
        max_num_train_steps=None,
        is_local_process_zero=True,
        is_world_process_zero=True,
        is_distributed=False,
        mixed_precision="no",
        num_processes=1,
    )
    by_keyword = TrainerRunConfig(**fields)
    by_position = TrainerRunConfig(*fields.values())
    assert by_keyword == by_position
    assert by_keyword.total_num_update_steps == 15
    assert by_keyword.train_dataloader_len == 10
    assert by_keyword.max_grad_norm is None


# ---------------------------------------------- examples/vision/using_timm_components


class TimmStyleTrainer(Trainer):
    """The update counting of that library's timm examples (all_timm_components.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_updates = None
        self.counted: list[int] = []

    def train_epoch_start(self) -> None:
        super().train_epoch_start()
        self.num_updates = (self.run_history.current_epoch - 1) * len(self._train_dataloader)

    def scheduler_step(self) -> None:
        self.num_updates += 1
        self.counted.append(self.num_updates)


def test_num_updates_can_be_assigned_as_the_timm_examples_do() -> None:
    model = make_model()
    trainer = TimmStyleTrainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters()), ())
    with pytest.warns(DeprecationWarning, match="Assigning Trainer.num_updates"):
        trainer.train(
            DATA,
            num_epochs=2,
            per_device_batch_size=8,
            create_scheduler_fn=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1),
        )
    assert trainer.counted == list(range(1, 9))  # every update of both epochs ran
    assert trainer._train_dataloader is trainer.train_dataloader  # the private name they read
    assert trainer._eval_dataloader is None
    trainer.num_updates = None
    assert trainer.num_updates == 8  # the trainer's own count again


# ---------------------------------------------------------------------- callbacks


def test_model_ema_callback_with_that_librarys_arguments(tmp_path: Path) -> None:
    model = make_model()
    ema = ModelEmaCallback(
        decay=0.9,
        save_path=tmp_path / "ema.pt",
        watch_metric="ema_model_eval_loss_epoch",
        greater_is_better=False,
        model_ema=ModelEma,
        callbacks=(),
    )
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), (ema,))
    trainer.train(DATA, num_epochs=3, eval_dataset=DATA, per_device_batch_size=8)
    values = trainer.run_history.get_metric_values("ema_model_eval_loss_epoch")
    assert ema.best_metric == min(values)
    assert (tmp_path / "ema.pt").exists()
    with pytest.raises(TypeError, match=r"ModelEmaCallback: callbacks must be empty"):
        ModelEmaCallback(callbacks=(PrintProgressCallback(),))
    with pytest.raises(TypeError, match=r"ModelEmaCallback: model_ema must be None"):
        ModelEmaCallback(model_ema=nn.Module)


def test_terminate_on_nan_checks_a_batch_on_request() -> None:
    callback = TerminateOnNaNCallback()
    callback.check_for_nan_after_batch({"loss": torch.tensor(1.0)}, step="training")
    with pytest.raises(StopTrainingError, match="NaN loss in training step"):
        callback.check_for_nan_after_batch({"loss": torch.tensor(float("nan"))}, step="training")


# -------------------------------------------------------------------------- schedulers


def test_cosine_scheduler_names_and_state_of_that_library() -> None:
    optimizer = torch.optim.SGD(make_model().parameters(), lr=0.1)
    scheduler = CosineLrScheduler(optimizer, total_num_epochs=2, num_update_steps_per_epoch=4)
    assert (scheduler.total_iterations, scheduler.warmup_iterations) == (8, 0)
    assert (scheduler.warmup_lr_init, scheduler.lr_min_ratio) == (1e-6, None)
    assert (scheduler.warmup_lr_ratio, scheduler.num_cooldown_iterations) == (None, 0)
    scheduler.total_iterations = 10
    assert scheduler.total_num_updates == 10
    theirs = {
        "total_iterations": 8,
        "lr_min_ratio": None,
        "lr_min": 1e-06,
        "warmup_iterations": 4,
        "warmup_lr_init": 1e-06,
        "warmup_lr_ratio": None,
        "k_decay": 1.0,
        "num_cooldown_iterations": 0,
        "num_updates": 2,
    }
    scheduler.load_state_dict(scheduler_state_dict=theirs)
    assert (scheduler.total_num_updates, scheduler.num_warmup_updates) == (8, 4)
    assert scheduler.num_updates == 3  # theirs counts from -1


def test_wsd_checkpoint_steps_of_that_library(tmp_path: Path) -> None:
    model = make_model()
    callback = WSDCheckpointCallback(save_dir=tmp_path)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), (callback,)
    )
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(num_checkpoints=2),
    )
    assert callback.last_checkpoint_step == trainer.scheduler.total_steps
    pre_decay = [info["pre_decay_step"] for info in trainer.scheduler.get_decay_info()]
    assert trainer.scheduler.previous_checkpoint_step == pre_decay[-1]


# ----------------------------------------------------- a checkpoint written by that library

SAVE_WITH_PYTORCH_ACCELERATED = """
import sys, torch
from torch import nn
from torch.utils.data import TensorDataset
from pytorch_accelerated import Trainer
from pytorch_accelerated.schedulers import CosineLrScheduler

torch.manual_seed(0)
inputs = torch.randn(32, 4)
dataset = TensorDataset(inputs, inputs.sum(1, keepdim=True))
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
trainer = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
trainer.train(dataset, num_epochs=2, per_device_batch_size=8,
              create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1),
              train_dataloader_kwargs={"num_workers": 0})
trainer.save_checkpoint(sys.argv[1])
"""


def test_a_checkpoint_saved_by_pytorch_accelerated_loads(tmp_path: Path) -> None:
    pytest.importorskip("pytorch_accelerated")  # in the dev extra
    path = tmp_path / "theirs.pt"
    subprocess.run(
        [sys.executable, "-c", SAVE_WITH_PYTORCH_ACCELERATED, str(path)],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"},
    )
    saved = torch.load(path, weights_only=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    trainer.train(
        DATA,
        num_epochs=2,
        per_device_batch_size=8,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.load_checkpoint(path)
    for name, tensor in trainer.get_model().state_dict().items():
        assert torch.equal(tensor, saved["model_state_dict"][name])
    assert trainer.optimizer.state_dict()["state"][0]["step"] == 8
    assert trainer.scheduler.total_num_updates == 8
    assert trainer.scheduler.num_updates == saved["scheduler_state_dict"]["num_updates"] + 1


def test_the_epoch_loops_can_be_overridden_as_in_that_library() -> None:
    """Subclasses override ``_run_train_epoch`` and ``_run_eval_epoch`` and call ``super()``."""
    calls: list[tuple[str, Any]] = []

    class EpochTrainer(Trainer):
        def _run_train_epoch(self, train_dl: Any) -> Any:
            calls.append(("train", train_dl is self.train_dataloader))
            return super()._run_train_epoch(train_dl)

        def _run_eval_epoch(
            self, valid_dl: Any, is_training: bool = True, is_intermediate: bool = False
        ) -> None:
            calls.append(("eval", is_training))
            super()._run_eval_epoch(valid_dl, is_training, is_intermediate)

    model = make_model()
    trainer = EpochTrainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), [])
    dataset = make_regression_dataset(16)
    trainer.train(dataset, num_epochs=2, eval_dataset=dataset, per_device_batch_size=4)
    trainer.evaluate(dataset)
    assert calls == [("train", True), ("eval", True)] * 2 + [("eval", False)]
    history = trainer.run_history
    assert len(history.get_metric_values("train_loss_epoch")) == 2
    assert len(history.get_metric_values("eval_loss_epoch")) == 2
    assert len(history.get_metric_values("evaluation_loss")) == 1
