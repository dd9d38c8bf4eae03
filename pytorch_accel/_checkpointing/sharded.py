"""Full model and optimizer states of a model sharded by FSDP, and loading them back.

A checkpoint file holds full states in the layout of an unsharded run (the optimizer's
parameters numbered as ``torch.optim.Optimizer.state_dict`` does), so a file saved under FSDP
loads in one process and the other way round. Every process must call these functions at the
same point. torch's state-dict module, slow to import, is imported when first needed.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._checkpointing.files import load_pickled

__all__ = [
    "fsdp_version",
    "full_optimizer_state",
    "is_sharded",
    "load_full_states",
    "saved_sharded",
    "sharded_model_tensors",
    "weights_across_layouts",
]

_FULL_FSDP_MODEL = "pytorch_model_fsdp.bin"
_SHARDED_FSDP_MODEL = "pytorch_model_fsdp_0"


def is_sharded(accelerator: Accelerator) -> bool:
    """Whether the accelerator shards the model with FSDP (version 1 or 2)."""
    return accelerator.distributed_type == DistributedType.FSDP  # type: ignore[no-any-return]


def fsdp_version(accelerator: Accelerator) -> int | None:
    """The FSDP version the accelerator shards with (``None``: not sharded by FSDP)."""
    if not is_sharded(accelerator):
        return None
    return int(accelerator.state.fsdp_plugin.fsdp_version)


def sharded_model_tensors(model: nn.Module) -> dict[str, Any]:
    """The sharded model's tensors by plain key, each with its full shape (no gathering)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))


def full_optimizer_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's full state on the main process (at least), numbered as unsharded."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    inner = getattr(optimizer, "optimizer", optimizer)
    # gathered to the main process's CPU memory, or on every process when the parameters are
    # on the CPU already (where FSDP1's offloading gather mixes up the states on gloo: its
    # exp_avg came back as exp_avg_sq)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_cpu)
    state: Any = get_optimizer_state_dict(model, inner, options=options)
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
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, dict(model_state), options=options)
    if optimizer is None or optimizer_state is None:
        return
    inner = getattr(optimizer, "optimizer", optimizer)
    local: Any = get_optimizer_state_dict(model, inner, options=StateDictOptions())
    names = {number: key for key, number in _parameter_numbers(local["param_groups"]).items()}
    by_name: Any = {
        "state": {names[number]: value for number, value in optimizer_state["state"].items()},
        "param_groups": [
            {**group, "params": [names[number] for number in group["params"]]}
            for group in optimizer_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, inner, by_name, options=options)


def _parameter_numbers(groups: list[dict[str, Any]]) -> dict[Any, int]:
    """Number the parameters of the groups in order, as ``Optimizer.state_dict`` does."""
    keys = [key for group in groups for key in group["params"]]
    return {key: number for number, key in enumerate(keys)}


def saved_sharded(directory: Path) -> bool | None:
    """Whether a training state's weights were saved by FSDP (``None``: no weights in it)."""
    if (directory / _FULL_FSDP_MODEL).is_file() or (directory / _SHARDED_FSDP_MODEL).is_dir():
        return True
    if (directory / "model.safetensors").is_file():
        return False
    return None


@contextlib.contextmanager
def weights_across_layouts(accelerator: Accelerator, directory: Path, where: str) -> Iterator[None]:
    """Load the model and optimizer of a state saved sharded into an unsharded run, or back.

    Where the layouts differ, the weights and the optimizer's state (if accelerate would load
    it) are loaded here, through ``torch.distributed.checkpoint.state_dict``, and hidden from
    ``accelerator.load_state`` inside the block. Every process must enter the block.
    """
    sharded_now, sharded_then = is_sharded(accelerator), saved_sharded(directory)
    if sharded_then is None or sharded_then == sharded_now:
        yield
        return
    models, optimizers = accelerator._models, accelerator._optimizers
    model = accelerator.unwrap_model(models[0])
    optimizer = optimizers[0] if optimizers else None
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        if sharded_then:
            _load_fsdp_saved(model, optimizer, directory, where)
        else:
            _load_unsharded_saved(model, optimizer, directory, where)
    kept = list(models), list(optimizers)
    models.clear()
    optimizers.clear()
    try:
        yield
    finally:
        models[:], optimizers[:] = kept


def _load_fsdp_saved(model: nn.Module, optimizer: Any, directory: Path, where: str) -> None:
    """Load FSDP's files (a full or a sharded state, keyed by name) into an unsharded model."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    inner = getattr(optimizer, "optimizer", optimizer)
    if (directory / _FULL_FSDP_MODEL).is_file():
        model_state = load_pickled(directory / _FULL_FSDP_MODEL, where)
        set_model_state_dict(model, model_state, options=options)
        if inner is not None:
            state = load_pickled(directory / "optimizer.bin", where)
            set_optimizer_state_dict(model, inner, state, options=options)
        return
    model_state = get_model_state_dict(model, options=options)
    saved = str(directory / _SHARDED_FSDP_MODEL)
    state_dict_loader.load({"model": model_state}, checkpoint_id=saved)
    set_model_state_dict(model, model_state, options=options)
    if inner is not None:
        state = get_optimizer_state_dict(model, inner, options=options)
        state_dict_loader.load({"optimizer": state}, checkpoint_id=str(directory / "optimizer_0"))
        set_optimizer_state_dict(model, inner, state, options=options)


def _load_unsharded_saved(model: nn.Module, optimizer: Any, directory: Path, where: str) -> None:
    """Load ``model.safetensors`` and the numbered ``optimizer.bin`` into a sharded model."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        model_state = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = load_pickled(directory / "optimizer.bin", where)
    load_full_states(model, model_state, optimizer, optimizer_state)
