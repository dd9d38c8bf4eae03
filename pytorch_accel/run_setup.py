"""The run set-up ``train()`` applies: ``pytorch_accel.run_config`` defines it; the path is kept."""

from __future__ import annotations

from pytorch_accel.run_config import (
    CUBLAS_WORKSPACE_CONFIG,
    ChosenRates,
    ResumeParts,
    RunSetup,
    bare_compiled_models,
    optimizer_not_loaded,
    recorded,
    scale_learning_rates,
)

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "ChosenRates",
    "ResumeParts",
    "RunSetup",
    "bare_compiled_models",
    "optimizer_not_loaded",
    "recorded",
    "scale_learning_rates",
]
