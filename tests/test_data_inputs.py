"""DataLoaders the user built, as train, eval and evaluate inputs (accelerate prepares them)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

DATA = make_regression_dataset(40)
EVAL = make_regression_dataset(12, seed=1)


def stacked(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """A collate function of the user's own (what default_collate does, by hand)."""
    return [torch.stack([sample[0] for sample in samples]), torch.stack([s[1] for s in samples])]


def test_a_users_dataloader_trains_exactly_as_the_dataset_with_the_same_settings() -> None:
    from_dataset = make_trainer()
    from_dataset.train(
        DATA,
        num_epochs=2,
        eval_dataset=EVAL,
        per_device_batch_size=8,
        train_dataloader_kwargs={"shuffle": False, "collate_fn": stacked},
    )
    from_loader = make_trainer()
    loader = DataLoader(DATA, batch_size=8, shuffle=False, collate_fn=stacked)
    from_loader.train(loader, num_epochs=2, eval_dataset=DataLoader(EVAL, batch_size=8))
    for mine, theirs in zip(
        clone_params(from_loader.model), clone_params(from_dataset.model), strict=True
    ):
        assert torch.equal(mine, theirs)
    history = from_loader.run_history
    assert history.get_metric_values("eval_loss_epoch") == (
        from_dataset.run_history.get_metric_values("eval_loss_epoch")
    )
    assert from_loader.train_dataset is DATA
    assert from_loader.run_config.train_per_device_batch_size == 8
    assert from_loader.run_config.train_dl_kwargs["collate_fn"] is stacked


def test_a_dataloader_with_its_own_batch_sampler_and_evaluate() -> None:
    sampler = BatchSampler(SequentialSampler(DATA), batch_size=5, drop_last=False)
    trainer = make_trainer()
    trainer.train(DataLoader(DATA, batch_sampler=sampler), num_epochs=1)
    assert trainer.run_config.train_dataloader_len == 8
    trainer.evaluate(DataLoader(EVAL, batch_size=4))
    loss = trainer.run_history.get_latest_metric("evaluation_loss")
    trainer.evaluate(EVAL, per_device_batch_size=4)
    assert trainer.run_history.get_latest_metric("evaluation_loss") == pytest.approx(loss)


@pytest.mark.parametrize(
    ("entry", "kwargs", "name"),
    [
        ("train", {"per_device_batch_size": 4}, "per_device_batch_size"),
        ("train", {"train_dataloader_kwargs": {"num_workers": 0}}, "train_dataloader_kwargs"),
        ("train", {"collate_fn": stacked}, "collate_fn"),
        ("evaluate", {"per_device_batch_size": 4}, "per_device_batch_size"),
        ("evaluate", {"dataloader_kwargs": {}}, "dataloader_kwargs"),
    ],
)
def test_settings_that_would_build_a_dataloader_are_refused_with_one(
    entry: str, kwargs: dict[str, Any], name: str
) -> None:
    trainer = make_trainer(make_model())
    history = trainer.run_history
    history.update_metric("kept", 1.0)
    call = getattr(trainer, entry)
    extra = {"num_epochs": 1} if entry == "train" else {}
    data = "train_dataset" if entry == "train" else "dataset"
    match = rf"Trainer\.{entry}: {name} must be None when {data} is a DataLoader"
    with pytest.raises(ValueError, match=match):
        call(DataLoader(DATA, batch_size=4), **extra, **kwargs)
    assert history.get_latest_metric("kept") == 1.0  # refused before anything was reset


def test_a_dataloader_over_an_empty_dataset_is_named() -> None:
    with pytest.raises(
        ValueError, match=r"train_dataset.dataset \(of the DataLoader\) must be non-empty"
    ):
        make_trainer().train(DataLoader(make_regression_dataset(0)), num_epochs=1)
