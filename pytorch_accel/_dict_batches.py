"""Dict batches: the model's keyword arguments, its output carrying its own loss and ``logits``.

The layout of Hugging Face models (the design and its table: docs/hf-models.md). The default
step methods read a dict batch here and an ``(inputs, targets)`` batch in ``_batches``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import torch
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accel._batches import NUM_ITEMS_IN_BATCH, check_num_items

__all__ = [
    "dict_batch_loss",
    "dict_batch_size",
    "may_be_dict_batches",
    "missing_loss_func",
    "output_field",
    "predictions_of",
    "tuple_loss",
    "without_count",
]

_NOT_INPUTS = frozenset({"labels", NUM_ITEMS_IN_BATCH})
"""What a model whose loss a ``loss_func`` computes does not get from a dict batch."""


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
    return outputs.get(name) if isinstance(outputs, Mapping) else None


def predictions_of(outputs: Any) -> Any:
    """Return a model output's ``logits`` where it is a dict (or ``ModelOutput``) with them."""
    logits = output_field(outputs, "logits")
    return outputs if logits is None else logits


def dict_batch_size(batch: Mapping[str, Any]) -> int:
    """Return a dict batch's number of samples: the first dimension of ``labels`` (or a tensor)."""
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

    With ``loss_func=None`` the model gets the whole batch and its output carries the loss;
    with a ``loss_func``, the model gets the batch without ``labels`` (and
    ``num_items_in_batch``) and the loss is ``loss_func(predictions, batch["labels"])``. The
    batch's ``num_items_in_batch`` is returned as ``num_items`` (the table of
    docs/hf-models.md). ``method`` names the calling step method in messages.
    """
    if not isinstance(batch, Mapping):  # loss_func is None: a stream's batches show it here
        missing_loss_func(batch, method)
    num_items = batch.get(NUM_ITEMS_IN_BATCH)
    if num_items is not None:  # before the model gets it (transformers' own error is raw)
        name = f"batch[{NUM_ITEMS_IN_BATCH!r}], returned as batch_output['num_items']"
        check_num_items(num_items, method, name)
    if loss_func is None:
        outputs = model(**batch)
        if isinstance(outputs, (tuple, list)):  # return_dict=False: (loss, logits, ...)
            loss, predictions = tuple_loss(outputs, batch, method)
        else:
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
    if num_items is not None:
        output["num_items"] = num_items
    return output


def tuple_loss(outputs: tuple[Any, ...] | list[Any], batch: Mapping[str, Any], method: str) -> Any:
    """The loss and predictions of a model output that is a tuple, as transformers lays it out.

    With ``labels`` in the batch, a model called with ``return_dict=False`` returns
    ``(loss, logits, ...)``: the loss first, a one-element tensor. The predictions are the
    second element (``None`` if there is none).

    Raises:
        ValueError: If the batch has no ``labels`` or the first element is not a loss.
    """
    first = outputs[0] if outputs else None
    if "labels" in batch and isinstance(first, torch.Tensor) and first.numel() == 1:
        return first, outputs[1] if len(outputs) > 1 else None
    if "labels" not in batch:
        problem = f"the batch has no 'labels' (keys {sorted(batch)}), so it carries no loss"
        fix = "Put the targets in the batch as 'labels'"
    else:
        shown = (
            f"a tensor of shape {tuple(first.shape)}"
            if isinstance(first, torch.Tensor)
            else type(first).__name__
        )
        problem = f"its first element, where transformers puts the loss, is {shown}"
        fix = (
            "Return the loss first (a mean over the batch, e.g. loss.mean()), or a dict or "
            "ModelOutput with 'loss' (return_dict=True)"
        )
    raise ValueError(
        f"Trainer.{method}: with loss_func=None the model returned a {type(outputs).__name__} "
        f"of {len(outputs)} and {problem}. {fix}; or pass a loss_func to Trainer(...)."
    )


def without_count(batch: Any) -> Any:
    """Return a dict batch without its ``num_items_in_batch``, to slice its first rows."""
    if isinstance(batch, Mapping) and NUM_ITEMS_IN_BATCH in batch:
        return {key: value for key, value in batch.items() if key != NUM_ITEMS_IN_BATCH}
    return batch


def may_be_dict_batches(data: Any, collate_fn: object) -> bool:
    """Whether the batches of ``data`` (a dataset or ``DataLoader``) may be dicts.

    Reads the first sample of a map-style dataset and collates it alone (with the
    dataloader's or the given ``collate_fn``). A stream, or a sample that fails to load or
    collate, may be: the default step then checks its first batch.
    """
    if isinstance(data, DataLoader):
        data, collate_fn = data.dataset, data.collate_fn
    if isinstance(data, IterableDataset) or not hasattr(data, "__getitem__"):
        return True
    try:
        sample = data[0]
        batch = collate_fn([sample]) if callable(collate_fn) else sample
    except Exception:  # the layout is unknown; the step checks it
        return True
    return isinstance(batch, Mapping)
