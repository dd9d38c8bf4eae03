"""The portable checkpoint file of ``Trainer.save_checkpoint``: one file, with its digest.

It holds ``model_state_dict``, ``optimizer_state_dict``, ``scheduler_state_dict`` and the
user's entries, with its digest in its ZIP comment (``files.atomic_save_digested``), so
pytorch-accelerated and ``torch.load`` read it as it is. Files of earlier versions hold a
SHA-256 checksum of their contents under ``CHECKSUM_KEY``, still verified.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._checkpointing.files import atomic_save_digested, load_safely, read_checked
from pytorch_accel._checkpointing.fit import misfit
from pytorch_accel._checkpointing.sharded import (
    full_optimizer_state,
    is_sharded,
    load_full_states,
    sharded_model_tensors,
)

__all__ = [
    "CHECKSUM_KEY",
    "checksum",
    "load_checkpoint_file",
    "model_state_dict",
    "read_tensors_file",
    "restore_checkpoint",
    "write_checkpoint",
]


CHECKSUM_KEY = "pytorch_accel_sha256"
"""The entry of earlier versions' checkpoint files holding the ``checksum`` of the rest."""


def load_checkpoint_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint dict safely (``weights_only=True``), with tensors on the CPU.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is truncated, corrupt or not a checkpoint dict.
    """
    source = Path(path)
    checkpoint = read_tensors_file(source, "load_checkpoint", "checkpoint")
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(
            f"load_checkpoint: {str(source)!r} is not a checkpoint written by save_checkpoint "
            "(no 'model_state_dict' key)."
        )
    return checkpoint


def read_tensors_file(path: str | os.PathLike[str], where: str, kind: str = "weights") -> Any:
    """Load a file of tensors and plain containers once, verified, with ``files.load_safely``.

    A dict holding ``CHECKSUM_KEY`` (earlier versions) is returned without it. ``where`` and
    ``kind`` (``"checkpoint"``, ``"weights"``) are for messages.

    Raises:
        FileNotFoundError: If there is no such file.
        ValueError: If the file is truncated, corrupt or holds other objects.
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{where}: no {kind} file at {str(source)!r}.")
    loaded = load_safely(read_checked(source, where)[0], source, where, ValueError)
    if isinstance(loaded, dict) and CHECKSUM_KEY in loaded:
        expected = loaded.pop(CHECKSUM_KEY)
        if checksum(loaded) != expected:
            raise ValueError(
                f"{where}: {str(source)!r} is corrupt: its contents differ from the SHA-256 "
                "checksum saved with it (a changed bit in its tensors or entries). Load an "
                "earlier copy; this one was not used."
            )
    return loaded


def checksum(checkpoint: Mapping[str, Any]) -> str:
    """Return the SHA-256 hex digest of a checkpoint's contents: earlier versions' checksum.

    Tensors count with their dtype, shape and data, other values with their ``repr``,
    containers with their items in order.
    """
    digest = hashlib.sha256()
    _digest_into(digest, checkpoint)
    return digest.hexdigest()


def _digest_into(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        digest.update(f"tensor:{value.dtype}:{tuple(value.shape)}:".encode())
        digest.update(_tensor_bytes(value))
    elif isinstance(value, Mapping):
        digest.update(f"map:{len(value)}:".encode())
        for key, item in value.items():
            _digest_into(digest, key)
            _digest_into(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__}:{len(value)}:".encode())
        for item in value:
            _digest_into(digest, item)
    elif isinstance(value, (set, frozenset)):  # no stable order: their items' reprs, sorted
        digest.update(f"set:{sorted(map(repr, value))!r};".encode())
    elif hasattr(value, "tobytes") and hasattr(value, "dtype"):  # NumPy arrays and scalars
        digest.update(f"array:{value.dtype}:{getattr(value, 'shape', ())}:".encode())
        digest.update(value.tobytes())
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def _tensor_bytes(tensor: torch.Tensor) -> Any:
    """The bytes of a tensor's data, as a buffer (any dtype, layout or device)."""
    tensor = tensor.detach()
    if tensor.is_quantized:
        tensor = tensor.int_repr()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.device.type == "meta":
        return b""
    return tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def model_state_dict(accelerator: Accelerator, model: nn.Module) -> dict[str, Any]:
    """The unwrapped model's state dict, gathered by sharded engines (on every process)."""
    sharded = (DistributedType.FSDP, DistributedType.DEEPSPEED)
    if accelerator.distributed_type in sharded:
        return accelerator.get_state_dict(model)  # type: ignore[no-any-return]
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    return bare.state_dict()  # type: ignore[no-any-return]


def write_checkpoint(
    accelerator: Accelerator,
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Write a checkpoint file atomically (``Trainer.save_checkpoint``), from every process.

    It holds the states of ``model``, ``optimizer`` and ``scheduler`` (unless ``None``) and
    the entries of ``extra``; the main process writes it.

    Raises:
        TypeError: If an entry of ``extra`` would not load back with ``weights_only=True``.
    """
    for key, value in (extra or {}).items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            load_safely(buffer.getvalue(), Path(str(path)), "save_checkpoint", error=ValueError)
        except Exception as error:
            raise TypeError(
                f"save_checkpoint: checkpoint_kwargs[{key!r}] is a {type(value).__name__}, which "
                "load_checkpoint could not read back safely (weights_only=True). Keep entries to "
                "tensors, numbers, strings and lists, tuples and dicts of them (e.g. str(path) "
                f"for a Path). ({error})"
            ) from error
    checkpoint = {"model_state_dict": model_state_dict(accelerator, model)}
    if optimizer is not None and is_sharded(accelerator):  # gathered, numbered as unsharded
        checkpoint["optimizer_state_dict"] = full_optimizer_state(model, optimizer)
    elif optimizer is not None:
        checkpoint["optimizer_state_dict"] = optimizer.state_dict()
    if scheduler is not None:
        checkpoint["scheduler_state_dict"] = scheduler.state_dict()
    checkpoint.update(extra or {})
    if accelerator.is_main_process:
        checkpoint.pop(CHECKSUM_KEY, None)  # a dict loaded from an earlier version's file
        atomic_save_digested(checkpoint, path)
    accelerator.wait_for_everyone()


def restore_checkpoint(
    accelerator: Accelerator,
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
) -> dict[str, Any]:
    """Load a checkpoint file; return the whole dict (``Trainer.load_checkpoint``).

    The optimizer and scheduler are loaded unless ``None``, once everything was checked: a
    file that does not fit changes nothing. A sharded model takes its shard of the full states.

    Raises:
        ValueError: If the file's model, optimizer or scheduler state does not fit, naming the
            file and the mismatch.
    """
    accelerator.wait_for_everyone()
    checkpoint = load_checkpoint_file(path)
    bare = accelerator.unwrap_model(model, keep_torch_compile=False)
    sharded = is_sharded(accelerator)
    tensors = sharded_model_tensors(model) if sharded else None
    parts: list[tuple[str, Any, Any]] = [("model", bare, checkpoint["model_state_dict"])]
    for name, target in (("optimizer", optimizer), ("scheduler", scheduler)):
        if target is not None and f"{name}_state_dict" in checkpoint:
            parts.append((name, target, checkpoint[f"{name}_state_dict"]))
    for name, target, state in parts:
        problem = misfit(name, target, state, tensors)
        if problem:
            raise ValueError(
                f"load_checkpoint: {os.fspath(path)!r} does not fit this {name}: {problem}. "
                "Nothing was loaded."
            )
    if sharded:
        loaded = dict((name, state) for name, _, state in parts)
        load_full_states(model, loaded["model"], optimizer, loaded.get("optimizer"))
        parts = [part for part in parts if part[0] == "scheduler"]
    for _, target, state in parts:
        target.load_state_dict(state)
    return checkpoint
