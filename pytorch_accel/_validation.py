"""Argument checks that give a clear error at the entry point.

Every error names the call and argument, the value received and the fix.
"""

from __future__ import annotations

import contextlib
import numbers
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, NoReturn

import torch

__all__ = [
    "check_batch_output",
    "check_callable",
    "check_mapping",
    "check_non_negative_number",
    "check_optimizer",
    "check_positive_int",
    "check_positive_number",
    "check_sized_dataset",
    "explain_backward_failure",
    "fail",
    "inputs_and_targets",
    "shape_mismatches_raise",
]


def fail(
    error: type[Exception], where: str, name: str, value: object, expected: str, fix: str
) -> NoReturn:
    """Raise ``error`` with the standard message: where, what was received, and the fix.

    Args:
        error: The exception type to raise (``TypeError`` or ``ValueError``).
        where: The entry point, e.g. ``"Trainer.train"``.
        name: The argument name.
        value: The value received.
        expected: What the argument must be.
        fix: How to fix the call.

    Raises:
        Exception: Always, of type ``error``.
    """
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise error(f"{where}: {name} must be {expected}, got {shown} ({type(value).__name__}). {fix}")


def check_positive_int(where: str, name: str, value: object, *, allow_none: bool = False) -> None:
    """Check that ``value`` is an int >= 1 (and not a bool), or None when allowed.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        allow_none: Whether ``None`` is accepted.

    Raises:
        TypeError: If the value is not an int.
        ValueError: If the value is < 1.
    """
    if value is None and allow_none:
        return
    expected = "a positive int" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(TypeError, where, name, value, expected, f"Pass an int, e.g. {name}=1.")
    if value < 1:
        fail(ValueError, where, name, value, expected, f"Pass {name} >= 1.")


def check_positive_number(
    where: str, name: str, value: object, *, allow_none: bool = False
) -> None:
    """Check that ``value`` is a real number > 0, or None when allowed.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        allow_none: Whether ``None`` is accepted.

    Raises:
        TypeError: If the value is not a real number.
        ValueError: If the value is <= 0.
    """
    if value is None and allow_none:
        return
    expected = "a positive number" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, f"Pass a float, e.g. {name}=1.0.")
    if not float(value) > 0:
        fail(ValueError, where, name, value, expected, f"Pass {name} > 0, or None to disable.")


def check_non_negative_number(where: str, name: str, value: object, fix: str) -> None:
    """Check that ``value`` is a real number >= 0 (infinity included), not a bool or NaN.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        fix: How to fix it, e.g. ``"Set trainer.progress_interval = 0.05."``.

    Raises:
        TypeError: If the value is not a real number.
        ValueError: If the value is negative or NaN.
    """
    expected = "a number >= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, fix)
    if not float(value) >= 0:
        fail(ValueError, where, name, value, expected, fix)


def check_optimizer(where: str, name: str, value: object, fix: str) -> torch.optim.Optimizer:
    """Check that ``value`` is a ``torch.optim.Optimizer``, and return it as one.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        fix: How to fix the call.

    Returns:
        ``value``.

    Raises:
        TypeError: If it is not an optimizer.
    """
    if not isinstance(value, torch.optim.Optimizer):
        fail(TypeError, where, name, value, "a torch.optim.Optimizer", fix)
    return value


def check_callable(where: str, name: str, value: object, fix: str) -> None:
    """Check that ``value`` is callable or None.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.
        fix: How to fix the call.

    Raises:
        TypeError: If the value is neither None nor callable.
    """
    if value is not None and not callable(value):
        fail(TypeError, where, name, value, "a callable or None", fix)


def check_mapping(where: str, name: str, value: object) -> None:
    """Check that ``value`` is a mapping (e.g. a dict of keyword arguments) or None.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        value: The value to check.

    Raises:
        TypeError: If the value is neither None nor a mapping.
    """
    if value is not None and not isinstance(value, Mapping):
        fail(TypeError, where, name, value, "a dict or None", f"Pass e.g. {name}={{}}.")


def check_sized_dataset(where: str, name: str, dataset: object) -> int:
    """Check that ``dataset`` has a length of at least one sample, and return it.

    Args:
        where: The entry point, for the message.
        name: The argument name.
        dataset: The dataset to check.

    Returns:
        The number of samples.

    Raises:
        TypeError: If the dataset has no ``__len__``.
        ValueError: If the dataset is empty.
    """
    if not isinstance(dataset, Sized):
        fail(
            TypeError,
            where,
            name,
            dataset,
            "a map-style dataset with __len__",
            "Wrap the data in a torch.utils.data.Dataset that defines __len__.",
        )
    size = len(dataset)
    if size == 0:
        fail(ValueError, where, name, dataset, "non-empty", "Pass a dataset with samples.")
    return size


def callable_name(fn: Callable[..., object]) -> str:
    """Return a readable name for a callable, for messages."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def check_batch_output(batch_output: Any, method: str) -> dict[str, Any]:
    """Return a step method's ``batch_output`` if it is a dict with ``loss`` and ``batch_size``.

    Args:
        batch_output: What the step method returned.
        method: The step method's name, e.g. ``"calculate_train_batch_loss"``.

    Returns:
        ``batch_output`` itself.

    Raises:
        TypeError: If it is not a mapping.
        ValueError: If ``loss`` or ``batch_size`` is missing.
    """
    if type(batch_output) is dict and "loss" in batch_output and "batch_size" in batch_output:
        return batch_output
    if not isinstance(batch_output, Mapping):
        raise TypeError(
            f"Trainer.{method} must return a dict with keys 'loss', 'model_outputs' and "
            f"'batch_size', got {type(batch_output).__name__}. Return e.g. "
            "{'loss': loss, 'model_outputs': outputs, 'batch_size': targets.size(0)}."
        )
    missing = [key for key in ("loss", "batch_size") if key not in batch_output]
    if missing:
        raise ValueError(
            f"Trainer.{method} returned a dict without {missing} (keys: {sorted(batch_output)}). "
            "Return e.g. {'loss': loss, 'model_outputs': outputs, 'batch_size': targets.size(0)}."
        )
    return batch_output  # type: ignore[return-value]


def explain_backward_failure(loss: object, method: str, error: Exception) -> None:
    """Raise a clear error if the loss itself made the backward pass fail; else return.

    Called only after a failure, so the steps that succeed pay nothing for the check.

    Args:
        loss: The loss the step method returned.
        method: The step method's name.
        error: The error the backward pass raised.

    Raises:
        TypeError: If the loss is not a tensor (a Python number from ``loss.item()``).
        ValueError: If the loss does not require grad.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"Trainer.{method} returned a loss of type {type(loss).__name__} ({loss!r}); it must "
            "be the loss tensor, to back-propagate and track on the device. Return the tensor "
            "itself, not loss.item()."
        ) from error
    if not loss.requires_grad:
        raise ValueError(
            f"Trainer.{method} returned a loss that does not require grad ({loss!r}), so there "
            "is nothing to back-propagate: the model's parameters are all frozen "
            "(requires_grad=False), or the loss was computed under torch.no_grad() or from "
            "detached values. Unfreeze some parameters, or compute the loss from the model's "
            "outputs."
        ) from error


def inputs_and_targets(batch: Any, method: str) -> tuple[Any, Any]:
    """Return ``batch[0], batch[1]``: the layout the default step methods read.

    Args:
        batch: A batch from the dataloader.
        method: The step method reading it, for the message.

    Raises:
        TypeError: If the batch is not a tuple or list of at least two items.
    """
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    layout = f"a {type(batch).__name__}" + (
        f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""
    )
    raise TypeError(
        f"Trainer.{method}: the default step reads batches as (inputs, targets), got {layout}. "
        f"Return (inputs, targets) from the dataset (or a collate_fn), or override {method} "
        "for other layouts (dicts, inputs only, several inputs)."
    )


_BROADCAST_WARNING = r"Using a target size .* that is different to the input size"
"""The start of the warning torch's element-wise losses give when targets broadcast."""


@contextlib.contextmanager
def shape_mismatches_raise(where: str) -> Iterator[None]:
    """Turn torch's warning that a loss broadcast targets of another shape into a ValueError.

    ``MSELoss`` and the other element-wise losses compare outputs of shape ``(B, 1)`` with
    targets of shape ``(B,)`` as a ``(B, B)`` matrix: the run trains on the wrong loss, with
    only a warning. Inside this block the warning is an error, raised at the first batch.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=_BROADCAST_WARNING, category=UserWarning)
        try:
            yield
        except UserWarning as warning:
            if not re.match(_BROADCAST_WARNING, str(warning)):
                raise
            raise ValueError(
                f"{where}: the loss function got outputs and targets of different shapes, which "
                f"it broadcasts into a wrong loss ({warning}). Give the targets the outputs' "
                "shape (e.g. targets.view_as(outputs) in the dataset or a collate_fn), or "
                "override calculate_train_batch_loss / calculate_eval_batch_loss."
            ) from warning
