"""The Slurm recipe (examples/slurm/train.sbatch) under a real torchrun, with a real signal.

``srun`` and ``scontrol`` are the cluster's: here ``srun`` runs its command in a new session
(so the test can signal every process of the step, as Slurm does) and ``scontrol`` records
what it was asked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import wait_for_text

REPO = Path(__file__).parents[2]
RECIPE = REPO / "examples" / "slurm" / "train.sbatch"

TRAIN = """
import os, sys, time
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import TensorDataset
from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback

class Pace(TrainerCallback):
    def on_train_step_end(self, trainer, **kwargs):
        if os.environ.get("CRASH"):
            raise RuntimeError("a crash")
        Path("started").write_text("yes")
        time.sleep(0.05)

torch.manual_seed(0)
inputs = torch.randn(64, 4)
dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
model = nn.Linear(4, 1)
saver = SaveTrainingStateCallback(os.environ["SAVE_DIR"], max_checkpoints=1)
trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01),
                  callbacks=(saver, Pace()))
trainer.train(dataset, num_epochs=int(os.environ.get("EPOCHS", "200")), per_device_batch_size=4,
              resume_from="latest")
sys.stdout.flush()
os._exit(0)  # skip interpreter shutdown: torch's gloo exit abort (pytorch#190489)
"""


def stubs(directory: Path) -> Path:
    directory.mkdir()
    (directory / "srun").write_text('#!/bin/bash\necho $$ > srun.pid\nexec setsid "$@"\n')
    (directory / "scontrol").write_text('#!/bin/bash\necho "$@" >> scontrol.log\n')
    (directory / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (directory / "torchrun").write_text(
        f'#!/bin/bash\nexec {sys.executable} -m torch.distributed.run "$@"\n'
    )
    for name in ("srun", "scontrol", "python", "torchrun"):
        (directory / name).chmod(0o755)
    return directory


def start(tmp_path: Path, **extra: str) -> subprocess.Popen[str]:
    (tmp_path / "train.py").write_text(TRAIN)
    bin_dir = stubs(tmp_path / "bin")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SAVE_DIR": str(tmp_path / "states"),
        "SLURM_JOB_ID": "42",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        **extra,
    }
    return subprocess.Popen(
        ["bash", str(RECIPE)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> str:
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    return output


def test_a_preempted_job_is_requeued_although_torchrun_exits_1(tmp_path: Path) -> None:
    process = start(tmp_path)
    wait_for_text(tmp_path / "started")
    step = int(wait_for_text(tmp_path / "srun.pid"))
    os.killpg(step, signal.SIGTERM)  # Slurm signals every process of the step
    output = finish(process)
    assert process.returncode == 0, output[-3000:]
    assert "got signal: 15" in output  # torchrun itself failed on the signal...
    assert (tmp_path / "scontrol.log").read_text() == "requeue 42\n"  # ...yet the job requeues
    states = sorted(path.name for path in (tmp_path / "states").iterdir())
    assert len(states) == 1
    assert states[0].startswith("preempted-")


def test_a_crashed_job_is_not_requeued(tmp_path: Path) -> None:
    output = finish(process := start(tmp_path, CRASH="1"))
    assert process.returncode != 0, output[-3000:]
    assert not (tmp_path / "scontrol.log").exists()


def test_a_finished_job_exits_0_without_requeue(tmp_path: Path) -> None:
    output = finish(process := start(tmp_path, EPOCHS="1"))
    assert process.returncode == 0, output[-3000:]
    assert not (tmp_path / "scontrol.log").exists()
