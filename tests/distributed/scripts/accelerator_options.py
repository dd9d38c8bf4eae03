"""accelerate's options through Trainer(accelerator_kwargs=...), in several processes."""

from __future__ import annotations

import datetime

import torch
from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer


def main() -> None:
    model = make_model()
    handlers = [
        InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=77)),
        DistributedDataParallelKwargs(find_unused_parameters=True),
    ]
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        (),
        accelerator_kwargs={"kwargs_handlers": handlers},
    )
    trainer.train(make_regression_dataset(32), num_epochs=1, per_device_batch_size=4)
    group = torch.distributed.distributed_c10d._get_default_group()
    timeout = group._get_backend(torch.device("cpu")).options._timeout
    report_and_exit(
        {
            "processes": trainer.accelerator.num_processes,
            "timeout_s": timeout.total_seconds(),
            "find_unused_parameters": trainer.model.find_unused_parameters,
        }
    )


if __name__ == "__main__":
    main()
