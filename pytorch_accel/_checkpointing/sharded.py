"""Model and optimizer states through ``torch.distributed.checkpoint``: one path for every layout.

``get_model_state_dict``/``set_model_state_dict`` (and the optimizer's) serve one process, DDP
and FSDP2 alike, without wrapper or ``torch.compile`` prefixes. A training state's full states
are the whole model (``model.safetensors``) and optimizer (``optimizer.bin``, keyed by parameter
name); a sharded one (FSDP2 with ``SHARDED_STATE_DICT``) is written by every process through DCP
(``pytorch_model_fsdp_0``, ``optimizer_0``) and loads into any layout, resharded. DCP's files are
read once each, checked against the manifest, and its ``.metadata`` (a pickle) is unpickled
admitting only DCP's metadata classes (``read_dcp_metadata``).

A checkpoint file (``Trainer.save_checkpoint``) holds full states numbered as an unsharded
optimizer's (``full_optimizer_state``), so it loads in any layout too. Every process calls these
functions at the same point. torch's state-dict module, slow to import, is imported when needed.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import pickle
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._checkpointing.files import TrainingStateError, read_verified

__all__ = [
    "DCP_MODEL",
    "DCP_OPTIMIZER",
    "fsdp_version",
    "full_optimizer_state",
    "is_sharded",
    "load_full_states",
    "load_states",
    "optimizer_owner",
    "read_dcp_metadata",
    "read_sharded",
    "saves_sharded",
    "sharded_model_tensors",
    "states_to_save",
    "write_sharded",
]

DCP_MODEL, DCP_OPTIMIZER = "pytorch_model_fsdp_0", "optimizer_0"
"""The folders of a sharded state's model and optimizer (DCP's files: ``.metadata``, ...)."""


def is_sharded(accelerator: Accelerator) -> bool:
    """Whether the accelerator shards the model with FSDP (version 1 or 2)."""
    return accelerator.distributed_type == DistributedType.FSDP  # type: ignore[no-any-return]


def fsdp_version(accelerator: Accelerator) -> int | None:
    """The FSDP version the accelerator shards with (``None``: not sharded by FSDP)."""
    if not is_sharded(accelerator):
        return None
    return int(accelerator.state.fsdp_plugin.fsdp_version)


def saves_sharded(accelerator: Accelerator) -> bool:
    """Whether training states are saved sharded (FSDP with ``SHARDED_STATE_DICT``)."""
    if not is_sharded(accelerator):
        return False
    kind = accelerator.state.fsdp_plugin.state_dict_type
    return str(getattr(kind, "name", kind)) == "SHARDED_STATE_DICT"


def optimizer_owner(model: nn.Module, loss_func: Any) -> nn.Module:
    """The module holding the optimizer's parameters: the model, with a loss module's own."""
    if not isinstance(loss_func, nn.Module) or not any(True for _ in loss_func.parameters()):
        return model
    owner = nn.Module()
    owner.add_module("model", model)
    owner.add_module("loss_func", loss_func)
    return owner


def sharded_model_tensors(model: nn.Module) -> dict[str, Any]:
    """The sharded model's tensors by plain key, each with its full shape (no gathering)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))


def _options(model: nn.Module, full: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # gathered to the main process's CPU memory, or on every process when the parameters are
    # on the CPU already
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    return StateDictOptions(full_state_dict=full, cpu_offload=full and not on_cpu)


def states_to_save(
    model: nn.Module,
    optimizer: Any,
    full: bool,
    owner: nn.Module | None = None,
    saving: bool = False,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The model's and optimizer's states keyed by parameter name (``optimizer``: may be None).

    ``full``: gathered whole (FSDP; at least on the main process), else as each process holds
    them (a sharded model's shards, an unsharded model's tensors themselves). ``owner``: the
    module holding the optimizer's parameters (``optimizer_owner``; default ``model``);
    ``saving``: leave an optimizer without state as it was (not a template to load into).
    """
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = _options(model, full)
    model_state = get_model_state_dict(model, options=options)
    if optimizer is None:
        return model_state, None
    inner = getattr(optimizer, "optimizer", optimizer)
    fresh = saving and not inner.state
    state = dict(get_optimizer_state_dict(owner or model, inner, options=options))
    if fresh:  # torch stepped it with zero gradients and rate to create its state: undone
        inner.state.clear()
        state["state"] = {}
    return model_state, state


def load_states(
    model: nn.Module,
    model_state: Mapping[str, Any],
    optimizer: Any = None,
    optimizer_state: Mapping[str, Any] | None = None,
    full: bool = True,
    owner: nn.Module | None = None,
    strict: bool = True,
) -> None:
    """Load states keyed by parameter name (``states_to_save``'s); each process takes its part.

    ``full``: whole states into a sharded model (else as ``states_to_save(full=False)``);
    ``owner``: as for ``states_to_save``; ``strict=False``: ``model_state`` holds some of the
    model's tensors (a PEFT model's adapter), the others stay as they are.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=full, strict=strict)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        set_model_state_dict(model, dict(model_state), options=options)
        if optimizer is not None and optimizer_state is not None:
            inner = getattr(optimizer, "optimizer", optimizer)
            state = dict(optimizer_state)
            set_optimizer_state_dict(owner or model, inner, state, options=options)


def full_optimizer_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's full state on the main process (at least), numbered as unsharded."""
    _, state = states_to_save(model, optimizer, full=True)
    if not state:
        return {}
    numbers = _parameter_numbers(state["param_groups"])
    return {
        "state": {numbers[key]: value for key, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [numbers[key] for key in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def load_full_states(
    model: nn.Module,
    model_state: Mapping[str, Any],
    optimizer: Any = None,
    optimizer_state: Mapping[str, Any] | None = None,
) -> None:
    """Load full states (numbered as ``full_optimizer_state``); each process keeps its shard."""
    by_name: Any = None
    if optimizer is not None and optimizer_state is not None:
        _, local = states_to_save(model, optimizer, full=False)
        assert local is not None
        names = {number: key for key, number in _parameter_numbers(local["param_groups"]).items()}
        by_name = {
            "state": {names[number]: value for number, value in optimizer_state["state"].items()},
            "param_groups": [
                {**group, "params": [names[number] for number in group["params"]]}
                for group in optimizer_state["param_groups"]
            ],
        }
    load_states(model, model_state, optimizer, by_name)


def _parameter_numbers(groups: list[dict[str, Any]]) -> dict[Any, int]:
    """Number the parameters of the groups in order, as ``Optimizer.state_dict`` does."""
    keys = [key for group in groups for key in group["params"]]
    return {key: number for number, key in enumerate(keys)}


# ------------------------------------------------------------------------ sharded (DCP)


def write_sharded(
    directory: Path, model: nn.Module, optimizer: Any, owner: nn.Module | None = None
) -> None:
    """Write this process's shards of the model and optimizer with DCP (every process)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    model_state, optimizer_state = states_to_save(model, optimizer, False, owner)
    save({"model": model_state}, storage_writer=FileSystemWriter(directory / DCP_MODEL))
    if optimizer_state is not None:
        writer = FileSystemWriter(directory / DCP_OPTIMIZER)
        save({"optimizer": optimizer_state}, storage_writer=writer)


def read_sharded(
    directory: Path,
    records: Mapping[str, Any],
    model: nn.Module,
    optimizer: Any,
    where: str,
    owner: nn.Module | None = None,
) -> None:
    """Load a sharded state's model (and ``optimizer``, unless None) into any layout.

    Every file DCP reads is read once and checked against its ``records`` (the manifest's).
    """
    from torch.distributed.checkpoint.state_dict_loader import load

    model_state, optimizer_state = states_to_save(model, optimizer, False, owner)
    with _dcp_errors(where, directory):
        load({"model": model_state}, storage_reader=_reader(directory, DCP_MODEL, records, where))
        if optimizer_state is not None:
            reader = _reader(directory, DCP_OPTIMIZER, records, where)
            load({"optimizer": optimizer_state}, storage_reader=reader)
    load_states(model, model_state, optimizer, optimizer_state, False, owner)


@contextlib.contextmanager
def _dcp_errors(where: str, directory: Path) -> Iterator[None]:
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            yield
    except TrainingStateError:
        raise
    except Exception as error:  # DCP wraps what a process raised (CheckpointException)
        cause = _training_state_error(error)
        if cause is not None:
            raise cause from error
        raise TrainingStateError(
            f"{where}: could not load the sharded state in {str(directory)!r}: {error}"
        ) from error


def _training_state_error(error: BaseException) -> TrainingStateError | None:
    failures = getattr(error, "failures", None)
    found = list(failures.values()) if isinstance(failures, dict) else []
    for failure in [error, *found]:
        seen: BaseException | None = failure[0] if isinstance(failure, tuple) else failure
        while seen is not None:
            if isinstance(seen, TrainingStateError):
                return seen
            seen = seen.__cause__ or seen.__context__
    return None


def read_dcp_metadata(
    directory: Path, records: Mapping[str, Any], where: str, folder: str = DCP_MODEL
) -> Any:
    """The ``Metadata`` of a DCP folder of a training state, from its verified bytes."""
    return _reader(directory, folder, records, where).read_metadata()


def _reader(directory: Path, folder: str, records: Mapping[str, Any], where: str) -> Any:
    """A DCP reader of ``directory/folder`` whose every byte is checked against ``records``."""
    from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class VerifiedFiles(FileSystem):
        """DCP's files, each read once and checked against the manifest."""

        @contextlib.contextmanager
        def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
            if mode != "rb":
                raise TrainingStateError(f"{where}: a training state is only read.")
            name = Path(path).relative_to(directory).as_posix()
            if name not in records:
                raise TrainingStateError(
                    f"{where}: {str(path)!r} is not listed in the manifest of "
                    f"{str(directory)!r}; nothing unchecked is loaded. Resume from another state."
                )
            yield io.BytesIO(read_verified(Path(path), records[name], where))

    class VerifiedReader(FileSystemReader):
        """DCP's reader, on verified bytes, with ``.metadata`` unpickled restrictedly."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                metadata = _MetadataUnpickler(f, where).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    reader = VerifiedReader(directory / folder)
    reader.fs = VerifiedFiles()
    return reader


_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_PATHS = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``Metadata``: its classes, ``torch.Size``, dtypes and layouts, paths."""

    def __init__(self, handle: Any, where: str) -> None:
        super().__init__(handle)
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        import torch.serialization

        found: Any = None
        if module in _DCP_MODULES and not name.startswith("__"):
            candidate = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(candidate, type) and candidate.__module__ == module:
                found = candidate
        elif module == "torch" and (name == "Size" or _torch_constant(name)):
            found = getattr(torch, name)
        elif (module, name) == ("torch.serialization", "_get_layout"):
            found = torch.serialization._get_layout
        elif module == "pathlib" and name in _PATHS:
            found = getattr(pathlib, name)
        if found is None:
            raise TrainingStateError(
                f"{self._where}: a DCP .metadata file of this training state refers to "
                f"{module}.{name}, which is not one of DCP's metadata classes; it was not "
                "loaded (nothing in a training state can run code). Resume from another state."
            )
        return found


def _torch_constant(name: str) -> bool:
    value = getattr(torch, name, None)
    return isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
