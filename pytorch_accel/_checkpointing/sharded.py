"""Full model and optimizer states of a model sharded by FSDP, and loading them back.

A checkpoint file holds full (gathered) states in the layout of an unsharded run: the model's
keys without wrapper prefixes, the optimizer's parameters numbered in the order of its
parameter groups (``torch.optim.Optimizer.state_dict``). So a file saved under FSDP loads in
one process and the other way round. Gathering and scattering go through
``torch.distributed.checkpoint.state_dict``: every process must call these functions, at the
same point. torch's state-dict module is imported when first needed (it takes about a
second to import).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

__all__ = [
    "fsdp_version",
    "full_optimizer_state",
    "is_sharded",
    "load_full_states",
    "sharded_model_tensors",
]


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
    """The optimizer's full state on the main process (at least), numbered as unsharded.

    Args:
        model: The FSDP model.
        optimizer: The trainer's optimizer (accelerate's wrapper or the torch optimizer).
    """
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
    """Load full states (as ``full_optimizer_state`` numbers them) into the sharded objects.

    Every process passes the whole state; each keeps its shard.
    """
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
