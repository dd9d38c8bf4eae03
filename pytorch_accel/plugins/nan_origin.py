"""Where a non-finite loss starts: the first module whose output was not finite.

A plugin of ``TerminateOnNaNCallback(report_origin=True)``, imported only when it is asked for
(the callback keeps each step's random state and reads the loss before the backward pass,
through its step events). The batch whose loss is not finite is run
through the model again, in training mode, before the backward pass has changed any weight,
under forward hooks that count the NaN and infinite values of every module's output; the
first module to finish with one (an inner module before the module around it) is where it
started. The re-run changes nothing: the random state is the step's own (dropout draws the
same masks) and put back after, and the buffers it updates (batch-norm statistics) are copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import DistributedType
from torch import nn

from pytorch_accel._batches import inputs_and_targets
from pytorch_accel._dict_batches import dict_batch_loss, predictions_of

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["RandomState", "nan_origin_report", "non_finite_loss_origin"]


@dataclass
class RandomState:
    """The CPU and device random states at the start of a training step."""

    cpu: torch.Tensor
    device: torch.Tensor | None

    @classmethod
    def capture(cls, device: torch.device) -> RandomState:
        """The states now (the device's from its generator: no host-device synchronisation)."""
        on_cuda = device.type == "cuda"
        return cls(torch.get_rng_state(), torch.cuda.get_rng_state(device) if on_cuda else None)

    def restore(self, device: torch.device) -> None:
        """Put the states back."""
        torch.set_rng_state(self.cpu)
        if self.device is not None:
            torch.cuda.set_rng_state(self.device, device)


def non_finite_loss_origin(
    trainer: TrainerLike, batch: Any, loss: Any, random_state: RandomState | None
) -> str | None:
    """Say when the batch ``loss`` was not finite and where it started; ``None`` if it is finite.

    One host read of the loss. Arguments as ``nan_origin_report``'s; ``loss``: the batch's.
    """
    if bool(torch.isfinite(torch.as_tensor(loss)).all()):
        return None
    value = torch.as_tensor(loss).detach().float()
    text = str(value.item()) if value.numel() == 1 else "not finite"
    where = (
        f"the loss was {text} in epoch {trainer.run_history.current_epoch} after "
        f"{trainer.num_updates} updates, on process {trainer.accelerator.process_index}"
    )
    return f"{where}: {nan_origin_report(trainer, batch, random_state)}"


def nan_origin_report(trainer: TrainerLike, batch: Any, random_state: RandomState | None) -> str:
    """Say where the non-finite loss of ``batch`` starts, re-running its forward pass.

    Args:
        trainer: The trainer, in the middle of the step whose loss is not finite.
        batch: The step's batch, as the dataloader produced it.
        random_state: The random state at the start of the step, to draw the same dropout.

    Returns:
        E.g. ``"first non-finite output: encoder.1 (Linear), 3 of 64 values NaN; the batch is
        finite"``.
    """
    inputs = _batch_description(batch)
    if trainer.accelerator.distributed_type == DistributedType.FSDP:
        return f"re-running the forward pass is not supported with FSDP; {inputs}"
    model = trainer.accelerator.unwrap_model(trainer.model)
    bad_weight = next(
        (name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())), None
    )
    if bad_weight is not None:
        return (
            f"the weights were already non-finite before this step ({bad_weight!r} first): an "
            f"earlier update applied a non-finite gradient, from a finite loss (look for "
            f"infinite inputs or a backward pass that overflows) or from another process's "
            f"batch (that process reports it); {inputs}"
        )
    try:
        found, loss = _rerun(trainer, model, batch, random_state)
    except Exception as error:  # a custom step's layout: say so rather than fail the run
        return (
            f"the forward pass could not be re-run as the default step reads the batch "
            f"({type(error).__name__}: {error}); {inputs}"
        )
    if found is not None:
        return f"first non-finite output: {found}; {inputs}"
    if loss is not None and not bool(torch.isfinite(torch.as_tensor(loss)).all()):
        return (
            f"every module's output was finite, the loss computed from them was not (the loss "
            f"function); {inputs}"
        )
    return (
        f"the re-run's outputs and loss were finite: the non-finite value did not come back "
        f"(a non-deterministic operation, or a custom step computing more than the default "
        f"one); {inputs}"
    )


def _rerun(
    trainer: TrainerLike, model: nn.Module, batch: Any, random_state: RandomState | None
) -> tuple[str | None, Any]:
    """Run ``batch`` through the unwrapped model under hooks; the first bad module, the loss.

    Not the prepared model: a DDP wrapper would broadcast buffers, a collective the other
    processes are not in.
    """
    found: list[str] = []
    modules = list(model.named_modules())
    loss_func = trainer.loss_func
    if isinstance(loss_func, nn.Module):
        modules.append(("loss_func", loss_func))

    def hook(name: str) -> Any:
        def check(module: nn.Module, args: Any, output: Any) -> None:
            if not found:
                counts = _non_finite(output)
                if counts is not None:
                    shown = name or "the model"
                    found.append(f"{shown} ({type(module).__name__}), {counts}")

        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in modules]
    # the re-run updates copies of the buffers (batch-norm statistics): the step's own are
    # saved for its backward pass, which an update in place would break
    buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}

    def forward(*args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(model, buffers, args, kwargs)

    device = trainer.device
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices, device_type=device.type):
            if random_state is not None:
                random_state.restore(device)
            loss = _default_step(forward, loss_func, batch)
    finally:
        for handle in handles:
            handle.remove()
    return (found[0] if found else None), loss


def _default_step(model: Callable[..., Any], loss_func: Any, batch: Any) -> Any:
    """The loss as the default ``calculate_train_batch_loss`` computes it, from ``model``."""
    if isinstance(batch, Mapping):
        return dict_batch_loss(model, loss_func, batch, "calculate_train_batch_loss")["loss"]
    inputs, targets = inputs_and_targets(batch, "calculate_train_batch_loss")
    predictions = predictions_of(model(inputs))
    return None if loss_func is None else loss_func(predictions, targets)


def _tensors(value: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating-point tensors in ``value`` (nested tuples, lists, dicts), with their index."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield "", value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            for inner, tensor in _tensors(item):
                yield f"[{key!r}]{inner}", tensor
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            for inner, tensor in _tensors(item):
                yield f"[{index}]{inner}", tensor


def _non_finite(value: Any) -> str | None:
    """``"3 of 64 values NaN"`` (and how many infinite) for ``value``'s tensors, or ``None``."""
    nans = infs = total = 0
    for _, tensor in _tensors(value):
        nans += int(torch.isnan(tensor).sum())
        infs += int(torch.isinf(tensor).sum())
        total += tensor.numel()
    if not nans and not infs:
        return None
    if not nans:
        return f"{infs} of {total} values infinite"
    return f"{nans} of {total} values NaN" + (f", {infs} infinite" if infs else "")


def _batch_description(batch: Any) -> str:
    """Whether the batch's floating-point tensors are finite, and which are not."""
    bad = []
    for key, tensor in _tensors(batch):
        counts = _non_finite(tensor)
        if counts is not None:
            bad.append(f"batch{key}: {counts}")
    if not bad:
        return "the batch is finite"
    return "the batch itself is not finite (" + "; ".join(bad) + ")"
