"""Multi-process support: CPU fallback, world-size checks, and agreeing on a stop."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from pytorch_accel.errors import StopTrainingError

__all__ = [
    "StopAgreement",
    "check_world_size",
    "launcher_world_size",
    "needs_cpu_distributed",
    "remove_padding",
]

_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_world_size() -> int:
    """Return the number of processes the launcher (torchrun, accelerate launch, MPI) started."""
    for variable in _WORLD_SIZE_VARIABLES:
        value = os.environ.get(variable)
        if value and value.isdigit():
            return int(value)
    return 1


def _has_gpu_like_device() -> bool:
    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def needs_cpu_distributed() -> bool:
    """Return whether several processes were launched on a machine without GPUs.

    accelerate then builds a non-distributed ``Accelerator`` in each process, which would train
    independent copies; ``Accelerator(cpu=True)`` makes them one gloo process group instead.
    """
    return launcher_world_size() > 1 and not _has_gpu_like_device()


def check_world_size(num_processes: int) -> None:
    """Raise if the launcher started more processes than the accelerator takes part with.

    Args:
        num_processes: ``accelerator.num_processes``.

    Raises:
        ValueError: If the numbers disagree, naming the variable or flag that fixes it.
    """
    launched = launcher_world_size()
    if launched > 1 and num_processes != launched:
        raise ValueError(
            f"Trainer: the launcher started {launched} processes (WORLD_SIZE={launched}) but the "
            f"Accelerator sees num_processes={num_processes}, so each process would train its own "
            "copy of the model. On a machine without GPUs set ACCELERATE_USE_CPU=1, or return "
            "Accelerator(cpu=True) from _create_accelerator; with GPUs, make one visible per "
            "process (CUDA_VISIBLE_DEVICES) or launch with `accelerate launch --multi_gpu`."
        )


class StopAgreement:
    """Makes every process stop at the same point when any one raises StopTrainingError.

    Each process records a stop locally with ``request``; at an agreement point every
    process calls ``agree``, which all-reduces the flag over a CPU (gloo) group, so no GPU
    stream is synchronised, and raises on every process if any requested a stop.
    """

    def __init__(self) -> None:
        self._pending: StopTrainingError | None = None
        self._agreed: StopTrainingError | None = None
        self._group: Any = None
        if dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")

    def request(self, error: StopTrainingError) -> None:
        """Record a stop raised on this process (the first one wins)."""
        if self._pending is None:
            self._pending = error

    def agree(self) -> None:
        """Raise StopTrainingError on every process if any process requested a stop.

        Raises:
            StopTrainingError: The local request, or one naming that another process asked.
        """
        flag = torch.tensor([0 if self._pending is None else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        if flag[0] == 0:
            return
        error = self._pending or StopTrainingError("Stopping: another process requested it.")
        self._pending = None
        self._agreed = error
        raise error

    def agreed(self, error: StopTrainingError) -> bool:
        """Whether ``error`` is the stop every process already agreed on (and is raising)."""
        return error is self._agreed


def remove_padding(padded_tensor: torch.Tensor, pad_value: float) -> torch.Tensor:
    """Drop the rows of a gathered tensor that consist of padding only.

    After ``Trainer.gather(..., padding_value=pad_value)``, the rows that are ``pad_value``
    everywhere are the padding.

    Args:
        padded_tensor: The tensor, padded along its first dimension.
        pad_value: The padding value.

    Returns:
        The rows that hold anything but padding.
    """
    padding = padded_tensor == pad_value
    while padding.ndim > 1:
        padding = padding.all(dim=-1)
    return padded_tensor[~padding]
