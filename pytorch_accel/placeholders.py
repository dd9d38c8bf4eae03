"""Placeholders for values that are only known once ``train()`` has prepared its dataloaders.

A learning-rate scheduler often needs the number of epochs or optimizer updates. Those depend on
the dataset size, the number of processes and the accumulation steps, so they are unknown when
the user writes ``functools.partial(OneCycleLR, ...)``. Put a placeholder there instead; the
trainer resolves it at train time, after ``accelerator.prepare``:

    from functools import partial
    from torch.optim.lr_scheduler import OneCycleLR
    from pytorch_accel import TrainerPlaceholderValues as P

    create_scheduler_fn = partial(
        OneCycleLR,
        max_lr=0.1,
        epochs=P.NUM_EPOCHS,
        steps_per_epoch=P.NUM_UPDATE_STEPS_PER_EPOCH,
    )

Placeholders support ``+ - * / //`` with numbers and other placeholders, in either order and
chained (``2 * P.NUM_EPOCHS``, ``(P.NUM_UPDATE_STEPS_PER_EPOCH - 1) // 2``). Expressions are
trees of ``operator`` functions: nothing is ever passed to ``eval``.

Placeholders are resolved in the positional and keyword arguments of a ``functools.partial``,
in nested partials, and inside lists, tuples and dicts among those arguments.

An expression that gives a float for an argument that takes an int (annotated ``int``, or
``list[int]`` and the like, or unannotated with an int default; ``StepLR``'s ``step_size``,
``MultiStepLR``'s ``milestones``) is made an int if it is whole (``4.0``) and refused
otherwise (``P.NUM_UPDATE_STEPS_PER_EPOCH / 3`` giving ``1.333``): use ``//``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import operator
import re
import types
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from enum import Enum, EnumMeta
from typing import Any, Protocol, Union, get_args, get_origin

__all__ = [
    "PlaceholderExpression",
    "TrainerPlaceholderValues",
    "check_resolved",
    "contains_placeholder",
    "replace_trainer_placeholder_values",
    "resolve_placeholders",
]


class RunLengths(Protocol):
    """The lengths of a run that placeholders stand for (a ``TrainerRunConfig`` has them)."""

    @property
    def num_epochs(self) -> int | None:
        """The epochs of the run."""

    @property
    def num_update_steps_per_epoch(self) -> int | None:
        """The optimizer updates of each epoch."""

    @property
    def total_num_update_steps(self) -> int:
        """The optimizer updates of the run."""

    @property
    def train_dataloader_len(self) -> int | None:
        """The batches of each training epoch."""


class ResolvingTrainer(Protocol):
    """What ``replace_trainer_placeholder_values`` reads of a trainer."""

    @property
    def run_config(self) -> RunLengths | None:
        """The current run's configuration."""

    @property
    def eval_dataloader(self) -> Sized | None:
        """The current run's (first) evaluation dataloader."""


Operand = Union["TrainerPlaceholderValues", "PlaceholderExpression", int, float]

_SYMBOLS: dict[Callable[[Any, Any], Any], str] = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
}


class _Arithmetic:
    """Operators that build a ``PlaceholderExpression`` instead of computing a value."""

    def _combine(self, op: Callable[[Any, Any], Any], other: object, *, reflected: bool) -> Any:
        operand = (int, float, TrainerPlaceholderValues, PlaceholderExpression)
        if isinstance(other, bool) or not isinstance(other, operand):
            return NotImplemented
        left, right = (other, self) if reflected else (self, other)
        return PlaceholderExpression(op, left, right)  # type: ignore[arg-type]

    __add__ = functools.partialmethod(_combine, operator.add, reflected=False)
    __radd__ = functools.partialmethod(_combine, operator.add, reflected=True)
    __sub__ = functools.partialmethod(_combine, operator.sub, reflected=False)
    __rsub__ = functools.partialmethod(_combine, operator.sub, reflected=True)
    __mul__ = functools.partialmethod(_combine, operator.mul, reflected=False)
    __rmul__ = functools.partialmethod(_combine, operator.mul, reflected=True)
    __truediv__ = functools.partialmethod(_combine, operator.truediv, reflected=False)
    __rtruediv__ = functools.partialmethod(_combine, operator.truediv, reflected=True)
    __floordiv__ = functools.partialmethod(_combine, operator.floordiv, reflected=False)
    __rfloordiv__ = functools.partialmethod(_combine, operator.floordiv, reflected=True)


class _PlaceholderType(EnumMeta):
    """Names the valid placeholders when an unknown one is looked up (``P.NUM_EPOCH``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        members = list(cls.__members__)
        close = difflib.get_close_matches(name, members, n=1)
        hint = f" Did you mean {close[0]}?" if close else ""
        raise AttributeError(
            f"TrainerPlaceholderValues has no placeholder {name!r}.{hint} The placeholders are: "
            f"{', '.join(members)}."
        )


class TrainerPlaceholderValues(_Arithmetic, Enum, metaclass=_PlaceholderType):
    """Values the trainer fills in at train time, after preparing the dataloaders.

    Attributes:
        NUM_EPOCHS: Epochs this ``train()`` call runs (fewer than asked when
            ``max_num_train_steps`` ends the run first).
        NUM_UPDATE_STEPS_PER_EPOCH: Optimizer updates per epoch on each process: the unit a
            scheduler is stepped in. ``ceil(len(train_dataloader) / gradient_accumulation_steps)``.
        PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH: Alias of ``NUM_UPDATE_STEPS_PER_EPOCH``, kept so
            code written for pytorch-accelerated keeps working.
        TOTAL_NUM_UPDATE_STEPS: Optimizer updates in this ``train()`` call on each process, with
            ``max_num_train_steps`` taken into account.
        TRAIN_DATALOADER_LEN: Batches per epoch in this process's train dataloader.
        EVAL_DATALOADER_LEN: Batches in this process's eval dataloader (only with an eval set).
    """

    NUM_EPOCHS = "num_epochs"
    NUM_UPDATE_STEPS_PER_EPOCH = "num_update_steps_per_epoch"
    PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH = "num_update_steps_per_epoch"
    TOTAL_NUM_UPDATE_STEPS = "total_num_update_steps"
    TRAIN_DATALOADER_LEN = "train_dataloader_len"
    EVAL_DATALOADER_LEN = "eval_dataloader_len"

    @classmethod
    def placeholder_set(cls) -> set[str]:
        """Return the names of all placeholders (pytorch-accelerated compatible)."""
        return set(cls.__members__)


@dataclass(frozen=True, eq=False)
class PlaceholderExpression(_Arithmetic):
    """An arithmetic expression over placeholders and numbers, evaluated at train time.

    Args:
        op: A binary function from ``operator`` (add, sub, mul, truediv, floordiv).
        left: The left operand.
        right: The right operand.
    """

    op: Callable[[Any, Any], Any]
    left: Operand
    right: Operand

    def resolve(self, values: Mapping[TrainerPlaceholderValues, int | None]) -> int | float:
        """Return the number the expression stands for, given each placeholder's value."""
        left = _resolve_operand(self.left, values)
        right = _resolve_operand(self.right, values)
        return self.op(left, right)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"({_show(self.left)} {_SYMBOLS[self.op]} {_show(self.right)})"


def _show(operand: Operand) -> str:
    if isinstance(operand, TrainerPlaceholderValues):
        return f"TrainerPlaceholderValues.{operand.name}"
    return repr(operand)


def _resolve_operand(
    operand: Operand, values: Mapping[TrainerPlaceholderValues, int | None]
) -> int | float:
    if isinstance(operand, PlaceholderExpression):
        return operand.resolve(values)
    if isinstance(operand, TrainerPlaceholderValues):
        value = values.get(operand)
        if value is None:
            raise ValueError(
                f"TrainerPlaceholderValues.{operand.name} cannot be resolved in this run: "
                f"{_UNAVAILABLE_REASON.get(operand, 'no value is known')}. "
                "Remove it from create_scheduler_fn or provide what it depends on."
            )
        return value
    return operand


_NO_LENGTH = (
    "the train data has no length (an IterableDataset): the run is counted in updates, so use "
    "TOTAL_NUM_UPDATE_STEPS"
)
_UNAVAILABLE_REASON = {
    TrainerPlaceholderValues.EVAL_DATALOADER_LEN: "train() was called without an eval_dataset",
    TrainerPlaceholderValues.NUM_EPOCHS: "train() was given no num_epochs and the train data "
    "has no length, so the number of epochs is not known",
    TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH: _NO_LENGTH,
    TrainerPlaceholderValues.TRAIN_DATALOADER_LEN: _NO_LENGTH,
}


def resolve_placeholders(value: Any, values: Mapping[TrainerPlaceholderValues, int | None]) -> Any:
    """Return ``value`` with every placeholder replaced, recursing into partials and containers.

    Args:
        value: A placeholder, expression, ``functools.partial``, list, tuple, dict or any object.
        values: The value of each placeholder.

    Returns:
        A copy with placeholders resolved; objects without placeholders are returned as they are.

    Raises:
        ValueError: If a placeholder has no value in this run.
    """
    if isinstance(value, (TrainerPlaceholderValues, PlaceholderExpression)):
        return _resolve_operand(value, values)
    if isinstance(value, functools.partial):
        func = resolve_placeholders(value.func, values)
        args = [resolve_placeholders(arg, values) for arg in value.args]
        keywords = {key: resolve_placeholders(arg, values) for key, arg in value.keywords.items()}
        positional, named = _parameters(func)
        for index, given in enumerate(value.args[: len(positional)]):
            args[index] = _whole_numbers(func, positional[index], given, args[index])
        for name, given in value.keywords.items():
            if name in named:
                keywords[name] = _whole_numbers(func, named[name], given, keywords[name])
        return functools.partial(func, *args, **keywords)
    if isinstance(value, dict):
        return {key: resolve_placeholders(item, values) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [resolve_placeholders(item, values) for item in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


_INT_NAMES = {"int", "int|None", "None|int", "Optional[int]"}
_INT_ITEMS = re.compile(r"(Iterable|Sequence|Collection|list|List|tuple|Tuple)\[int(,\.\.\.)?\]")


def _parameters(func: Any) -> tuple[list[inspect.Parameter], dict[str, inspect.Parameter]]:
    """``func``'s positional parameters, and all of them by name (none without a signature)."""
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return [], {}
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in parameters if p.kind in kinds], {p.name: p for p in parameters}


def _takes_int(parameter: inspect.Parameter) -> str | None:
    """``"int"`` or ``"items"`` if ``parameter`` takes an int or a collection of ints."""
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty:
        default = parameter.default
        return "int" if type(default) is int else None
    if annotation is int or (
        get_origin(annotation) in (Union, types.UnionType)
        and int in get_args(annotation)
        and set(get_args(annotation)) <= {int, type(None)}
    ):
        return "int"
    if get_origin(annotation) is not None:
        items = get_args(annotation)
        return "items" if items and set(items) <= {int, Ellipsis} else None
    if not isinstance(annotation, str):
        return None
    text = annotation.replace(" ", "").replace("typing.", "").replace("collections.abc.", "")
    if text in _INT_NAMES:
        return "int"
    return "items" if _INT_ITEMS.fullmatch(text) else None


def _whole_numbers(func: Any, parameter: inspect.Parameter, given: Any, resolved: Any) -> Any:
    """``resolved``, whole floats made ints where ``parameter`` takes ints; fractions refused."""
    if not contains_placeholder(given):
        return resolved
    kind = _takes_int(parameter)
    if kind == "int":
        return _whole(func, f"{parameter.name} must be an int", given, resolved)
    if kind == "items" and isinstance(resolved, (list, tuple)) and isinstance(given, list | tuple):
        wanted = f"{parameter.name} must hold ints"
        items = [
            _whole(func, wanted, item, value) if contains_placeholder(item) else value
            for item, value in zip(given, resolved, strict=True)
        ]
        return items if isinstance(resolved, list) else type(resolved)(items)
    return resolved


def _whole(func: Any, wanted: str, given: Any, resolved: Any) -> Any:
    """``resolved`` as an int if it is a whole float; a fractional float is refused."""
    if not isinstance(resolved, float):
        return resolved
    if resolved.is_integer():
        return int(resolved)
    while isinstance(func, functools.partial):
        func = func.func
    owner = getattr(func, "__qualname__", None) or type(func).__name__
    raise ValueError(
        f"Trainer.train: create_scheduler_fn's {owner} argument {wanted}, got {resolved!r} "
        f"(float) from the placeholder expression {given!r}. Use // instead of / for a whole "
        f"number, e.g. {_show_floor(given)}."
    )


def _show_floor(given: Any) -> str:
    """``given`` with its outermost ``/`` shown as ``//`` (the fix), when it is one."""
    if isinstance(given, PlaceholderExpression) and given.op is operator.truediv:
        return repr(PlaceholderExpression(operator.floordiv, given.left, given.right))
    return f"{given!r} // 1"


def contains_placeholder(value: Any, _depth: int = 0) -> bool:
    """Return whether ``value`` holds a placeholder, looking into partials and containers."""
    if _depth > 8:
        return False
    if isinstance(value, (TrainerPlaceholderValues, PlaceholderExpression)):
        return True
    if isinstance(value, functools.partial):
        parts: list[Any] = [value.func, *value.args, *value.keywords.values()]
    elif isinstance(value, dict):
        parts = list(value.values())
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        return False
    return any(contains_placeholder(part, _depth + 1) for part in parts)


def check_resolved(instance: object, where: str) -> None:
    """Raise if an attribute of ``instance`` (e.g. a scheduler) still holds a placeholder.

    Raises:
        ValueError: Naming the attribute, and how to pass the placeholder instead.
    """
    for name, value in vars(instance).items():
        if contains_placeholder(value):
            raise ValueError(
                f"{where}: {type(instance).__name__}.{name} holds the unresolved placeholder "
                f"{value!r}. Pass placeholders as arguments of a functools.partial so the "
                "trainer can resolve them."
            )


def replace_trainer_placeholder_values(trainer: ResolvingTrainer, instance: Any) -> Any:
    """Resolve the placeholders in ``instance`` with the values of ``trainer``'s current run.

    Args:
        trainer: A trainer inside ``train()``, after its dataloaders were prepared.
        instance: Usually the ``create_scheduler_fn`` partial.

    Returns:
        ``instance`` with every placeholder replaced by its value.
    """
    config = trainer.run_config
    if config is None:
        raise RuntimeError(
            "replace_trainer_placeholder_values needs a trainer inside train(): "
            "placeholders are resolved after the dataloaders are prepared."
        )
    eval_dl = trainer.eval_dataloader
    values: dict[TrainerPlaceholderValues, int | None] = {
        TrainerPlaceholderValues.NUM_EPOCHS: config.num_epochs,
        TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH: config.num_update_steps_per_epoch,
        TrainerPlaceholderValues.TOTAL_NUM_UPDATE_STEPS: config.total_num_update_steps,
        TrainerPlaceholderValues.TRAIN_DATALOADER_LEN: config.train_dataloader_len,
        TrainerPlaceholderValues.EVAL_DATALOADER_LEN: None if eval_dl is None else len(eval_dl),
    }
    return resolve_placeholders(instance, values)
