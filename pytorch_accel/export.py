"""Export a trained model in the ecosystem's formats (``Trainer.save_model``).

A model with a ``save_pretrained`` method (a ``transformers`` model, a PEFT model: its adapter
only) is written by that method, as safetensors; any other ``nn.Module`` as one
``model.safetensors`` file (``safetensors.torch``, tensors that share memory written once).
The directory is written beside its destination and renamed into place, so a failed export
leaves what was there before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._checkpointing.store import discard, hidden, publish
from pytorch_accel.distributed import AgreedFlag

__all__ = ["SAFETENSORS_NAME", "save_model"]

SAFETENSORS_NAME = "model.safetensors"
"""The file a model without ``save_pretrained`` is exported to, in the export directory."""


def save_model(
    accelerator: Accelerator,
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``model``, unwrapped, to ``directory`` (the work of ``Trainer.save_model``).

    Every process must call it: sharded models are gathered first, and the processes agree
    on the outcome, so an error on the main process is raised on every process.

    Args:
        accelerator: The accelerator that prepared ``model``.
        model: The model, as prepared (distributed, compiled or mixed-precision wrappers).
        directory: The directory to write.
        overwrite: Replace an existing non-empty ``directory``.

    Returns:
        The directory written.

    Raises:
        FileExistsError: If ``directory`` is a non-empty directory and ``overwrite`` is false,
            or a file.
        RuntimeError: On the other processes, if the main process failed to write.
    """
    final = Path(directory)
    flag = AgreedFlag() if accelerator.num_processes > 1 else None  # on every process
    refusal: FileExistsError | None = None
    if accelerator.is_main_process:  # the one process that writes decides, for every process
        try:
            check_destination(final, overwrite)
        except FileExistsError as error:
            refusal = error
    _raise_if_any(flag, refusal, final, "refused to replace")
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    sharded = accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    state_dict = accelerator.get_state_dict(model) if sharded else None  # on every process
    failure: Exception | None = None
    if accelerator.is_main_process:
        try:
            _write(bare, state_dict, final)
        except Exception as error:  # raised below, once the processes agree
            failure = error
    _raise_if_any(flag, failure, final, "failed to write")
    return final


def _raise_if_any(flag: AgreedFlag | None, error: Exception | None, final: Path, what: str) -> None:
    """Raise ``error`` on the main process, and an error naming it on the others."""
    failed = int(error is not None)
    if flag is not None:
        failed = flag.settle(failed)  # every process waits here for the main one
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"save_model: the main process {what} {str(final)!r}; its error is in its output."
        )


def check_destination(final: Path, overwrite: bool) -> None:
    """Refuse to replace a file, or a non-empty directory unless ``overwrite``.

    Raises:
        FileExistsError: Naming the path and the fix.
    """
    if final.is_file() or (final.is_symlink() and not final.exists()):
        raise FileExistsError(
            f"save_model: directory={str(final)!r} is a file, not a directory; pass a directory "
            "to write the model to (it is created), or remove the file."
        )
    if not overwrite and final.is_dir() and any(final.iterdir()):
        raise FileExistsError(
            f"save_model: directory={str(final)!r} already exists and is not empty; pass "
            "overwrite=True to replace it, or choose another directory."
        )


def _write(bare: nn.Module, state_dict: dict[str, Any] | None, final: Path) -> None:
    """Write the export to a hidden directory beside ``final``, then rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = hidden(final)
    discard(temporary)
    try:
        save_pretrained = getattr(bare, "save_pretrained", None)
        if callable(save_pretrained):
            extra = {} if state_dict is None else {"state_dict": state_dict}
            save_pretrained(str(temporary), **extra)  # safetensors by default
        else:
            _write_safetensors(bare, state_dict, temporary / SAFETENSORS_NAME)
        publish(temporary, final)
    finally:
        discard(temporary)


def _write_safetensors(bare: nn.Module, state_dict: dict[str, Any] | None, path: Path) -> None:
    """One safetensors file of the model's state (shared tensors once: ``save_model``)."""
    import safetensors.torch

    path.parent.mkdir(parents=True)
    if state_dict is None:
        safetensors.torch.save_model(bare, str(path))
    else:  # gathered copies; a tensor under two names (tied weights) is copied once more
        tensors, seen = {}, set()
        for name, value in state_dict.items():
            tensors[name] = value.contiguous() if value.data_ptr() not in seen else value.clone()
            seen.add(value.data_ptr())
        safetensors.torch.save_file(tensors, str(path))
