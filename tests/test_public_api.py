"""The import paths users of pytorch-accelerated rely on."""

from __future__ import annotations

import subprocess
import sys

import pytorch_accel


def test_public_import_paths() -> None:
    from pytorch_accel import (
        Trainer,
        TrainerPlaceholderValues,
        __version__,
        notebook_launcher,
        set_seed,
    )
    from pytorch_accel.callbacks import (
        CallbackHandler,
        LogMetricsCallback,
        MoveModulesToDeviceCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        StopTrainingError,
        TerminateOnNaNCallback,
        TrainerCallback,
        get_default_callbacks,
    )
    from pytorch_accel.run_config import TrainerRunConfig
    from pytorch_accel.tracking import InMemoryRunHistory, LossTracker, RunHistory
    from pytorch_accel.trainer import DEFAULT_CALLBACKS, replace_trainer_placeholder_values
    from pytorch_accel.trainer import Trainer as TrainerAgain
    from pytorch_accel.trainer import TrainerPlaceholderValues as PlaceholdersAgain

    assert Trainer is TrainerAgain
    assert TrainerPlaceholderValues is PlaceholdersAgain
    assert __version__ == pytorch_accel.__version__
    assert callable(notebook_launcher)
    assert callable(set_seed)
    assert callable(replace_trainer_placeholder_values)
    assert issubclass(InMemoryRunHistory, RunHistory)
    assert all(isinstance(c, type) for c in DEFAULT_CALLBACKS)
    for obj in (
        CallbackHandler,
        LogMetricsCallback,
        MoveModulesToDeviceCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        StopTrainingError,
        TerminateOnNaNCallback,
        TrainerCallback,
        get_default_callbacks,
        TrainerRunConfig,
        LossTracker,
    ):
        assert obj.__module__.startswith("pytorch_accel")


def test_import_does_not_touch_the_random_state() -> None:
    code = (
        "import torch, random; torch.manual_seed(5); random.seed(5);"
        "a = torch.random.get_rng_state(); b = random.getstate();"
        "import pytorch_accel, pytorch_accel.trainer, pytorch_accel.callbacks;"
        "assert torch.equal(a, torch.random.get_rng_state()) and b == random.getstate()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
