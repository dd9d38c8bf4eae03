"""Training states resumed on another number of processes, with shuffled and unshuffled data.

``python elastic.py OUT_DIR SCENARIO [STATES...]``; the scenarios:

- ``save``: 2 processes (DDP, FSDP2 with full states, FSDP2 with DCP's sharded states) x batch
  4, shuffled and not, save a state after epoch 1; a DDP run with ``SaveTrainingStateCallback``
  leaves an epoch-end state and a newer mid-epoch one in one directory; FSDP1 with
  ``SaveTrainingStateCallback`` is refused before it trains.
- ``grow``: 2 processes (DDP and FSDP2) x batch 4 resume each state of 1 process given (its
  name says whether it is shuffled): the parameters, and the samples each process trained on.
"""

from __future__ import annotations

import os
import shutil
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

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback

LAYOUTS = {
    "ddp": None,
    "fsdp": {"fsdp_version": 2},
    "dcp": {"fsdp_version": 2, "state_dict_type": "SHARDED_STATE_DICT"},
}


class SeenSamples(Trainer):
    """A trainer that records the first input of every sample each epoch trains on."""

    seen: dict[int, list[float]]

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        epoch = self.run_history.current_epoch
        self.seen.setdefault(epoch, []).extend(batch[0][:, 0].tolist())
        return super().calculate_train_batch_loss(batch)


def reset_state() -> None:
    """Let a new accelerator choose its run type again (the process group stays)."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if PartialState._shared_state:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU


def trainer_for(layout: str, *callbacks: TrainerCallback) -> SeenSamples:
    reset_state()
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    plugin = LAYOUTS[layout]
    kwargs = {} if plugin is None else {"fsdp_plugin": FullyShardedDataParallelPlugin(**plugin)}
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    trainer = SeenSamples(model, nn.MSELoss(), optimizer, callbacks, accelerator_kwargs=kwargs)
    trainer.seen = {}
    return trainer


def parameters(trainer: Trainer) -> list[float]:
    state = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True))
    return torch.cat([state[key].detach().flatten() for key in sorted(state)]).tolist()


def save() -> dict[str, Any]:
    out = Path(sys.argv[1])
    dataset = make_regression_dataset(24)
    saved = {}
    for layout in LAYOUTS:
        for shuffle in (True, False):
            torch.manual_seed(0)
            trainer = trainer_for(layout)
            trainer.train(
                dataset,
                num_epochs=1,
                per_device_batch_size=4,
                train_dataloader_kwargs={"shuffle": shuffle},
            )
            name = f"{layout}_{'shuffled' if shuffle else 'unshuffled'}"
            trainer.save_training_state(out / name)
            saved[name] = str(out / name)
    torch.manual_seed(0)
    states = SaveTrainingStateCallback(
        out / "states", save_every_n_epochs=1, save_every_n_steps=1, save_at_end=False
    )
    trainer_for("ddp", states).train(
        dataset, num_epochs=2, per_device_batch_size=4, max_num_train_steps=4
    )
    if int(os.environ["RANK"]) == 0:  # (the run's last save): the newest is mid-epoch
        shutil.rmtree(out / "states" / "epoch-0002")
    fsdp1 = fsdp1_trainer(out)
    try:
        fsdp1.train(dataset, num_epochs=1, per_device_batch_size=4)
        refusal = ""
    except RuntimeError as error:
        refusal = str(error)
    return {
        "saved": saved,
        "states": str(out / "states"),
        "fsdp1_refusal": refusal,
        "fsdp1_batches": sum(len(seen) for seen in fsdp1.seen.values()),
    }


def fsdp1_trainer(out: Path) -> SeenSamples:
    """An FSDP1 trainer saving training states."""
    reset_state()
    model = make_model()
    trainer = SeenSamples(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=0.01),
        (SaveTrainingStateCallback(out / "fsdp1"),),
        accelerator_kwargs={
            "fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=1, use_orig_params=True)
        },
    )
    trainer.seen = {}
    return trainer


def grow() -> dict[str, Any]:
    dataset = make_regression_dataset(24)
    resumed = {}
    for state in sys.argv[3:]:
        for layout in ("ddp", "fsdp"):
            trainer = trainer_for(layout)
            trainer.train(
                dataset,
                num_epochs=2,
                per_device_batch_size=4,
                train_dataloader_kwargs={"shuffle": "unshuffled" not in Path(state).name},
                resume_from=state,
            )
            resumed[f"{Path(state).name}/{layout}"] = {
                "parameters": parameters(trainer),
                "seen": trainer.seen,
            }
    return resumed


if __name__ == "__main__":
    scenario = sys.argv[2]
    report_and_exit({scenario: {"save": save, "grow": grow}[scenario]()})
