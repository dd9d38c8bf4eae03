"""How the default step methods read a batch: ``(inputs, targets)``, or a dict.

A dict batch (any mapping, such as a Hugging Face ``BatchEncoding``) holds the model's keyword
arguments; the model's output may carry its own loss and ``logits``, as Hugging Face models'
do. Nothing here synchronises with the device: sizes come from tensor shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import torch

__all__ = [
    "NUM_ITEMS_IN_BATCH",
    "dict_batch_loss",
    "dict_batch_size",
    "inputs_and_targets",
    "missing_loss_func",
    "output_field",
    "predictions_of",
    "without_count",
]


NUM_ITEMS_IN_BATCH = "num_items_in_batch"
"""The key of a dict batch that counts its loss elements (Hugging Face's name for it)."""

_NOT_INPUTS = frozenset({"labels", NUM_ITEMS_IN_BATCH})
"""What a model whose loss a ``loss_func`` computes does not get from a dict batch."""


def inputs_and_targets(batch: Any, method: str) -> tuple[Any, Any]:
    """Return ``batch[0], batch[1]``: the layout the default step methods read.

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
        "for other layouts (inputs only, several inputs); a dict batch is passed to the "
        "model as keyword arguments."
    )


def missing_loss_func(batch: Any, method: str) -> NoReturn:
    """Raise the error of a default step that needs a ``loss_func`` and has none."""
    raise TypeError(
        f"Trainer.{method}: Trainer's loss_func is None, which the default step accepts only "
        f"for dict batches whose model output carries its 'loss'; got a "
        f"{type(batch).__name__} batch. Pass a loss function to Trainer(...), or override "
        f"{method}."
    )


def output_field(outputs: Any, name: str) -> Any:
    """Return the field ``name`` of a model's output (a dict or a ``ModelOutput``), or ``None``."""
    if isinstance(outputs, Mapping):
        return outputs.get(name)
    return None


def predictions_of(outputs: Any) -> Any:
    """Return a model output's ``logits`` where it is a dict (or ``ModelOutput``) with them."""
    logits = output_field(outputs, "logits")
    return outputs if logits is None else logits


def dict_batch_size(batch: Mapping[str, Any]) -> int:
    """Return the number of samples in a dict batch: the first dimension of its ``labels``.

    Without ``labels``, that of the batch's first tensor.

    Raises:
        TypeError: If the batch holds no tensor with a batch dimension.
    """
    labels = batch.get("labels")
    for value in (labels, *batch.values()):
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    raise TypeError(
        "Trainer: a dict batch must hold a tensor with the batch first (e.g. 'input_ids' or "
        f"'labels'), got keys {sorted(batch)}. Return tensors from the dataset or collate_fn, "
        "or override the step methods for this layout."
    )


def dict_batch_loss(
    model: Callable[..., Any],
    loss_func: Callable[..., Any] | None,
    batch: Mapping[str, Any],
    method: str,
) -> dict[str, Any]:
    """Compute the loss of a dict batch, as the default step methods do.

    The batch holds the model's keyword arguments, as Hugging Face models take them. With
    ``loss_func=None`` the model gets the whole batch and its output carries the loss
    (``outputs.loss`` or ``outputs["loss"]``: a Hugging Face model computes it when the
    batch has ``labels``). With a ``loss_func``, the model gets the batch without
    ``labels`` and the loss is ``loss_func(predictions, batch["labels"])``. The
    predictions (``model_outputs``) are the output's ``logits`` where it has them, else
    the output; ``batch_size`` is the first dimension of ``labels`` (or of the first
    tensor in the batch).

    A batch may carry ``num_items_in_batch``, the number of loss elements (tokens) of the
    batch, as Hugging Face's ``Trainer`` passes it to the model: with ``loss_func=None`` the
    model gets it (a Hugging Face model then divides its summed loss by it), with a
    ``loss_func`` it is left out of the model's inputs; either way it is returned as
    ``num_items``, which makes the loop weight the batch by it (token-exact accumulation).

    Args:
        model: The (prepared) model.
        loss_func: The trainer's loss function, or ``None``.
        batch: The model's keyword arguments.
        method: The calling step method, for messages.

    Returns:
        A dict with ``loss``, ``model_outputs`` and ``batch_size`` (and ``num_items``).
    """
    if not isinstance(batch, Mapping):  # loss_func is None: a stream's batches show it here
        missing_loss_func(batch, method)
    if loss_func is None:
        outputs = model(**batch)
        loss = output_field(outputs, "loss")
        if loss is None:
            raise ValueError(
                f"Trainer.{method}: with loss_func=None the model's output must carry its "
                f"loss ('loss'), got {type(outputs).__name__} without one (batch keys "
                f"{sorted(batch)}). Put the targets in the batch as 'labels' (Hugging Face "
                "models then compute the loss), or pass a loss_func to Trainer(...)."
            )
        predictions = predictions_of(outputs)
    else:
        if "labels" not in batch:
            raise ValueError(
                f"Trainer.{method}: with a loss_func, a dict batch gives the targets as "
                f"'labels', got keys {sorted(batch)}. Add 'labels' to the batch (in the "
                f"dataset or a collate_fn), or override {method}."
            )
        inputs = {key: value for key, value in batch.items() if key not in _NOT_INPUTS}
        predictions = predictions_of(model(**inputs))
        loss = loss_func(predictions, batch["labels"])
    output = {"loss": loss, "model_outputs": predictions, "batch_size": dict_batch_size(batch)}
    num_items = batch.get(NUM_ITEMS_IN_BATCH)
    if num_items is not None:
        output["num_items"] = num_items
    return output


def without_count(batch: Any) -> Any:
    """Return a dict batch without its ``num_items_in_batch`` (other batches as they are).

    For the first rows of a batch (``slice_tensors``): the count has no rows to slice, and
    holds the whole batch's elements.
    """
    if isinstance(batch, Mapping) and NUM_ITEMS_IN_BATCH in batch:
        return {key: value for key, value in batch.items() if key != NUM_ITEMS_IN_BATCH}
    return batch
