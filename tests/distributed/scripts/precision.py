"""bf16 through accelerate on CPU: close to the fp32 reference, in 2 processes."""

from __future__ import annotations

import torch
from common import max_difference, report_and_exit
from helpers import hand_written_loop, make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer


def main() -> None:
    dataset = make_regression_dataset(64)
    reference = hand_written_loop(make_model(), dataset, batch_size=8, num_epochs=2)
    model = make_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=()
    )
    trainer.train(
        dataset, num_epochs=2, per_device_batch_size=4, train_dataloader_kwargs={"shuffle": False}
    )
    report_and_exit(
        {
            "mixed_precision": trainer.accelerator.mixed_precision,
            "max_difference": max_difference(trainer.get_model(), reference),
            "loss": trainer.run_history.get_latest_metric("train_loss_epoch"),
        }
    )


if __name__ == "__main__":
    main()
