"""What a run record holds: the environment, the model's summary, the run's configuration.

Private: used by ``RunRecordCallback``. Every function returns JSON-ready values.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pytorch_accel.checks import callable_name

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["environment", "jsonable", "model_summary", "model_summary_text", "run_configuration"]


def jsonable(value: Any) -> Any:
    """``value`` with every leaf a JSON value (paths as strings, other objects ``described``)."""
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return described(value)


def described(value: object) -> Any:
    """A one-element tensor's number, a callable's name, else ``str`` (no memory addresses)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if callable(value) and hasattr(value, "__qualname__"):
        return callable_name(value)
    text = str(value)
    return type(value).__qualname__ if " at 0x" in text else text


def environment(trainer: TrainerLike) -> dict[str, Any]:
    """Versions, devices, the accelerate config, the git commit and the command line."""
    import accelerate

    import pytorch_accel

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "versions": {
            "torch": torch.__version__,
            "accelerate": accelerate.__version__,
            "pytorch_accel": pytorch_accel.__version__,
            "cuda": torch.version.cuda,
        },
        "devices": _devices(trainer),
        "accelerate_config": _accelerate_config(),
        "git": _git(_script_directory()),
        "command": {"argv": list(sys.argv), "executable": sys.executable, "cwd": os.getcwd()},
    }


def _devices(trainer: TrainerLike) -> dict[str, Any]:
    accelerator = trainer.accelerator
    devices: dict[str, Any] = {
        "device": str(accelerator.device),
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "mixed_precision": str(accelerator.mixed_precision),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        devices["cuda_devices"] = [torch.cuda.get_device_name(index) for index in range(count)]
    return devices


def _accelerate_config() -> dict[str, Any]:
    """The default ``accelerate config`` file (if any) and the ``ACCELERATE_*`` variables."""
    from accelerate.commands.config import default_config_file, load_config_from_file

    config: Any = None
    if os.path.isfile(default_config_file):
        try:
            config = jsonable(load_config_from_file(None).to_dict())
        except Exception as error:  # a broken file must not stop the run
            config = f"unreadable: {error}"
    variables = {name: value for name, value in os.environ.items() if name.startswith("ACCELERATE")}
    return {"file": default_config_file, "config": config, "environment": variables}


def _script_directory() -> Path:
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return script.resolve().parent if script is not None and script.is_file() else Path.cwd()


def _git(directory: Path) -> dict[str, Any] | None:
    """The commit and whether the tree is modified, or ``None`` outside a git repository."""

    def git(*arguments: str) -> str:
        result = subprocess.run(
            ["git", *arguments],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return result.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        modified = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "modified": modified, "directory": str(directory)}


def model_summary(model: nn.Module) -> dict[str, Any]:
    """Parameters per top-level module, trainable and frozen, and the totals.

    A parameter shared by several modules counts in each of them, once in the totals.
    Returns ``{"class", "modules": [{"name", "class", "trainable", "frozen"}], "trainable",
    "frozen", "total"}``; parameters of the model itself (not of a child) are listed under
    the name ``"(own)"``.
    """
    modules = [
        {"name": name, "class": type(child).__qualname__, **_count(child.parameters())}
        for name, child in model.named_children()
    ]
    own = _count(model.parameters(recurse=False))
    if own["trainable"] or own["frozen"]:
        modules.append({"name": "(own)", "class": type(model).__qualname__, **own})
    totals = _count(model.parameters())
    total = sum(totals.values())
    return {"class": type(model).__qualname__, "modules": modules, **totals, "total": total}


def _count(parameters: Any) -> dict[str, int]:
    counts = {"trainable": 0, "frozen": 0}
    for parameter in parameters:  # parameters() yields each shared parameter once
        counts["trainable" if parameter.requires_grad else "frozen"] += parameter.numel()
    return counts


def model_summary_text(summary: Mapping[str, Any], model: nn.Module) -> str:
    """The summary as a table, then the model's ``repr``."""
    rows = [("module", "class", "trainable", "frozen")]
    rows += [
        (m["name"], m["class"], f"{m['trainable']:,}", f"{m['frozen']:,}")
        for m in summary["modules"]
    ]
    rows.append(("total", summary["class"], f"{summary['trainable']:,}", f"{summary['frozen']:,}"))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = [
        "  ".join(
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    return "\n".join([*lines, "", repr(model), ""])


def run_configuration(trainer: TrainerLike) -> dict[str, Any]:
    """``{"run_config", "train", "trainer"}``: the run config and the trainer's parts."""
    run_config = {} if trainer.run_config is None else trainer.run_config.to_dict()
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # accelerate's wrapper
    scheduler = getattr(trainer.scheduler, "scheduler", trainer.scheduler)
    groups = [
        {key: value for key, value in group.items() if key != "params"}
        for group in optimizer.param_groups
    ]
    train = {
        "create_scheduler_fn": getattr(trainer, "create_scheduler_fn", None),
        "collate_fn": getattr(trainer, "collate_fn", None),
        "resumed_from": trainer.resumed_from,
        "limit_train_batches": trainer.limit_train_batches,
        "limit_eval_batches": trainer.limit_eval_batches,
        "train_dataset_size": _size(trainer.train_dataloader),
        "eval_dataset_size": _size(trainer.eval_dataloader),
    }
    parts = {
        "class": type(trainer).__qualname__,
        "model": type(trainer.get_model()).__qualname__,
        "loss_func": trainer.loss_func,
        "optimizer": {"class": type(optimizer).__qualname__, "param_groups": groups},
        "scheduler": None if scheduler is None else type(scheduler).__qualname__,
        "callbacks": trainer.callback_handler.callback_list,
    }
    result: dict[str, Any] = jsonable({"run_config": run_config, "train": train, "trainer": parts})
    return result


def _size(dataloader: Any) -> int | None:
    dataset = getattr(dataloader, "dataset", None)
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
