"""Checks of the data the entry points take: datasets, streams, eval sets and dataloaders.

Part of the argument checks of ``train``, ``evaluate`` and ``predict`` (``_entry_checks``
re-exports them); each failure names the entry point, the argument, the value received and
the fix, before anything is prepared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from pytorch_accel._validation import (
    check_mapping,
    check_positive_int,
    check_sized_dataset,
    fail,
)
from pytorch_accel.dataloaders import merge_dataloader_kwargs, num_batches
from pytorch_accel.eval_sets import named_eval_sets

if TYPE_CHECKING:
    from pytorch_accel.preparation import Preparation

__all__ = [
    "check_data",
    "check_dataloader_settings",
    "check_enough_samples",
    "check_eval_data",
    "check_has_batches",
    "check_train_data",
    "has_length",
    "loader_settings",
    "predict_dataloader",
]


def check_train_data(where: str, arguments: Mapping[str, Any]) -> None:
    """Check ``train()``'s data arguments (its ``locals()``): the sets and how long to train.

    Args:
        where: The entry point.
        arguments: ``train()``'s arguments by name.
    """
    check_data(where, "train_dataset", arguments["train_dataset"], streams=True)
    _check_run_length(where, arguments)
    common = {name: arguments[name] for name in ("per_device_batch_size", "collate_fn")}
    check_dataloader_settings(
        where,
        arguments["train_dataset"],
        data_name="train_dataset",
        train_dataloader_kwargs=arguments["train_dataloader_kwargs"],
        **common,
    )
    if arguments["eval_dataset"] is not None:
        check_eval_data(
            where,
            "eval_dataset",
            arguments["eval_dataset"],
            eval_dataloader_kwargs=arguments["eval_dataloader_kwargs"],
            **common,
        )
    check_positive_int(where, "eval_every_n_epochs", arguments["eval_every_n_epochs"])
    _check_sanity_eval_batches(where, arguments["sanity_eval_batches"])
    check_positive_int(
        where, "per_device_batch_size", arguments["per_device_batch_size"], allow_none=True
    )
    for name in ("train_dataloader_kwargs", "eval_dataloader_kwargs"):
        check_mapping(where, name, arguments[name])


def check_eval_data(where: str, name: str, data: object, **settings: object) -> None:
    """Check one eval set, or a mapping of named ones, and the settings that build loaders.

    Args:
        where: The entry point.
        name: The argument's name.
        data: A dataset or ``DataLoader``, or a mapping of set names to them.
        **settings: The arguments that build a dataloader from a dataset, by name.
    """
    for set_name, one in named_eval_sets(where, name, data).items():
        label = name if set_name is None else f"{name}[{set_name!r}]"
        if one is None:
            fail(TypeError, where, label, None, "a dataset", "Pass a dataset or remove the set.")
        check_data(where, label, one)
        check_dataloader_settings(where, one, data_name=label, **settings)


def _check_sanity_eval_batches(where: str, value: object) -> None:
    expected = "an int >= 0"
    if isinstance(value, bool) or not isinstance(value, int):
        fail(TypeError, where, "sanity_eval_batches", value, expected, "Pass e.g. 2, or 0.")
    if value < 0:
        fail(
            ValueError,
            where,
            "sanity_eval_batches",
            value,
            expected,
            "Pass the batches to check per eval set, e.g. 2, or 0 to skip the check.",
        )


def check_enough_samples(train_dl: DataLoader[Any], num_samples: int, num_processes: int) -> None:
    """Reject a train set smaller than one batch per process."""
    batch_size = train_dl.batch_size
    if batch_size is not None and num_samples < batch_size * num_processes:
        fail(
            ValueError,
            "Trainer.train",
            "train_dataset",
            f"<{num_samples} samples>",
            f"at least one batch per process ({batch_size} x {num_processes} processes)",
            f"Lower per_device_batch_size to at most {max(1, num_samples // num_processes)}.",
        )


def check_has_batches(where: str, preparation: Preparation, **dl_kwargs: Mapping[str, Any]) -> None:
    """Reject prepared dataloaders that yield no batch on this process (an empty epoch).

    Args:
        where: The entry point.
        preparation: Holds the prepared dataloaders.
        **dl_kwargs: The arguments each dataloader was built with, by the entry point's name
            for them (a name with ``train`` for the train dataloader, else the eval one).
    """
    for name, kwargs in dl_kwargs.items():
        train = "train" in name
        loaders = [preparation.train_dataloader] if train else preparation.eval_dataloaders.values()
        if any(loader is not None and num_batches(loader) == 0 for loader in loaders):
            fail(
                ValueError,
                where,
                name,
                dict(kwargs),
                "settings that give at least one batch per process",
                "Check batch_sampler, drop_last and the batch size against the dataset size.",
            )


def check_data(where: str, name: str, data: object, *, streams: bool = False) -> None:
    """Accept a map-style dataset, or a ``DataLoader`` over one (or streams, if allowed).

    Args:
        where: The entry point.
        name: The argument's name.
        data: A dataset or a ``DataLoader``.
        streams: Also accept an ``IterableDataset`` (or a ``DataLoader`` over one).
    """
    dataset = data.dataset if isinstance(data, DataLoader) else data
    if streams and isinstance(dataset, IterableDataset):
        return
    label = f"{name}.dataset (of the DataLoader)" if isinstance(data, DataLoader) else name
    check_sized_dataset(where, label, dataset)


def has_length(data: object) -> bool:
    """Whether ``data`` (a dataset, or a ``DataLoader`` over one) has a number of samples."""
    dataset = data.dataset if isinstance(data, DataLoader) else data
    return not isinstance(dataset, IterableDataset)


def _check_run_length(where: str, arguments: Mapping[str, Any]) -> None:
    """Require ``num_epochs`` or ``max_num_train_steps``; the latter for data without length."""
    num_epochs, max_steps = arguments["num_epochs"], arguments["max_num_train_steps"]
    check_positive_int(where, "num_epochs", num_epochs, allow_none=True)
    check_positive_int(where, "max_num_train_steps", max_steps, allow_none=True)
    if max_steps is not None:
        return
    if not has_length(arguments["train_dataset"]):
        fail(
            ValueError,
            where,
            "max_num_train_steps",
            None,
            "a positive int when train_dataset has no length (an IterableDataset)",
            "Pass max_num_train_steps=N: a run over a stream is counted in optimizer updates "
            "(num_epochs, if given, caps the passes through it).",
        )
    if num_epochs is None:
        fail(
            ValueError,
            where,
            "num_epochs",
            None,
            "a positive int when max_num_train_steps is not given",
            "Pass num_epochs=N, or max_num_train_steps=N for a run counted in updates.",
        )


def check_dataloader_settings(
    where: str, data: object, *, data_name: str = "the data", **settings: object
) -> None:
    """Reject the arguments that build a dataloader when ``data`` is already a ``DataLoader``.

    Args:
        where: The entry point.
        data: The dataset or dataloader the user passed.
        data_name: How the message names ``data``.
        **settings: The arguments that build a dataloader from a dataset, by name.

    Raises:
        ValueError: If ``data`` is a ``DataLoader`` and one of ``settings`` is given.
    """
    if not isinstance(data, DataLoader):
        return
    for name, value in settings.items():
        if value is not None:
            fail(
                ValueError,
                where,
                name,
                value,
                f"None when {data_name} is a DataLoader",
                "Build the DataLoader with it, or pass the dataset instead of a DataLoader.",
            )


def loader_settings(dataloader: DataLoader[Any]) -> dict[str, Any]:
    """The settings a user-built ``DataLoader`` holds, as the run config records them."""
    names = ("batch_size", "num_workers", "pin_memory", "drop_last", "collate_fn")
    return {name: getattr(dataloader, name) for name in names}


def predict_dataloader(
    data: Any,
    per_device_batch_size: int | None,
    dataloader_kwargs: Mapping[str, Any] | None,
    collate_fn: Callable[..., Any] | None,
    preparation: Preparation,
) -> DataLoader[Any]:
    """Check ``Trainer.predict``'s arguments; return the user's dataloader or build one."""
    where = "Trainer.predict"
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
        return data
    check_sized_dataset(where, "data", data)
    batch_size = 8 if per_device_batch_size is None else per_device_batch_size
    check_positive_int(where, "per_device_batch_size", batch_size)
    check_mapping(where, "dataloader_kwargs", dataloader_kwargs)
    if (dataloader_kwargs or {}).get("shuffle"):
        fail(
            ValueError,
            where,
            "dataloader_kwargs['shuffle']",
            True,
            "False",
            "Predictions come back in the dataset's order; leave shuffle out.",
        )
    defaults = preparation.default_dl_kwargs(data, batch_size, shuffle=False, collate_fn=collate_fn)
    return DataLoader(data, **merge_dataloader_kwargs(defaults, dataloader_kwargs))
