"""How the ``Trainer`` builds its dataloaders from datasets, or adopts those the user built.

``Trainer`` inherits these from ``TrainerDataLoaders``; the overridable ones
(``create_train_dataloader``, ``get_default_train_dl_kwargs``, ...) keep pytorch-accelerated's
names and signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from accelerate import Accelerator
from torch.utils.data import DataLoader

from pytorch_accel import _entry_checks as checks
from pytorch_accel.dataloaders import merge_dataloader_kwargs
from pytorch_accel.eval_sets import named_eval_sets
from pytorch_accel.preparation import Preparation

__all__ = ["TrainerDataLoaders"]


class TrainerDataLoaders:
    """Create a run's train and eval dataloaders (part of ``Trainer``)."""

    train_dataset: Any
    eval_dataset: Any
    collate_fn: Callable[..., Any] | None
    _train_dl_kwargs: dict[str, Any]
    _eval_dl_kwargs: dict[str, Any]
    _accelerator: Accelerator
    _preparation: Preparation

    def _dataloaders(
        self,
        train: Any,
        evaluation: Any,
        batch_size: int | None,
        train_kwargs: Mapping[str, Any] | None,
        eval_kwargs: Mapping[str, Any] | None,
    ) -> tuple[DataLoader[Any], dict[str | None, DataLoader[Any]]]:
        """This run's dataloaders: those the user built, or built from the datasets."""
        self._train_dl_kwargs = {}
        train_dl = self._adopt("train", train)
        if train_dl is None:
            train_dl = self.create_train_dataloader(batch_size or 8, train_kwargs)
        if checks.has_length(self.train_dataset):
            num_processes = self._accelerator.num_processes
            checks.check_enough_samples(train_dl, len(self.train_dataset), num_processes)
        return train_dl, self._eval_dataloaders(evaluation, batch_size or 8, eval_kwargs)

    def _eval_dataloaders(
        self, evaluation: Any, batch_size: int, eval_kwargs: Mapping[str, Any] | None
    ) -> dict[str | None, DataLoader[Any]]:
        """One dataloader per eval set (``{}`` for none), adopted or built.

        While a set's dataloader is built, ``eval_dataset`` is that set, so an overridden
        ``create_eval_dataloader`` builds each one; afterwards it is what was passed (a mapping
        of named sets), or the one set's dataset.
        """
        self._eval_dl_kwargs, self.eval_dataset = {}, None
        if evaluation is None:
            return {}
        loaders: dict[str | None, DataLoader[Any]] = {}
        first_kwargs: dict[str, Any] | None = None
        for name, data in named_eval_sets("Trainer", "eval_dataset", evaluation).items():
            loader = self._adopt("eval", data)
            if loader is None:
                loader = self.create_eval_dataloader(batch_size, eval_kwargs)
            loaders[name] = loader
            first_kwargs = self._eval_dl_kwargs if first_kwargs is None else first_kwargs
        self._eval_dl_kwargs = first_kwargs or {}
        if None not in loaders:
            self.eval_dataset = evaluation
        return loaders

    def _adopt(self, role: str, data: Any) -> DataLoader[Any] | None:
        """Set ``<role>_dataset`` from ``data``; return ``data`` if it is a DataLoader."""
        loader = data if isinstance(data, DataLoader) else None
        setattr(self, f"{role}_dataset", data if loader is None else loader.dataset)
        setattr(
            self, f"_{role}_dl_kwargs", {} if loader is None else checks.loader_settings(loader)
        )
        return loader

    def create_train_dataloader(
        self, batch_size: int, train_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the train dataloader from ``get_default_train_dl_kwargs`` and overrides."""
        self._train_dl_kwargs = merge_dataloader_kwargs(
            self.get_default_train_dl_kwargs(batch_size), train_dl_kwargs
        )
        return DataLoader(self.train_dataset, **self._train_dl_kwargs)

    def create_eval_dataloader(
        self, batch_size: int, eval_dl_kwargs: Mapping[str, Any] | None = None
    ) -> DataLoader[Any]:
        """Create the eval dataloader from ``get_default_eval_dl_kwargs`` and overrides."""
        self._eval_dl_kwargs = merge_dataloader_kwargs(
            self.get_default_eval_dl_kwargs(batch_size), eval_dl_kwargs
        )
        return DataLoader(self.eval_dataset, **self._eval_dl_kwargs)

    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Return the default train ``DataLoader`` arguments (shuffled, unless a stream)."""
        return self._preparation.default_dl_kwargs(
            self.train_dataset, batch_size, shuffle=True, collate_fn=self.collate_fn
        )

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Return the default eval ``DataLoader`` arguments (not shuffled)."""
        return self._preparation.default_dl_kwargs(
            self.eval_dataset, batch_size, shuffle=False, collate_fn=self.collate_fn
        )
