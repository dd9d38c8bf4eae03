"""FSDP in a gloo process group: asked for, really sharded, trained like DDP, refused early.

``python fsdp.py OUT_DIR SCENARIO``; the scenarios:

- ``parity``: the same run under 2-process DDP and under FSDP2 (through
  ``Trainer(accelerator_kwargs={"fsdp_plugin": ...})``), with accumulation (a short last
  window) and clipping by norm; then ``evaluate`` and ``predict`` under both; and
  ``gradient_clip_value`` refused at ``train()``.
- ``checkpoints``: ``save_checkpoint`` with the optimizer gathers full states (the file equals
  a DDP run's), ``load_checkpoint`` puts them back into a sharded model (saving again gives the
  same file), and a training state of another model is refused by the fit check; a DDP
  training state for the test to resume in 1 process.
- ``callbacks``: ``SaveBestModelCallback`` and ``ModelEmaCallback`` in the same run under
  DDP and under FSDP2: the files they write (gathered weights) and the EMA's metrics.
- ``grow``: a DDP run (an FSDP2 run if the last argument is ``fsdp``) resumes the training
  state of 1 process given as the next argument.
- ``reshard``: FSDP2 runs resume the FSDP2 states of 2 processes given as the next arguments.
- ``env``: FSDP asked for by ``accelerate launch --use_fsdp``'s variables: FSDP1 without the
  original parameters is refused at the constructor, FSDP2 shards.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import DistributedType
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ModelEmaCallback, SaveBestModelCallback, TrainerCallback

UNSHUFFLED = {"shuffle": False}


def reset_state() -> None:
    """Let a new accelerator choose its run type again (the process group stays)."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if PartialState._shared_state:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU


def fresh_trainer(**accelerator_kwargs: Any) -> Trainer:
    """A new trainer with a new accelerator state in this process (the process group stays)."""
    reset_state()
    os.environ.pop("ACCELERATE_USE_FSDP", None)  # accelerate sets it when given a plugin
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, nn.MSELoss(), optimizer, (), accelerator_kwargs=accelerator_kwargs)


def full_parameters(trainer: Trainer) -> torch.Tensor:
    """The model's parameters, gathered where sharded, flattened into one tensor."""
    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(trainer.model, options=options)
    return torch.cat([state[key].detach().flatten() for key in sorted(state)])


def sharding(trainer: Trainer) -> dict[str, Any]:
    return {
        "type": str(trainer.accelerator.distributed_type),
        "dtensors": all(isinstance(p, DTensor) for p in trainer.model.parameters()),
    }


def run(trainer: Trainer) -> dict[str, Any]:
    """Train with accumulation (windows of 3, 2) and clipping, then evaluate and predict."""
    dataset = make_regression_dataset(40)
    trainer.train(
        dataset,
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        max_grad_norm=0.5,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    sharded = sharding(trainer)
    evaluation = trainer.evaluate(make_regression_dataset(12, seed=1), per_device_batch_size=4)
    predictions = trainer.predict(make_regression_dataset(14, seed=2), per_device_batch_size=4)
    return {
        "parameters": full_parameters(trainer),
        "loss": evaluation["evaluation_loss"],
        "predictions": predictions,
        **sharded,
    }


def parity() -> dict[str, Any]:
    ddp = run(fresh_trainer())
    trainer = fresh_trainer(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    fsdp = run(trainer)
    try:
        trainer.train(make_regression_dataset(8), num_epochs=1, gradient_clip_value=1.0)
        clip_value_refusal = ""
    except ValueError as error:
        clip_value_refusal = str(error)
    fsdp1 = run(
        fresh_trainer(
            fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1, use_orig_params=True)
        )
    )
    return {
        "fsdp1_type": fsdp1["type"],
        "fsdp1_parameters": (fsdp1["parameters"] - ddp["parameters"]).abs().max().item(),
        "fsdp1_loss": abs(fsdp1["loss"] - ddp["loss"]),
        "fsdp1_predictions": (fsdp1["predictions"] - ddp["predictions"]).abs().max().item(),
        "ddp_type": ddp["type"],
        "fsdp_type": fsdp["type"],
        "dtensors": fsdp["dtensors"],
        "parameters": (fsdp["parameters"] - ddp["parameters"]).abs().max().item(),
        "moved": (fsdp["parameters"] - full_parameters(fresh_trainer())).abs().max().item(),
        "loss": abs(fsdp["loss"] - ddp["loss"]),
        "predictions": (fsdp["predictions"] - ddp["predictions"]).abs().max().item(),
        "num_predictions": len(fsdp["predictions"]),
        "clip_value_refusal": clip_value_refusal,
    }


def adam_trainer(**accelerator_kwargs: Any) -> Trainer:
    """``fresh_trainer`` with AdamW, whose state has a tensor per parameter."""
    trainer = fresh_trainer(**accelerator_kwargs)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=0.01)
    return trainer


def tensors_of(path: Path) -> list[torch.Tensor]:
    """Every tensor of a checkpoint file, in order."""
    checkpoint = torch.load(path, weights_only=True)
    found: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(checkpoint)
    return found


def files_differ(first: Path, second: Path) -> float:
    pairs = zip(tensors_of(first), tensors_of(second), strict=True)
    return max((a.double() - b.double()).abs().max().item() for a, b in pairs)


def checkpoints() -> dict[str, Any]:
    out = Path(sys.argv[1])
    dataset = make_regression_dataset(24)
    options = {"num_epochs": 1, "per_device_batch_size": 4, "train_dataloader_kwargs": UNSHUFFLED}
    ddp = adam_trainer()
    ddp.train(dataset, **options)
    ddp.save_checkpoint(out / "ddp.pt")
    ddp.save_training_state(out / "elastic")  # resumed in 1 process by the test
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    trainer = adam_trainer(fsdp_plugin=plugin)
    trainer.train(dataset, **options)
    trainer.save_checkpoint(out / "fsdp.pt")
    trainer.save_training_state(out / "state")  # resumed in 1 process by the test, too
    dcp_plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, state_dict_type="SHARDED_STATE_DICT"
    )
    sharded_save = adam_trainer(fsdp_plugin=dcp_plugin)
    sharded_save.train(dataset, **options)
    sharded_save.save_training_state(out / "dcp_state")  # torch.distributed.checkpoint's
    restored = adam_trainer(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    restored.train(make_regression_dataset(8, seed=3), num_epochs=1, per_device_batch_size=4)
    restored.load_checkpoint(out / "fsdp.pt")
    restored.save_checkpoint(out / "again.pt")
    reset_state()
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    other = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters()),
        (),
        accelerator_kwargs={"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)},
    )
    try:
        other.load_training_state(out / "state")
        misfit = ""
    except Exception as error:
        misfit = f"{type(error).__name__}: {error}"
    main = trainer.accelerator.is_main_process
    return {
        "sharded": [sharding(run)["type"] for run in (trainer, restored, other)],
        "elastic_state": str(out / "elastic"),
        "fsdp_state": str(out / "state"),
        "fsdp_dcp_state": str(out / "dcp_state"),
        "dcp_files": sorted(path.name for path in (out / "dcp_state").iterdir()),
        **fsdp1_checkpoints(out),
        **resumes(out),
        **mid_window_saves(out),
        "saved_like_ddp": files_differ(out / "ddp.pt", out / "fsdp.pt") if main else 0.0,
        "round_trip": files_differ(out / "fsdp.pt", out / "again.pt") if main else 0.0,
        "optimizer_keys": sorted(torch.load(out / "fsdp.pt")["optimizer_state_dict"]["state"]),
        "misfit": misfit,
    }


def fsdp1_plugin() -> FullyShardedDataParallelPlugin:
    return FullyShardedDataParallelPlugin(fsdp_version=1, use_orig_params=True)


def fsdp1_checkpoints(out: Path) -> dict[str, Any]:
    """save_checkpoint and load_checkpoint under FSDP1: the same file as FSDP2's and DDP's."""
    options = {"num_epochs": 1, "per_device_batch_size": 4, "train_dataloader_kwargs": UNSHUFFLED}
    trainer = adam_trainer(fsdp_plugin=fsdp1_plugin())
    trainer.train(make_regression_dataset(24), **options)
    trainer.save_checkpoint(out / "fsdp1.pt")
    restored = adam_trainer(fsdp_plugin=fsdp1_plugin())
    restored.train(make_regression_dataset(8, seed=3), num_epochs=1, per_device_batch_size=4)
    restored.load_checkpoint(out / "fsdp1.pt")
    restored.save_checkpoint(out / "fsdp1_again.pt")
    main = trainer.accelerator.is_main_process
    return {
        "fsdp1_saved_like_ddp": files_differ(out / "ddp.pt", out / "fsdp1.pt") if main else 0.0,
        "fsdp1_round_trip": files_differ(out / "fsdp1.pt", out / "fsdp1_again.pt") if main else 0.0,
    }


def ema_trainer(ema: ModelEmaCallback) -> Trainer:
    """An FSDP2 ``adam_trainer`` with ``ema``."""
    trainer = adam_trainer(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    trainer.callback_handler.add_callback(ema)
    return trainer


def resumes(out: Path) -> dict[str, Any]:
    """FSDP2: a run resumed after epoch 1 ends bitwise where the whole run ends; FSDP1 refuses."""
    options = {"per_device_batch_size": 4, "gradient_accumulation_steps": 2, "max_grad_norm": 1.0}
    dataset = make_regression_dataset(40)
    emas = [ModelEmaCallback(decay=0.8, save_path=None) for _ in range(3)]  # of the shards
    whole = ema_trainer(emas[0])
    whole.train(dataset, num_epochs=2, **options)
    expected = full_parameters(whole)
    first = ema_trainer(emas[1])
    first.train(dataset, num_epochs=1, **options)
    first.save_training_state(out / "resume")
    resumed = ema_trainer(emas[2])
    resumed.train(dataset, num_epochs=2, resume_from=out / "resume", **options)
    averages = [ema.state_dict()["ema_state_dict"] for ema in (emas[0], emas[2])]
    fsdp1 = adam_trainer(fsdp_plugin=fsdp1_plugin())
    try:
        fsdp1.save_training_state(out / "fsdp1_state")
        fsdp1_refusal = ""
    except RuntimeError as error:
        fsdp1_refusal = str(error)
    return {
        "resumed": (full_parameters(resumed) - expected).abs().max().item(),
        "ema_resumed": max(  # (a process's shard may be empty)
            (averages[0][k] - averages[1][k]).abs().sum().item() for k in averages[0]
        ),
        "fsdp1_state_refusal": fsdp1_refusal,
    }


class SaveEveryStep(TrainerCallback):
    """Saves a training state after steps 2 (an update) and 3 (inside a window)."""

    def __init__(self, out: Path) -> None:
        self.out, self.steps, self.saved = out, 0, 0

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.steps += 1
        if self.steps >= 2:  # after the first update (2 batches), then inside the next window
            trainer.save_training_state(self.out / f"step{self.steps}")
            self.saved += 1


def mid_window_saves(out: Path) -> dict[str, Any]:
    """A save after an update works; one inside an accumulation window is refused."""
    trainer = adam_trainer(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    saver = SaveEveryStep(out)
    trainer.callback_handler.add_callback(saver)
    try:
        trainer.train(
            make_regression_dataset(40),
            num_epochs=1,
            per_device_batch_size=4,
            gradient_accumulation_steps=2,
        )
        refusal = ""
    except RuntimeError as error:
        refusal = str(error)
    return {"saves_before_refusal": saver.saved, "mid_window_refusal": refusal}


def callback_run(out: Path, **accelerator_kwargs: Any) -> Trainer:
    """3 epochs with the best (here: the worst evaluation loss, epoch 1) and the EMA saved."""
    trainer = adam_trainer(**accelerator_kwargs)
    best = SaveBestModelCallback(out / "best.pt", "eval_loss_epoch", greater_is_better=True)
    ema = ModelEmaCallback(decay=0.8, save_path=out / "ema.pt")
    for callback in (best, ema):
        trainer.callback_handler.add_callback(callback)
    trainer.train(
        make_regression_dataset(24),
        num_epochs=3,
        eval_dataset=make_regression_dataset(12, seed=1),
        per_device_batch_size=4,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    return trainer


def state_of(path: Path) -> torch.Tensor:
    """The model weights of a checkpoint file, loaded into a plain model, flattened by key."""
    model = make_model()
    model.load_state_dict(torch.load(path, weights_only=True)["model_state_dict"])
    state = model.state_dict()
    return torch.cat([state[key].detach().flatten() for key in sorted(state)])


def callbacks() -> dict[str, Any]:
    out = Path(sys.argv[1])
    ddp = callback_run(out / "ddp")
    fsdp = callback_run(out / "fsdp", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    sharded = sharding(fsdp)  # before a forward, after which FSDP2 keeps the root gathered
    best, ema = out / "fsdp" / "best.pt", out / "fsdp" / "ema.pt"
    fsdp.save_training_state(out / "ema_state")  # its EMA: each process's shards
    ends_with_best = (full_parameters(fsdp) - state_of(best)).abs().max().item()
    predicted = [predictions(trainer) for trainer in (fsdp, ddp)]  # with the best weights
    fsdp.load_checkpoint(ema)  # into the sharded model
    ddp.load_checkpoint(out / "ddp" / "ema.pt")
    predicted += [predictions(trainer) for trainer in (fsdp, ddp)]
    metric = "ema_model_eval_loss_epoch"
    ema_losses = [
        fsdp.run_history.get_metric_values(metric),
        ddp.run_history.get_metric_values(metric),
    ]
    fsdp1 = fresh_trainer(fsdp_plugin=fsdp1_plugin())
    fsdp1.callback_handler.add_callback(ModelEmaCallback(save_path=None))
    try:
        fsdp1.train(make_regression_dataset(8), num_epochs=1, per_device_batch_size=4)
        ema_fsdp1_refusal = ""
    except ValueError as error:
        ema_fsdp1_refusal = str(error)
    main = fsdp.accelerator.is_main_process
    return {
        "sharded": sharded,
        "ema_fsdp1_refusal": ema_fsdp1_refusal,
        "ema_state": str(out / "ema_state"),
        "files": sorted(path.name for path in (out / "fsdp").iterdir()),
        "best_epoch": torch.load(best, weights_only=True)["epoch"],
        "best_like_ddp": files_differ(out / "ddp" / "best.pt", best) if main else 0.0,
        "ends_with_best": ends_with_best,
        "ema_like_ddp": files_differ(out / "ddp" / "ema.pt", ema) if main else 0.0,
        "ema_is_not_the_best": (state_of(ema) - state_of(best)).abs().max().item(),
        "ema_loaded": (full_parameters(fsdp) - state_of(ema)).abs().max().item(),
        "ema_losses": max(abs(a - b) for a, b in zip(*ema_losses, strict=True)),
        "num_ema_losses": len(ema_losses[0]),
        "predictions_with_best": (predicted[0] - predicted[1]).abs().max().item(),
        "predictions_with_ema": (predicted[2] - predicted[3]).abs().max().item(),
        "ema_predicts_otherwise": (predicted[0] - predicted[2]).abs().max().item(),
    }


def predictions(trainer: Trainer) -> torch.Tensor:
    return trainer.predict(make_regression_dataset(6, seed=2), per_device_batch_size=4)


def grow() -> dict[str, Any]:
    """Resume a state saved by 1 process after epoch 1 (argv[3]) in these processes.

    Sharded by FSDP2 if argv[4] is ``fsdp``.
    """
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    trainer = adam_trainer(**({"fsdp_plugin": plugin} if sys.argv[4:] == ["fsdp"] else {}))
    with torch.no_grad():  # the saved weights replace these
        for parameter in trainer.model.parameters():
            parameter.add_(1.0)
    trainer.train(
        make_regression_dataset(24),
        num_epochs=2,
        per_device_batch_size=4,
        train_dataloader_kwargs=UNSHUFFLED,
        resume_from=sys.argv[3],
    )
    return {"parameters": full_parameters(trainer).tolist(), **sharding(trainer)}


def reshard() -> dict[str, Any]:
    """Resume each FSDP2 state of 2 processes given (argv[3:]) under FSDP2 in these processes.

    With batch 2 per process in 4 processes (the 2 processes had batch 4).
    """
    resumed = {}
    for state in sys.argv[3:]:
        trainer = adam_trainer(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        trainer.train(
            make_regression_dataset(24),
            num_epochs=2,
            per_device_batch_size=2,
            train_dataloader_kwargs=UNSHUFFLED,
            resume_from=state,
        )
        resumed[state] = {"parameters": full_parameters(trainer).tolist(), **sharding(trainer)}
    return resumed


def env() -> dict[str, Any]:
    os.environ.update({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"})
    os.environ.pop("FSDP_USE_ORIG_PARAMS", None)
    try:
        fresh_trainer_from_env()
        fsdp1_refusal = ""
    except ValueError as error:
        fsdp1_refusal = str(error)
    os.environ["FSDP_VERSION"] = "2"
    trainer = fresh_trainer_from_env()
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    return {"fsdp1_refusal": fsdp1_refusal, **sharding(trainer)}


def fresh_trainer_from_env() -> Trainer:
    """``fresh_trainer`` with FSDP asked for by the environment only (no plugin)."""
    requested = os.environ["ACCELERATE_USE_FSDP"]
    reset_state()
    os.environ["ACCELERATE_USE_FSDP"] = requested
    model = make_model()
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), ())


if __name__ == "__main__":
    scenario = sys.argv[2]
    scenarios = {
        "parity": parity,
        "checkpoints": checkpoints,
        "callbacks": callbacks,
        "grow": grow,
        "reshard": reshard,
        "env": env,
    }
    report_and_exit({scenario: scenarios[scenario]()})
