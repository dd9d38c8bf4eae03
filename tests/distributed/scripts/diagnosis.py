"""The profiler writes one trace per process; a NaN's origin is reported where it started."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState, GradientState
from common import report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ProfilerCallback, TerminateOnNaNCallback

RANK = int(os.environ["RANK"])


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class GatedModel(nn.Module):
    """``gate`` takes the log of feature 3: NaN on rank 1's third batch (see ``main``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
        self.norm = nn.BatchNorm1d(8)  # a buffer DDP broadcasts in its forward pass
        self.gate = Log()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(x)) * self.gate(x[:, 3:]))


def fresh_state() -> None:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()


def profile(out_dir: Path) -> dict[str, Any]:
    fresh_state()
    model = make_model()
    profiler = ProfilerCallback(out_dir / "profiles", wait=1, warmup=1, active=2)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(profiler,)
    )
    trainer.train(make_regression_dataset(64), num_epochs=1, per_device_batch_size=4)
    steps = []
    for path in profiler.trace_files:
        names = {event.get("name", "") for event in json.loads(path.read_text())["traceEvents"]}
        steps.append(sorted(int(n[13:]) for n in names if re.fullmatch(r"ProfilerStep#\d+", n)))
    return {"files": [path.name for path in profiler.trace_files], "steps": steps}


def nan_origin() -> dict[str, Any]:
    fresh_state()
    generator = torch.Generator().manual_seed(0)
    inputs = torch.rand(64, 4, generator=generator) + 0.5
    # 2 processes, 4 per batch, not shuffled: rank 1's third batch holds sample 21
    inputs[21, 3] = -1.0
    dataset = torch.utils.data.TensorDataset(inputs, torch.randn(64, 1, generator=generator))
    model = GatedModel()
    callback = TerminateOnNaNCallback(report_origin=True)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(callback,)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(
            dataset,
            num_epochs=1,
            per_device_batch_size=4,
            train_dataloader_kwargs={"shuffle": False},
        )
    said = [str(w.message) for w in caught if "TerminateOnNaNCallback" in str(w.message)]
    return {"origin": callback.origin, "warnings": said, "stopped_by": str(trainer.stopped_by)}


def main() -> None:
    out_dir = Path(os.sys.argv[1])
    report_and_exit({"profile": profile(out_dir), "nan": nan_origin()})


if __name__ == "__main__":
    main()
