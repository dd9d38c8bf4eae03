"""Whether a saved model, optimizer or scheduler state fits the trainer's (checked first)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["SCHEDULER_KEYS", "misfit", "model_misfit", "trainable_parameters"]

SCHEDULER_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})
"""Settings torch's learning-rate schedulers add to an optimizer's parameter groups."""


def trainable_parameters(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """A PEFT model's trainable (adapter) parameters by plain key; ``None``: not a PEFT model.

    A training state of a ``peft.PeftModel`` holds these only: its frozen base is the one the
    user builds again, and its buffers are the base's, not trained. PEFT is never imported here:
    a model can only be a ``PeftModel`` once ``peft`` is.
    """
    peft = sys.modules.get("peft")
    peft_model = getattr(peft, "PeftModel", None)
    if not isinstance(peft_model, type):
        return None
    inner: Any = model
    while not isinstance(inner, peft_model):  # under DDP's and torch.compile's wrappers
        wrapped = getattr(inner, "module", None)
        inner = getattr(inner, "_orig_mod", None) if wrapped is None else wrapped
        if not isinstance(inner, nn.Module):
            return None
    return {
        _plain_key(key): parameter
        for key, parameter in model.named_parameters()
        if parameter.requires_grad
    }


def model_misfit(
    model: nn.Module,
    saved: Mapping[str, tuple[int, ...]],
    tensors: Mapping[str, Any] | None = None,
) -> str:
    """Describe how parameter names and shapes ``saved`` differ from ``model``'s, or ''.

    Keys are compared without wrapper prefixes; a tied weight saved once is not missing.
    ``tensors``: the model's tensors with their full shapes, for a sharded model.
    """
    tensors = model.state_dict() if tensors is None else tensors
    current = {_plain_key(key): tensor for key, tensor in tensors.items()}
    shapes = {_plain_key(key): tuple(shape) for key, shape in saved.items()}
    present = {_storage(tensor) for key, tensor in current.items() if key in shapes}
    problems = [f"unexpected {key}" for key in sorted(set(shapes) - set(current))]
    problems += [
        f"missing {key}"
        for key in sorted(set(current) - set(shapes))
        if _storage(current[key]) not in present  # tied weights are saved once
    ]
    problems += [
        f"{key}: saved {list(shapes[key])}, model {list(current[key].shape)}"
        for key in sorted(set(shapes) & set(current))
        if shapes[key] != tuple(current[key].shape)
    ]
    return "; ".join(problems[:8]) + (" ..." if len(problems) > 8 else "")


def misfit(name: str, target: Any, state: Any, tensors: Mapping[str, Any] | None = None) -> str:
    """Describe why ``state`` does not fit ``target`` (a model, optimizer or scheduler), or ''.

    ``tensors``: a sharded model's tensors with their full shapes (see ``model_misfit``).
    """
    if name == "model":
        shapes = {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}
        return model_misfit(target, shapes, tensors)
    current = target.state_dict()
    if name == "optimizer":
        saved_groups, groups = state.get("param_groups", []), current["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"]) for g in groups]:
            return "its parameter groups hold other numbers of parameters"
        # settings this optimizer lacks mean another kind (fewer are fine: an older torch's;
        # so are those a learning-rate scheduler adds to the groups)
        foreign = {key for group in saved_groups for key in group} - SCHEDULER_KEYS
        foreign -= {key for group in groups for key in group}
        if foreign:
            return (
                f"it was saved by another kind of optimizer (with settings {sorted(foreign)}, "
                f"which this trainer's {type(target).__name__} does not have); pass "
                "load_optimizer=False to load the weights only"
            )
        return ""
    translate = getattr(target, "translate_state_dict", None)  # pytorch_accel's schedulers
    if callable(translate) and isinstance(state, Mapping):
        state = translate(state)
    if isinstance(state, Mapping) and set(state) != set(current):
        return (
            f"it was saved by another kind of scheduler (keys {sorted(state)[:6]}) than this "
            f"trainer's {type(target).__name__}; pass load_scheduler=False"
        )
    return ""


def _plain_key(key: str) -> str:
    """A state-dict key without the DDP (``module.``) and ``torch.compile`` prefixes."""
    return key.removeprefix("module.").replace("_orig_mod.", "")


def _storage(tensor: Any) -> int:
    """Where a tensor's data (a shard's, for a sharded one) starts, to find tied weights."""
    source = getattr(tensor, "_local_tensor", tensor)  # a DTensor's shard (FSDP2)
    if hasattr(source, "local_shards"):  # a ShardedTensor (FSDP1)
        shards = source.local_shards()
        source = shards[0].tensor if shards else None
    return int(source.data_ptr()) if isinstance(source, torch.Tensor) else id(tensor)
