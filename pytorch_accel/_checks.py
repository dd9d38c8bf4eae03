"""The value checks of every entry point: one message format (``fail``), one check per rule.

Scalars, callables, mappings, optimizers and sized datasets; the placeholder-aware counts of
the schedulers; and what step methods return (batch outputs, a loss that cannot
back-propagate, targets a loss would broadcast, predictions that cannot be concatenated).
The trainer's entry points and their data are checked with these in ``_entry_checks``.

Every check takes ``where`` (the entry point, e.g. ``"Trainer.train"``), ``name`` (the
argument) and ``value``, and raises ``TypeError`` for a value of the wrong type and
``ValueError`` for one out of range; ``allow_none`` accepts ``None`` and ``fix`` is the advice.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from typing import Any, NoReturn

import torch

from pytorch_accel.placeholders import contains_placeholder

__all__ = [
    "callable_name",
    "check_batch_output",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_count",
    "check_fraction",
    "check_group_bound",
    "check_mapping",
    "check_metric_name",
    "check_number",
    "check_optimizer",
    "check_path",
    "check_positive_int",
    "check_sized_dataset",
    "explain_backward_failure",
    "fail",
    "shape_mismatches_raise",
]


def fail(
    error: type[Exception], where: str, name: str, value: object, expected: str, fix: str
) -> NoReturn:
    """Raise ``error``: where, the argument, what it must be (``expected``), the value, the fix."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise error(f"{where}: {name} must be {expected}, got {shown} ({type(value).__name__}). {fix}")


def check_positive_int(where: str, name: str, value: object, *, allow_none: bool = False) -> None:
    """Check that ``value`` is an int >= 1 (and not a bool), or None when allowed."""
    if not (value is None and allow_none):
        _check_int(where, name, value, 1, "a positive int" + (" or None" if allow_none else ""))


def check_number(
    where: str,
    name: str,
    value: object,
    *,
    strict: bool = False,
    finite: bool = False,
    allow_none: bool = False,
    expected: str | None = None,
    fix: str | None = None,
) -> None:
    """Check that ``value`` is a real number >= 0 (> 0 if ``strict``), not a bool or NaN.

    The one check of real numbers (learning rates, thresholds, intervals, clipping values);
    ``finite`` rejects infinity, ``expected`` and ``fix`` replace the default wording.
    """
    if value is None and allow_none:
        return
    bound = "> 0" if strict else ">= 0"
    if expected is None:
        expected = f"a {'finite ' if finite else ''}number {bound}"
        expected += " or None" if allow_none else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, fix or f"Pass a float, e.g. {name}=0.1.")
    number = float(value)
    if not (number > 0 if strict else number >= 0) or (finite and not math.isfinite(number)):
        fail(ValueError, where, name, value, expected, fix or f"Pass {name} {bound}.")


def check_optimizer(where: str, name: str, value: object, fix: str) -> torch.optim.Optimizer:
    """Check that ``value`` is a ``torch.optim.Optimizer``, and return it as one."""
    if not isinstance(value, torch.optim.Optimizer):
        fail(TypeError, where, name, value, "a torch.optim.Optimizer", fix)
    return value


def check_callable(where: str, name: str, value: object, fix: str) -> None:
    """Check that ``value`` is callable or None."""
    if value is not None and not callable(value):
        fail(TypeError, where, name, value, "a callable or None", fix)


def check_mapping(where: str, name: str, value: object) -> None:
    """Check that ``value`` is a mapping (e.g. a dict of keyword arguments) or None."""
    if value is not None and not isinstance(value, Mapping):
        fail(TypeError, where, name, value, "a dict or None", f"Pass e.g. {name}={{}}.")


def check_sized_dataset(where: str, name: str, dataset: object) -> None:
    """Check that ``dataset`` has ``__len__`` and at least one sample."""
    if not isinstance(dataset, Sized):
        fail(
            TypeError,
            where,
            name,
            dataset,
            "a map-style dataset with __len__",
            "Wrap the data in a torch.utils.data.Dataset that defines __len__.",
        )
    if len(dataset) == 0:
        fail(ValueError, where, name, dataset, "non-empty", "Pass a dataset with samples.")


def callable_name(fn: Callable[..., object]) -> str:
    """Return a readable name for a callable, for messages."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def check_batch_output(batch_output: Any, method: str) -> dict[str, Any]:
    """Return a step method's ``batch_output`` if it is a dict with ``loss`` and ``batch_size``."""
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
    """Raise a clear error if the loss ``method`` returned made the backward pass fail.

    Called only after a failure (``error``), so the steps that succeed pay nothing for it.
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"Trainer.{method} returned a loss of type {type(loss).__name__} ({loss!r}); it must "
            "be the loss tensor, to back-propagate and track on the device. Return the tensor "
            "itself, not loss.item()."
        ) from error
    if loss.numel() != 1:
        raise ValueError(
            f"Trainer.{method} returned a loss of shape {tuple(loss.shape)}, not one number: "
            "back-propagating needs the batch's loss as a single value (torch: \"grad can be "
            'implicitly created only for scalar outputs"). Reduce it, e.g. loss.mean() (or '
            "reduction='mean' in the loss function)."
        ) from error
    if not loss.requires_grad:
        raise ValueError(
            f"Trainer.{method} returned a loss that does not require grad ({loss!r}), so there "
            "is nothing to back-propagate: the model's parameters are all frozen "
            "(requires_grad=False), or the loss was computed under torch.no_grad() or from "
            "detached values. Unfreeze some parameters, or compute the loss from the model's "
            "outputs."
        ) from error


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


def check_count(
    where: str,
    name: str,
    value: object,
    *,
    minimum: int,
    allow_none: bool = False,
    resolved: bool = False,
) -> None:
    """Check that `value` is an int >= `minimum`, or a placeholder unless `resolved`."""
    if value is None and allow_none:
        return
    if not isinstance(value, numbers.Integral) and contains_placeholder(value):  # never an int
        if resolved:
            fix = (
                "Placeholders are resolved by the Trainer: pass create_scheduler_fn=<Scheduler>."
                "create_scheduler_fn(...) to Trainer.train, or pass numbers when creating it "
                "yourself."
            )
            fail(TypeError, where, name, value, "an int", fix)
        return
    _check_int(where, name, value, minimum, f"an int >= {minimum}")


def _check_int(where: str, name: str, value: object, minimum: int, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(TypeError, where, name, value, expected, f"Pass an int, e.g. {name}=1.")
    if value < minimum:
        fail(ValueError, where, name, value, expected, f"Pass {name} >= {minimum}.")


def check_fraction(
    where: str, name: str, value: object, *, allow_none: bool = False, allow_zero: bool = True
) -> None:
    """Check that `value` is a real number in `[0, 1]` (`(0, 1]` unless `allow_zero`)."""
    if value is None and allow_none:
        return
    interval = "[0, 1]" if allow_zero else "(0, 1]"
    expected = f"a number in {interval}" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(TypeError, where, name, value, expected, f"Pass a float, e.g. {name}=0.1.")
    number = float(value)
    if not (0 <= number <= 1) or (number == 0 and not allow_zero):
        fail(ValueError, where, name, value, expected, f"Pass a fraction in {interval}.")


def check_group_bound(
    where: str, name: str, values: Sequence[float], bases: Sequence[float], fix: str
) -> None:
    """Check that each group's value derived from ``name`` (a minimum, a start) is <= its base."""
    for index, (value, base) in enumerate(zip(values, bases, strict=True)):
        if value > base:
            fail(
                ValueError,
                where,
                name,
                value,
                f"<= the base value of every parameter group (group {index} has {base})",
                fix,
            )


def check_bool(
    where: str,
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    expected: str = "a bool",
    fix: str | None = None,
) -> None:
    """Raise ``TypeError`` unless ``value`` is a bool (or None when allowed)."""
    if not isinstance(value, bool) and not (value is None and allow_none):
        fail(TypeError, where, name, value, expected, fix or f"Pass {name}=True or {name}=False.")


def check_choice(where: str, name: str, value: object, choices: Sequence[str], fix: str) -> None:
    """Raise unless ``value`` is one of the strings ``choices`` (``TypeError`` for a non-string)."""
    if isinstance(value, str) and value in choices:
        return
    quoted = [repr(choice) for choice in choices]
    expected = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    fail(TypeError if not isinstance(value, str) else ValueError, where, name, value, expected, fix)


def check_metric_name(where: str, name: str, value: object) -> None:
    """Raise unless ``value`` is a non-empty string (a run-history metric name)."""
    if not isinstance(value, str) or not value:
        fail(
            TypeError if not isinstance(value, str) else ValueError,
            where,
            name,
            value,
            "a non-empty metric name",
            f"Pass the name of a run-history metric, e.g. {name}='eval_loss_epoch'.",
        )


def check_path(
    where: str,
    name: str,
    value: object,
    *,
    allow_none: bool = False,
    directory: bool = False,
) -> None:
    """Raise unless ``value`` is a usable path for a file (or a ``directory``), or None if allowed.

    It must be a non-empty ``str`` or ``os.PathLike``; an existing path must be of the right
    kind (a file where a directory is needed fails at the first save, not here, otherwise).
    """
    if value is None and allow_none:
        return
    kind, other = ("directory", "file") if directory else ("file", "directory")
    expected = f"a {kind} path" + (" or None" if allow_none else "")
    example = "checkpoints" if directory else "checkpoints/model.pt"
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        fail(TypeError, where, name, value, expected, f"Pass e.g. {name}={example!r}.")
    path = os.fspath(value)
    if os.path.isfile(path) if directory else os.path.isdir(path):
        fix = f"It names an existing {other}; pass a {kind} path."
        fail(ValueError, where, name, value, expected, fix)
