"""The package's logger in plain scripts: shown by default, silenced or redirected by logging."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import logging, sys, torch
sys.path.insert(0, {tests!r})
from helpers import make_regression_dataset, make_trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS
{setup}
trainer = make_trainer(callbacks=DEFAULT_CALLBACKS)
trainer.train(make_regression_dataset(16), num_epochs=2, per_device_batch_size=8)
"""


def run_script(setup: str, script: str = SCRIPT, **fields: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = script.format(tests=str(REPO / "tests"), setup=setup, **fields)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )


def epoch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "epoch " in line and "train_loss" in line]


def test_a_plain_script_shows_one_line_per_epoch_on_stdout() -> None:
    result = run_script("")
    lines = epoch_lines(result.stdout)
    assert [line.split("  ")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"]
    assert result.stderr == ""  # piped: no progress bar


@pytest.mark.parametrize(
    ("setup", "where"),
    [
        ('logging.getLogger("pytorch_accel").setLevel(logging.WARNING)', None),
        ('logging.basicConfig(format="LOG %(name)s %(message)s", level=logging.INFO)', "stderr"),
        (
            'logging.getLogger("pytorch_accel").addHandler(logging.StreamHandler(sys.stderr))',
            "stderr",
        ),
    ],
)
def test_logging_configured_by_the_user_decides(setup: str, where: str | None) -> None:
    result = run_script(setup)
    assert epoch_lines(result.stdout) == []  # no handler of ours next to the user's
    shown = epoch_lines(result.stderr)
    assert len(shown) == (0 if where is None else 2)  # each line once, no duplicate


def test_importing_the_package_configures_nothing() -> None:
    code = (
        "import logging, pytorch_accel, pytorch_accel.callbacks;"
        "logger = logging.getLogger('pytorch_accel');"
        "print(len(logger.handlers), len(logger.filters), logger.level)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.split() == ["0", "0", "0"]


RESUME_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from helpers import make_regression_dataset, make_trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, SaveTrainingStateCallback
states = SaveTrainingStateCallback({states!r}, save_every_n_epochs=1)
trainer = make_trainer(callbacks=(*DEFAULT_CALLBACKS, states))
data = make_regression_dataset(16)
trainer.train(data, num_epochs={epochs}, per_device_batch_size=8, resume_from="latest")
"""


def test_the_resume_messages_show_in_a_plain_script(tmp_path: Path) -> None:
    def run(epochs: int) -> str:
        return run_script("", RESUME_SCRIPT, states=str(tmp_path), epochs=str(epochs)).stdout

    # each line is said before the run starts, in a fresh process: before, none showed
    assert "starting afresh" in run(1)
    assert "Resuming from" in run(2)
    assert "nothing is left to train" in run(2)
