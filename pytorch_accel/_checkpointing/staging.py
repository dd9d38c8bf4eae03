"""Training states staged in host memory, then written: in the training thread or in the background.

A state's files are ``StagedFile``s, their contents copied to host memory for a save written in
the background (``HostCopies``, into buffers kept between saves). A ``PendingSave`` writes one
process's files, each flushed and digested in one pass; once every process wrote its files
(agreed through an ``AgreedFlag`` from the training thread, never the writing one), the main
process writes the manifest from the recorded digests and publishes the directory. A process
killed earlier leaves a hidden directory without a manifest.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import torch

from pytorch_accel._checkpointing.files import (
    TrainingStateError,
    disk_full_error,
    load_safely,
    write_digested,
)
from pytorch_accel._checkpointing.store import discard, publish, write_manifest
from pytorch_accel.distributed import AgreedFlag
from pytorch_accel.tracking import get_logger

__all__ = [
    "HostCopies",
    "PendingSave",
    "StagedFile",
    "write_safetensors",
]

_RECORDS = ".records-{rank}.json"
_WRITING, _FAILED = 1, 2  # flags agreed with AgreedFlag (the maximum): 0 is "written"


@dataclass
class StagedFile:
    """One file of a training state: its name, content, format, and whether it is checked.

    ``safetensors``: the weights (else ``torch.save``); ``checked``: refused unless it loads
    back with ``weights_only=True`` (the states the trainer loads itself).
    """

    name: str
    content: Any
    safetensors: bool = False
    checked: bool = False


class HostCopies:
    """Copies of tensors in host memory, reused from one save to the next.

    The n-th tensor of a save is copied into the n-th buffer of the previous save when shape
    and dtype match, so only the first save allocates; copies of accelerator tensors go to
    pinned memory, unsynchronised. Call ``copy`` only while no earlier save is being written.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._used = 0
        self._memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # the original kept alive
        self._device_copies = False

    @contextlib.contextmanager
    def session(self, copy: bool = True) -> Iterator[Callable[[Any], Any]]:
        """One save's ``copy``: tensors shared within it stay shared; waits for device copies.

        ``copy=False`` (a blocking save, written before training goes on): the identity.
        """
        self._used, self._memo, self._device_copies = 0, {}, False
        try:
            yield self.copy if copy else _as_is
        finally:
            if self._device_copies and torch.cuda.is_available():
                torch.cuda.synchronize()
            self._memo = {}

    def copy(self, value: Any) -> Any:
        """A copy of ``value`` whose tensors are in host memory; containers are copied."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, Mapping):
            items = [(key, self.copy(item)) for key, item in value.items()]
            return OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
        if isinstance(value, list):
            return [self.copy(item) for item in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self.copy(item) for item in value)
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        known = self._memo.get(id(tensor))
        if known is not None:
            return known[1]
        source = tensor.detach()
        if source.layout != torch.strided or source.is_quantized or source.device.type == "meta":
            copied = source.to("cpu", copy=True)
        else:
            copied = self._buffer(source)
            on_device = source.device.type != "cpu"
            copied.copy_(source, non_blocking=on_device)
            self._device_copies |= on_device
        self._memo[id(tensor)] = (tensor, copied)
        return copied

    def _buffer(self, source: torch.Tensor) -> torch.Tensor:
        index, self._used = self._used, self._used + 1
        kept = self._buffers[index] if index < len(self._buffers) else None
        if kept is not None and kept.shape == source.shape and kept.dtype == source.dtype:
            return kept
        pin = source.device.type == "cuda"
        buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=pin)
        self._buffers[index : index + 1] = [buffer]  # replaced, or appended (index == len)
        return buffer


def _as_is(value: Any) -> Any:
    return value


def _write(path: Path, item: StagedFile) -> dict[str, Any]:
    if item.safetensors:
        return write_digested(path, functools.partial(write_safetensors, item.content))
    if not item.checked:
        return write_digested(path, lambda handle: torch.save(item.content, handle))
    buffer = io.BytesIO()
    torch.save(item.content, buffer)
    try:
        load_safely(buffer.getvalue(), path, "Trainer.save_training_state")
    except TrainingStateError as error:
        raise unsafe_state_error(error) from error
    return write_digested(path, buffer.getvalue())


def unsafe_state_error(error: TrainingStateError) -> TypeError:
    """The error for a training state that holds objects ``weights_only`` cannot load."""
    return TypeError(
        "Trainer.save_training_state: the trainer state (scheduler, run history, a "
        "callback's state_dict or rank_state_dict, or the train dataset's or "
        "dataloader's state_dict) holds objects that cannot be loaded "
        f"safely; keep them to tensors, numbers, strings and containers. {error}"
    )


_SAFETENSORS_DTYPES = {  # in the order of safetensors' dtypes, which orders a file's entries
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
}
_DTYPE_RANK = {dtype: rank for rank, dtype in enumerate(_SAFETENSORS_DTYPES)}


def write_safetensors(tensors: Mapping[str, torch.Tensor], handle: IO[bytes]) -> None:
    """Write the bytes of ``safetensors.torch.save(tensors, metadata={"format": "pt"})``, no copy.

    safetensors builds the whole file in memory first; these are streamed from the tensors.
    """
    if any(tensor.dtype not in _SAFETENSORS_DTYPES for tensor in tensors.values()):
        from safetensors.torch import save as safetensors_bytes

        handle.write(safetensors_bytes(dict(tensors), metadata={"format": "pt"}))
        return
    ordered = sorted(tensors.items(), key=lambda item: (-_DTYPE_RANK[item[1].dtype], item[0]))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in ordered:
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    handle.write(struct.pack("<Q", len(encoded)) + encoded)
    for _, tensor in ordered:
        if tensor.numel():
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            handle.write(flat.view(torch.uint8).numpy().data)


class PendingSave:
    """A training state being written into its hidden ``directory``, to publish at ``final``.

    ``run`` writes this process's ``files``, keeps their digests in ``records`` (a process other
    than the main one also in ``.records-<rank>.json``, for the manifest) and what it raised in
    ``error``. The state is published once every process wrote its part (agreed through
    ``flag``; ``None`` in one process), with ``manifest_info`` in its manifest.
    """

    def __init__(
        self,
        files: list[StagedFile],
        directory: Path,
        final: Path,
        manifest_info: Mapping[str, Any],
        accelerator: Any,
        flag: AgreedFlag | None,
    ) -> None:
        self.files, self.directory, self.final = files, directory, final
        self._info, self._accelerator, self._flag = dict(manifest_info), accelerator, flag
        self.records: dict[str, Any] = {}
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Write the files and their records; keep an error for the training thread."""
        try:
            for item in self.files:
                self.records[item.name] = _write(self.directory / item.name, item)
            if not self._accelerator.is_main_process:
                path = self.directory / _RECORDS.format(rank=self._accelerator.process_index)
                path.write_text(json.dumps(self.records, sort_keys=True), encoding="utf-8")
        except BaseException as error:  # kept, raised by the training thread
            self.error = error

    def start(self) -> None:
        """Write this process's files in a background thread."""
        self._thread = threading.Thread(target=self.run, name="pytorch_accel-save", daemon=True)
        self._thread.start()

    def poll(self) -> bool:
        """At a step boundary: complete the save if every process wrote its part; say if done.

        With several processes, from an exchange started at an earlier boundary (no step waits
        for it). Raises what the writing raised (see ``wait``).
        """
        if self._flag is None:
            local = self._local_flag()
            return local != _WRITING and self._complete(local)
        if self._flag.pending:
            agreed = self._flag.finish()
            if agreed != _WRITING:
                return self._complete(agreed)
        self._flag.start(self._local_flag())
        return False

    def wait(self) -> None:
        """Wait until every process wrote its part, then complete the save.

        Raises:
            OSError: A full disk (``ENOSPC``), naming the state.
            BaseException: Whatever else writing this process's files raised, or
                ``TrainingStateError`` if another process failed to write its files.
        """
        self._join()
        agreed = _FAILED if self.error else 0
        if self._flag is not None:
            self._flag.finish()  # an exchange started at a step boundary: outdated
            agreed = self._flag.settle(agreed)
        self._complete(agreed)

    def abandon(self) -> None:
        """After a failed run: wait for the writing, publish the state if one process wrote it all.

        With several processes (whose agreement could wait on a failed one) the unpublished
        directory is left to be tidied. Nothing is raised.
        """
        self._join()
        if self._flag is None and self.error is None:
            with contextlib.suppress(Exception):
                self._complete(0)
                return
        get_logger().warning(
            f"The training state {str(self.final)!r}, saved in the background, was not "
            "completed: the run ended with an error first."
        )

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _local_flag(self) -> int:
        if self._thread is not None and self._thread.is_alive():
            return _WRITING
        return _FAILED if self.error else 0

    def _complete(self, agreed: int) -> bool:
        main, directory = self._accelerator.is_main_process, self.directory
        if agreed == 0 and main:
            try:
                records = dict(self.records)
                for path in sorted(directory.glob(".records-*.json")):
                    records.update(json.loads(path.read_text(encoding="utf-8")))
                    path.unlink()
                write_manifest(directory, self._info, records)
                publish(directory, self.final)
            except BaseException as failure:
                discard(directory)
                self._raise(failure)
        if agreed == 0:
            return True
        self._join()  # a process failed: this one's writing may still be going on
        if main:
            discard(directory)
        if self.error is None:
            raise TrainingStateError(
                f"Trainer.save_training_state: another process could not write its part of "
                f"{str(self.final)!r}; the save was abandoned (its error is in that process's "
                "output)."
            )
        self._raise(self.error)

    def _raise(self, error: BaseException) -> NoReturn:
        full = disk_full_error(error, self.final, "training state")
        if full is None:
            raise error
        raise full from error
