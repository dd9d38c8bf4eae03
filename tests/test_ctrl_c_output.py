"""What a terminal shows after Ctrl-C with the state saved: the saved line, then a bare interrupt.

A real process, sent SIGINT from outside as a terminal's Ctrl-C is (issue 41: a 45-line
chained traceback through the loop followed the clean line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import wait_for_text

REPO_ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import torch
from torch import nn
from helpers import make_model, make_regression_dataset
from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, SaveTrainingStateCallback, TrainerCallback


class Slow(TrainerCallback):
    def on_train_step_end(self, trainer, **kwargs):
        if trainer.global_num_updates == 3:
            open("started", "w").write("yes")
        time.sleep(0.02)


model = make_model()
saver = SaveTrainingStateCallback("training_states", save_on_interrupt=True)
trainer = Trainer(
    model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05),
    callbacks=(*DEFAULT_CALLBACKS, saver, Slow()),
)
trainer.train(make_regression_dataset(64), num_epochs=1000, per_device_batch_size=8)
"""


def test_ctrl_c_after_the_saved_state_shows_no_chained_traceback(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.format(tests=str(REPO_ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "train.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_text(tmp_path / "started", timeout=120)
        process.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()

    assert process.returncode in (-signal.SIGINT, 130), (process.returncode, stderr)
    assert "Interrupted (Ctrl-C): the training state was saved to 'training_states/" in stdout
    assert "resume with train(..., resume_from='latest')" in stdout
    lines = stderr.strip().splitlines()
    assert lines[-1] == "KeyboardInterrupt", stderr
    for noise in ("StopTrainingError", "During handling", "direct cause", "_loop.py"):
        assert noise not in stderr, stderr
    # the user's own call and the entry point, as for any exception out of a script
    assert len(lines) <= 8, stderr
    assert list((tmp_path / "training_states").glob("interrupted-*"))
