"""The save and load events in several processes: fired on every one, a file per rank.

``python checkpoint_events.py OUT_DIR``: training states saved blocking and in the background
hold each process's ``card_rank<N>.txt``, written in ``on_save_training_state`` and listed in
the manifest; loading fires ``on_load_training_state`` on every process; ``save_checkpoint``
and ``load_checkpoint`` fire their events on every process; a callback that raises on one
process abandons the save on every one (no hang); a changed rank file is refused on resume.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.training_state import MANIFEST_NAME, find_training_states


class PerRankCard(TrainerCallback):
    """Writes one file per process into every training state; records every save/load event."""

    def __init__(self, fail_on_rank: int | None = None) -> None:
        self.events: list[list[Any]] = []
        self.fail_on_rank = fail_on_rank

    def on_save_training_state(
        self, trainer: Any, directory: Path, output_dir: Path, **kwargs: Any
    ) -> None:
        rank = trainer.accelerator.process_index
        if rank == self.fail_on_rank:
            raise RuntimeError(f"no card on rank {rank}")
        (directory / f"card_rank{rank}.txt").write_text(f"{rank} {trainer.global_num_updates}")
        self.events.append(["save_state", output_dir.name])

    def on_load_training_state(self, trainer: Any, directory: Path, **kwargs: Any) -> None:
        rank = trainer.accelerator.process_index
        self.events.append(["load_state", (directory / f"card_rank{rank}.txt").read_text()])

    def on_save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        checkpoint["saved_by"] = trainer.accelerator.process_index
        self.events.append(["save_checkpoint", sorted(checkpoint)])

    def on_load_checkpoint(self, trainer: Any, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        self.events.append(["load_checkpoint", checkpoint["saved_by"]])


def trainer_with(*callbacks: Any) -> Trainer:
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks)


def states(save_dir: Path) -> dict[str, list[str]]:
    """Each state's name and the card files its manifest lists."""
    return {
        state.name: sorted(
            name
            for name in json.loads((state / MANIFEST_NAME).read_text())["files"]
            if name.startswith("card_")
        )
        for state in find_training_states(save_dir)
    }


def main() -> None:
    root = Path(sys.argv[1])
    data = make_regression_dataset(32)  # 2 processes x 4 per batch: 4 steps per epoch
    results: dict[str, Any] = {}
    for mode in ("blocking", "background"):
        card = PerRankCard()
        saver = SaveTrainingStateCallback(
            root / mode, save_every_n_steps=2, save_at_end=False, async_save=mode == "background"
        )
        trainer = trainer_with(saver, card)
        trainer.train(data, num_epochs=1, per_device_batch_size=4)
        trainer.accelerator.wait_for_everyone()
        results[mode] = {"states": states(root / mode), "events": list(card.events)}

    card = PerRankCard()
    trainer = trainer_with(card)
    state = find_training_states(root / "blocking")[0]
    trainer.load_training_state(state)
    trainer.save_checkpoint(root / "model.pt")
    trainer.load_checkpoint(root / "model.pt")
    results["load_and_checkpoint"] = card.events
    results["saved_by"] = torch.load(root / "model.pt", weights_only=True)["saved_by"]

    failing = trainer_with(PerRankCard(fail_on_rank=1))
    try:
        failing.save_training_state(root / "failed")
        results["failed"] = "saved"
    except Exception as error:  # every process raises: the save is abandoned everywhere
        results["failed"] = f"{type(error).__name__}: {error}"
    failing.accelerator.wait_for_everyone()
    results["failed_left"] = sorted(path.name for path in root.iterdir() if "failed" in path.name)

    if trainer.accelerator.is_main_process:  # changed after the save: refused on resume
        (state / "card_rank1.txt").write_text("1 changed")
    trainer.accelerator.wait_for_everyone()
    try:
        trainer_with(PerRankCard()).train(
            data, num_epochs=2, per_device_batch_size=4, resume_from=state
        )
        results["tampered"] = "resumed"
    except Exception as error:
        results["tampered"] = f"{type(error).__name__}: {error}"
    report_and_exit(results)


if __name__ == "__main__":
    main()
