"""``predict()``'s run, and what it returns: each batch's outputs checked, padded, concatenated.

``predict`` runs the prediction level on the loop (``Loop``): every batch through
``calculate_predict_batch`` without gradients, gathered from every process.

``check_predict_outputs`` refuses, after the first batch, outputs that could never be
concatenated on their first dimension; ``explain_unconcatenated_outputs`` names why the
batches did not concatenate, keeping them all (``PredictOutputsError``).

``predict(..., pad_value=...)``: each tensor of the batches' outputs (nested in lists, tuples
and mappings, the same structure in every batch) with a second dimension is padded at the end
of that dimension, with ``pad_value``, to the longest of that output over all batches, so the
batches concatenate on the first. Across processes, each batch is padded before it is gathered
(``accelerator.pad_across_processes``, in the loop).
"""

from __future__ import annotations

import functools
import itertools
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from accelerate.utils import concatenate, send_to_device

from pytorch_accel._checks import fail
from pytorch_accel._loop import PREDICT_STEP_EVENTS, training_rng_preserved
from pytorch_accel.dataloaders import epoch_batches
from pytorch_accel.errors import PredictOutputsError
from pytorch_accel.failing_batches import SKIPPED

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from pytorch_accel._loop import Loop

__all__ = [
    "SEQUENCE_DIM",
    "check_pad_value",
    "check_predict_outputs",
    "explain_unconcatenated_outputs",
    "pad_to_longest",
    "predict",
]

SEQUENCE_DIM = 1
"""The dimension padded: the sequence dimension of batch-first outputs ``(batch, length, ...)``."""


def check_pad_value(value: object) -> None:
    """Refuse a ``pad_value`` that is not a real number.

    Raises:
        TypeError: Naming the argument, the value and the fix.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(
            TypeError,
            "Trainer.predict",
            "pad_value",
            value,
            "a number or None",
            "Pass the value to pad outputs of varying lengths with, e.g. pad_value=-100 or "
            "pad_value=float('nan'); None (the default) pads nothing.",
        )


def pad_to_longest(batches: list[Any], value: float) -> list[Any]:
    """Return ``batches`` with each output padded along ``SEQUENCE_DIM`` to its longest."""
    longest: dict[int, int] = {}
    for batch in batches:
        for index, leaf in enumerate(_tensors(batch)):
            if leaf.ndim > SEQUENCE_DIM:
                longest[index] = max(longest.get(index, 0), leaf.shape[SEQUENCE_DIM])

    def pad(index: int, leaf: torch.Tensor) -> torch.Tensor:
        if leaf.ndim <= SEQUENCE_DIM or leaf.shape[SEQUENCE_DIM] >= longest[index]:
            return leaf
        shape = list(leaf.shape)
        shape[SEQUENCE_DIM] = longest[index] - leaf.shape[SEQUENCE_DIM]
        return torch.cat([leaf, leaf.new_full(shape, value)], dim=SEQUENCE_DIM)

    return [_rebuild(batch, pad, itertools.count()) for batch in batches]


def _tensors(outputs: Any) -> Iterator[torch.Tensor]:
    """The tensors of nested lists, tuples and mappings, depth first."""
    if isinstance(outputs, torch.Tensor):
        yield outputs
    elif isinstance(outputs, Mapping):
        for item in outputs.values():
            yield from _tensors(item)
    elif isinstance(outputs, (list, tuple)):
        for item in outputs:
            yield from _tensors(item)


def _rebuild(
    outputs: Any, pad: Callable[[int, torch.Tensor], torch.Tensor], indices: Iterator[int]
) -> Any:
    """``outputs`` with each tensor replaced by ``pad(its index in _tensors order, tensor)``."""
    if isinstance(outputs, torch.Tensor):
        return pad(next(indices), outputs)
    if isinstance(outputs, Mapping):
        return type(outputs)({k: _rebuild(v, pad, indices) for k, v in outputs.items()})  # type: ignore[call-arg]
    if isinstance(outputs, (list, tuple)):
        items = [_rebuild(item, pad, indices) for item in outputs]
        return type(outputs)(*items) if hasattr(outputs, "_fields") else type(outputs)(items)
    return outputs


_PREDICT_FIX = (
    "Return a tensor with the batch dimension first (one row per sample), or a list, tuple or "
    "dict of such tensors; or pass keep_outputs=False and collect each batch's outputs in a "
    "callback's on_predict_step_end (its `predictions` argument)."
)


def check_predict_outputs(outputs: Any, method: str = "calculate_predict_batch") -> None:
    """Raise if one batch's outputs could not be concatenated on their first dimension.

    ``predict`` keeps tensors with one row per sample, or lists, tuples and dicts of them.
    Called on the first batch (before the others are computed) when the outputs are kept.
    """
    for path, leaf in _leaves(outputs, "its output"):
        if isinstance(leaf, torch.Tensor) and leaf.ndim > 0:
            continue
        shown = repr(leaf) if len(repr(leaf)) <= 60 else repr(leaf)[:57] + "..."
        if isinstance(leaf, torch.Tensor):
            raise ValueError(
                f"Trainer.predict: {method} returned a 0-d tensor as {path} ({shown}), one value "
                "for the whole batch (a mean?), but predict() concatenates the batches' outputs "
                f"on their first dimension, one row per sample. {_PREDICT_FIX} Stopped after "
                "the first batch."
            )
        raise TypeError(
            f"Trainer.predict: {method} returned a {type(leaf).__name__} as {path} ({shown}), "
            "but predict() concatenates tensors only, on their first dimension. "
            f"{_PREDICT_FIX} Stopped after the first batch."
        )


def explain_unconcatenated_outputs(
    batches: list[Any], error: Exception, method: str = "calculate_predict_batch"
) -> NoReturn:
    """Raise ``PredictOutputsError``, keeping ``batches``, after their concatenation failed.

    Names the first batch whose outputs differ from the first batch's, and how.
    """
    first = dict(_leaves(batches[0], "the output"))
    detail = f"they could not be concatenated ({error})"
    for index, batch in enumerate(batches[1:], start=1):
        leaves = dict(_leaves(batch, "the output"))
        if leaves.keys() != first.keys():
            detail = (
                f"batch {index}'s outputs have another structure than batch 0's ({len(leaves)} "
                f"tensor(s) against {len(first)}; a list or tuple is a structure of outputs, each "
                "concatenated on its own, not a list of samples)"
            )
            break
        shapes = [
            (path, tuple(leaf.shape), tuple(first[path].shape))
            for path, leaf in leaves.items()
            if isinstance(leaf, torch.Tensor) and isinstance(first[path], torch.Tensor)
        ]
        differing = [shape for shape in shapes if shape[1][1:] != shape[2][1:]]
        if differing:
            path, shape, first_shape = differing[0]
            detail = (
                f"{path} has shape {shape} in batch {index} and {first_shape} in batch 0: its "
                "dimensions after the first differ between batches (sequences of varying length? "
                "pass pad_value=... to pad their second dimension)"
            )
            break
    raise PredictOutputsError(
        f"Trainer.predict: the outputs of the {len(batches)} batches could not be concatenated "
        f"on their first dimension: {detail}. Nothing is lost: this error's `batches` attribute "
        "holds every batch's outputs, in order (`except PredictOutputsError as error: "
        f"error.batches`). Pad them to one shape in {method} (with a value that suits your "
        "outputs), or pass keep_outputs=False and write each batch out in a callback's "
        "on_predict_step_end.",
        batches,
    ) from error


def _leaves(outputs: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Each leaf of nested lists, tuples and mappings, with its path (``outputs["x"][0]``)."""
    if isinstance(outputs, Mapping):
        for key, value in outputs.items():
            yield from _leaves(value, f"{_root(path)}[{key!r}]")
    elif isinstance(outputs, (list, tuple)):
        for index, value in enumerate(outputs):
            yield from _leaves(value, f"{_root(path)}[{index}]")
    else:
        yield path, outputs


def _root(path: str) -> str:
    return "outputs" if path.startswith(("its ", "the ")) else path


def predict(
    loop: Loop,
    dataloader: DataLoader[Any],
    output_device: str | torch.device | None,
    keep: bool,
    policy: object = None,
    pad_value: float | None = None,
) -> Any:
    """Predict every batch of a prepared ``dataloader`` on ``loop`` (see ``Trainer.predict``).

    Args:
        loop: The trainer's loop, whose levels fire the prediction events.
        dataloader: The prepared (sharded) dataloader, not shuffled.
        output_device: Where each gathered batch is moved (``None``: where it is).
        keep: Keep and return the outputs concatenated; ``False`` returns ``None``.
        policy: ``skip_failing_batches``.
        pad_value: Pad outputs along their second dimension to one length (``pad_to_longest``).
    """
    outputs: list[Any] | None = [] if keep else None
    trainer = loop._trainer
    accelerator, guard = trainer.accelerator, None

    def step(batch: Any) -> dict[str, Any]:
        compute = functools.partial(trainer.calculate_predict_batch, batch)
        predicted = compute() if guard is None else guard.attempt(compute, batch)
        if predicted is SKIPPED:  # on every process: no outputs to gather
            return {"batch": batch, "predictions": None, "skipped": True}
        if outputs is not None and not outputs:  # kept; the first batch
            check_predict_outputs(predicted)  # refuse what could never be concatenated
        if pad_value is not None and accelerator.num_processes > 1:  # sizes gathered
            predicted = accelerator.pad_across_processes(predicted, dim=1, pad_index=pad_value)
        # one process has nothing to gather (accelerate would still all-gather over a group of
        # one under a launcher), and no repeated samples to drop
        gathered = (
            accelerator.gather_for_metrics(predicted)
            if accelerator.num_processes > 1
            else predicted
        )
        if output_device is not None:
            gathered = send_to_device(gathered, output_device)
        if outputs is not None:
            outputs.append(gathered)
        return {"batch": batch, "predictions": gathered}

    def batches() -> None:
        nonlocal guard
        guard = loop.state.failing_batches
        with epoch_batches(dataloader, None) as loaded:
            for batch in loaded:
                if trainer.callback_handler.active_events.isdisjoint(PREDICT_STEP_EVENTS):
                    step(batch)
                else:
                    loop._with_events("predict_step", step, batch)

    model = trainer.model
    was_training = model.training
    model.eval()
    try:
        with (
            torch.no_grad(),
            training_rng_preserved(trainer.device),
            loop._guarding(policy, "prediction"),
        ):
            loop._entry_point("Trainer.predict", "predict_run", batches)
    finally:
        model.train(was_training)
    if not outputs:
        return None
    try:
        if pad_value is not None:
            outputs = pad_to_longest(outputs, pad_value)
        return concatenate(outputs)
    except Exception as error:  # every batch is computed: keep them all in the error
        explain_unconcatenated_outputs(outputs, error)
