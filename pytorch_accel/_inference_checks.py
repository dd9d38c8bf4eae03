"""Checks of the arguments of the entry points that do not train: ``evaluate`` and ``predict``.

Built from the checks of ``train()``'s data and settings (``_entry_checks``); each failure comes
before anything is prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, RandomSampler

from pytorch_accel._checks import (
    check_bool,
    check_mapping,
    check_positive_int,
    check_sized_dataset,
    fail,
)
from pytorch_accel._entry_checks import (
    check_dataloader_settings,
    check_eval_data,
    check_loss_func,
    check_trainer_settings,
)
from pytorch_accel.dataloaders import merge_dataloader_kwargs

if TYPE_CHECKING:
    from pytorch_accel._state import Preparation
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = ["check_evaluate_arguments", "predict_dataloader"]


def check_evaluate_arguments(
    trainer: Trainer,
    base: type,
    dataset: object,
    per_device_batch_size: object,
    dataloader_kwargs: object,
    collate_fn: object,
    metric_prefix: object,
) -> None:
    """Check ``Trainer.evaluate``'s arguments (``dataset`` defaulted) and the trainer's settings.

    ``base``: the ``Trainer`` class, whose default eval step needs a usable ``loss_func``.
    """
    where = "Trainer.evaluate"
    if dataset is None:
        fail(
            ValueError,
            where,
            "dataset",
            None,
            "a dataset",
            "Pass evaluate(dataset=...), or call train(..., eval_dataset=...) first.",
        )
    sets = check_eval_data(
        where,
        "dataset",
        dataset,
        per_device_batch_size=per_device_batch_size,
        dataloader_kwargs=dataloader_kwargs,
        collate_fn=collate_fn,
    )
    check_positive_int(where, "per_device_batch_size", per_device_batch_size, allow_none=True)
    check_mapping(where, "dataloader_kwargs", dataloader_kwargs)
    if not isinstance(metric_prefix, str):
        fail(
            TypeError,
            where,
            "metric_prefix",
            metric_prefix,
            "a string",
            "Pass e.g. metric_prefix='test_' (the loss is then recorded as 'test_loss').",
        )
    check_loss_func(where, trainer, base, sets, collate_fn, with_train=False, with_eval=True)
    check_trainer_settings(where, trainer)


_PREDICT_REFUSED = {
    "shuffle": "Predictions come back in the dataset's order; leave shuffle out.",
    "drop_last": "predict() returns an output for every sample; leave drop_last out.",
}
"""``DataLoader`` arguments ``predict`` refuses, with the fix of each."""


def predict_dataloader(
    data: Any,
    per_device_batch_size: int | None,
    dataloader_kwargs: Mapping[str, Any] | None,
    collate_fn: Callable[..., Any] | None,
    preparation: Preparation,
    keep_outputs: object = True,
    default_batch_size: int = 8,
) -> DataLoader[Any]:
    """Check ``Trainer.predict``'s arguments; return the user's dataloader or build one."""
    where = "Trainer.predict"
    check_bool(where, "keep_outputs", keep_outputs)
    check_dataloader_settings(
        where,
        data,
        data_name="data",
        per_device_batch_size=per_device_batch_size,
        dataloader_kwargs=dataloader_kwargs,
        collate_fn=collate_fn,
    )
    if isinstance(data, DataLoader):
        if isinstance(data.sampler, RandomSampler):
            fail(
                ValueError,
                where,
                "data",
                "a shuffled DataLoader",
                "a DataLoader that is not shuffled",
                "Predictions come back in the dataloader's order: build it with shuffle=False.",
            )
        if data.drop_last:
            fail(
                ValueError,
                where,
                "data",
                "a DataLoader with drop_last=True",
                "a DataLoader that keeps every sample",
                "predict() returns an output for every sample: build it with drop_last=False.",
            )
        return data
    check_sized_dataset(where, "data", data)
    batch_size = default_batch_size if per_device_batch_size is None else per_device_batch_size
    check_positive_int(where, "per_device_batch_size", batch_size)
    check_mapping(where, "dataloader_kwargs", dataloader_kwargs)
    for key, why in _PREDICT_REFUSED.items():
        if (dataloader_kwargs or {}).get(key):
            fail(ValueError, where, f"dataloader_kwargs[{key!r}]", True, "False", why)
    defaults = preparation.default_dl_kwargs(data, batch_size, shuffle=False, collate_fn=collate_fn)
    return DataLoader(data, **merge_dataloader_kwargs(defaults, dataloader_kwargs))
