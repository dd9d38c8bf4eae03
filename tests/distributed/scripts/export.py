"""Trainer.save_model in several processes: the main process writes, every process agrees."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from common import report_and_exit
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer


def main() -> None:
    root = Path(sys.argv[1])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.train(data, num_epochs=1, per_device_batch_size=4)
    results: dict[str, Any] = {}
    written = trainer.save_model(root / "export")
    saved = load_file(written / "model.safetensors")
    bare = trainer.get_model().state_dict()
    results["files"] = sorted(path.name for path in written.iterdir())
    results["equal"] = all(torch.equal(saved[name], bare[name]) for name in bare)
    try:  # refused on every process, with no hang: the main process decides
        trainer.save_model(root / "export")
    except (FileExistsError, RuntimeError) as error:
        results["refused"] = [
            type(error).__name__,
            "overwrite=True" in str(error) or "main" in str(error),
        ]
    trainer.save_model(root / "export", overwrite=True)
    results["after_overwrite"] = sorted(path.name for path in (root / "export").iterdir())
    report_and_exit(results)


if __name__ == "__main__":
    main()
