"""Activation (gradient) checkpointing as one switch: less memory for a second forward pass.

``enable_activation_checkpointing(model)`` turns it on for a Hugging Face model through the
model's own method; ``enable_activation_checkpointing(model, modules=(Block,))`` for any model,
by the class of the blocks to checkpoint. Call it before ``Trainer(...)``: the trainer then
trains the model as usual. Each checkpointed block keeps only its inputs during the forward
pass and runs again in the backward pass (``torch.utils.checkpoint``, non-reentrant, random
states replayed), so gradients are those without checkpointing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["enable_activation_checkpointing"]

_CHECKPOINTED: dict[type[nn.Module], type[nn.Module]] = {}


def enable_activation_checkpointing(
    model: nn.Module, modules: type[nn.Module] | Iterable[type[nn.Module]] | None = None
) -> list[str]:
    """Checkpoint the activations of ``model``'s blocks: recompute them in the backward pass.

    Args:
        model: The model, before it is given to the ``Trainer`` (before FSDP shards it).
        modules: The block classes to checkpoint (e.g. ``(TransformerBlock,)``); each module
            of ``model`` of one of these classes, outside another checkpointed one, recomputes
            its forward pass in the backward pass. Its parameter names are unchanged. ``None``
            (a Hugging Face or PEFT model): the model's own
            ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before
            ``transformers`` 5), non-reentrant.

    Returns:
        The names of the checkpointed modules (``[]`` when the model's own method did it).

    Raises:
        TypeError: If ``modules`` holds something other than ``nn.Module`` subclasses.
        ValueError: If ``modules`` is ``None`` and the model has no checkpointing method of its
            own, or no module of ``model`` is of the classes given.

    Example:
        ```python
        enable_activation_checkpointing(gpt2)  # a transformers model
        enable_activation_checkpointing(model, modules=(Block,))  # any model
        trainer = Trainer(model, loss_func, optimizer)
        ```
    """
    if modules is None:
        _enable_own_method(model)
        return []
    classes = (modules,) if isinstance(modules, type) else tuple(modules)
    wrong = [cls for cls in classes if not (isinstance(cls, type) and issubclass(cls, nn.Module))]
    if wrong or not classes:
        raise TypeError(
            f"enable_activation_checkpointing: modules={modules!r} must be nn.Module subclasses "
            "(the classes of the blocks to checkpoint, e.g. modules=(TransformerBlock,))."
        )
    done: list[str] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") or outer == "" for outer in done)
        if isinstance(module, classes) and not inside:
            if type(module) not in _CHECKPOINTED.values():
                module.__class__ = _checkpointed_class(type(module))
            done.append(name)
    if not done:
        names = ", ".join(cls.__name__ for cls in classes)
        raise ValueError(
            f"enable_activation_checkpointing: no module of the model is a {names} "
            f"(modules={modules!r}); pass the classes of the model's blocks, e.g. "
            f"{type(model).__name__}'s layers: "
            f"{sorted({type(child).__name__ for child in model.modules()})[:8]}."
        )
    return done


def _enable_own_method(model: nn.Module) -> None:
    """A Hugging Face model's own switch (a PEFT model reaches its base model's)."""
    for method_name, kwargs_name in (
        ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
        ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
    ):
        method = getattr(model, method_name, None)
        if callable(method):
            method(**{kwargs_name: {"use_reentrant": False}})
            return
    raise ValueError(
        f"enable_activation_checkpointing: a {type(model).__name__} has no checkpointing method "
        "of its own (activation_checkpointing_enable, as transformers models have); pass the "
        "classes of the blocks to checkpoint, e.g. modules=(TransformerBlock,)."
    )


def _checkpointed_class(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of ``cls`` whose forward pass is checkpointed (one per class, reused)."""
    if cls not in _CHECKPOINTED:

        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            run = cls.forward.__get__(self)
            if not torch.is_grad_enabled():  # evaluation and prediction: nothing to save
                return run(*args, **kwargs)
            return checkpoint(run, *args, use_reentrant=False, **kwargs)

        subclass = type(f"Checkpointed{cls.__name__}", (cls,), {"forward": forward})
        subclass.__module__ = cls.__module__
        subclass.__qualname__ = f"Checkpointed{cls.__qualname__}"
        _CHECKPOINTED[cls] = subclass
    return _CHECKPOINTED[cls]
