"""A plain ``train()`` runs nothing of the training-state code (issue 40).

Saving and resuming are imported when a state is first saved or loaded; every run only
prepares its train dataloader so that one could be (``_resumable``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys
import torch
from torch import nn
from torch.utils.data import TensorDataset
from pytorch_accel import Trainer

root = os.path.join(os.path.dirname(sys.modules["pytorch_accel"].__file__), "_checkpointing")
ran = set()

def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(root):
        ran.add(os.path.basename(frame.f_code.co_filename))

data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = nn.Linear(4, 1)
sys.setprofile(profile)
trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05))
trainer.train(data, num_epochs=2, eval_dataset=data, per_device_batch_size=8)
sys.setprofile(None)
imported = sorted(
    name.rsplit(".", 1)[1]
    for name in sys.modules
    if name.startswith("pytorch_accel._checkpointing.")
)
print(sorted(ran), imported)
"""


def test_a_plain_train_runs_and_imports_none_of_the_saving_and_resuming_code() -> None:
    repo = Path(__file__).parents[1]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        cwd=repo,
        env={"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    ran, imported = done.stdout.strip().splitlines()[-1].split("] [")
    assert ran == "["  # no function of _checkpointing ran
    for module in ("training_state", "staging", "resume", "streams", "checkpoint"):
        assert f"'{module}'" not in imported
