"""Streams that save their position resume mid-pass without replaying: bitwise equal to an
uninterrupted run, and without loading the batches already trained on."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.utils import DataLoaderConfiguration
from helpers import SaveAtStep, clone_params, make_model, make_regression_dataset
from torch import nn
from torch.utils.data import IterableDataset

from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.trainer import Trainer

TORCHDATA = importlib.util.find_spec("torchdata") is not None
needs_torchdata = pytest.mark.skipif(not TORCHDATA, reason="torchdata is not installed")
DATA = make_regression_dataset(24)  # 6 batches of 4 per pass


class PositionedStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """The samples of DATA in an order drawn per pass from its own seed, and its position.

    Split between dataloader workers: worker w of n takes every n-th sample.

    ``loaded`` counts the samples read, to show that a resume reads none twice.
    """

    def __init__(self) -> None:
        self.epoch, self.index, self.loaded = 0, 0, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()  # worker w of n takes every n-th sample
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        inputs, targets = DATA.tensors
        order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(self.epoch))
        while self.index < len(order):
            index, self.index = int(order[self.index]), self.index + 1
            if (self.index - 1) % workers == worker:
                self.loaded += 1
                yield inputs[index], targets[index]
        self.epoch, self.index = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = state["epoch"], state["index"]


def run(
    dataset: PositionedStream | CountingMapData,
    *callbacks: TrainerCallback,
    resume_from: Path | None = None,
    stateful: bool = False,
    **kwargs: Any,
) -> Trainer:
    torch.manual_seed(5)
    accelerator_kwargs = (
        {"dataloader_config": DataLoaderConfiguration(use_stateful_dataloader=True)}
        if stateful
        else None
    )
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    trainer = Trainer(
        model, nn.MSELoss(), optimizer, callbacks=callbacks, accelerator_kwargs=accelerator_kwargs
    )
    trainer.train(
        dataset,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        resume_from=resume_from,
        **{"max_num_train_steps": 8, **kwargs},
    )
    return trainer


@pytest.mark.parametrize("stateful", [False, pytest.param(True, marks=needs_torchdata)])
@pytest.mark.parametrize("step", [3, 8, 13])  # mid pass 1, mid pass 2, in a window
def test_a_stream_with_a_position_resumes_exactly_without_replay(
    tmp_path: Path, step: int, stateful: bool
) -> None:
    uninterrupted = run(PositionedStream(), stateful=stateful)
    run(PositionedStream(), SaveAtStep(tmp_path / "state", step), stateful=stateful)
    fresh = PositionedStream()
    resumed = run(fresh, resume_from=tmp_path / "state", stateful=stateful)
    assert resumed.num_updates == 8
    for got, expected in zip(
        clone_params(resumed.model), clone_params(uninterrupted.model), strict=True
    ):
        assert torch.equal(got, expected)
    assert resumed.run_history.state_dict() == uninterrupted.run_history.state_dict()
    # 16 steps of 4 samples in all; the resumed run read only those after the save
    assert fresh.loaded <= (16 - step) * 4 + 4  # and the batch loaded ahead


@needs_torchdata
def test_a_stateful_dataloader_with_workers_resumes_exactly(tmp_path: Path) -> None:
    workers = {"train_dataloader_kwargs": {"num_workers": 2}}
    uninterrupted = run(PositionedStream(), stateful=True, **workers)
    run(PositionedStream(), SaveAtStep(tmp_path / "state", 9), stateful=True, **workers)
    resumed = run(PositionedStream(), resume_from=tmp_path / "state", stateful=True, **workers)
    for got, expected in zip(
        clone_params(resumed.model), clone_params(uninterrupted.model), strict=True
    ):
        assert torch.equal(got, expected)


@needs_torchdata
def test_runs_that_end_mid_pass_leave_no_dataloader_workers_behind() -> None:
    # the StatefulDataLoader keeps its iterator: the workers of the pass that the update budget
    # ended (step 16 of 6-batch passes) must not outlive train(), nor be forked again from a
    # process that still feeds them
    workers = {"train_dataloader_kwargs": {"num_workers": 2}}
    trainer = run(PositionedStream(), stateful=True, **workers)
    assert multiprocessing.active_children() == []
    trainer.train(PositionedStream(), per_device_batch_size=4, max_num_train_steps=3, **workers)
    assert trainer.num_updates == 3
    assert multiprocessing.active_children() == []
    trainer.limit_eval_batches = 2  # an evaluation that ends midway through its pass
    trainer.evaluate(DATA, per_device_batch_size=4, dataloader_kwargs={"num_workers": 2})
    assert multiprocessing.active_children() == []


@pytest.mark.bad_input
def test_asking_for_the_stateful_dataloader_without_torchdata_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torchdata", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    model = make_model()
    with pytest.raises(
        ImportError,
        match=r"Trainer: accelerator_kwargs asks for torchdata's StatefulDataLoader.*"
        r"pip install pytorch-accel\[stateful\]",
    ):
        Trainer(
            model,
            nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.1),
            accelerator_kwargs={"dataloader_config": config},
        )


class UnsafeState(PositionedStream):
    def state_dict(self) -> dict[str, Any]:
        return {"where": Path("somewhere")}  # not loadable with weights_only=True


@pytest.mark.bad_input
def test_a_stream_position_that_cannot_be_loaded_safely_fails_the_save(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"save_training_state: .*the train dataset's or "):
        run(UnsafeState(), SaveAtStep(tmp_path / "state", 3))
    assert not (tmp_path / "state").exists()


class CountingMapData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """DATA as a map-style dataset that counts the samples read."""

    def __init__(self) -> None:
        self.loaded = 0

    def __len__(self) -> int:
        return len(DATA)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.loaded += 1
        return DATA[index]


@needs_torchdata
def test_a_map_style_dataset_under_the_stateful_dataloader_still_skips_by_index(
    tmp_path: Path,
) -> None:
    kwargs: dict[str, Any] = {
        "num_epochs": 3,
        "max_num_train_steps": None,
        "train_dataloader_kwargs": {"num_workers": 0},  # counted in this process
    }
    uninterrupted = run(CountingMapData(), stateful=True, **kwargs)
    run(CountingMapData(), SaveAtStep(tmp_path / "state", 8), stateful=True, **kwargs)
    data = CountingMapData()
    resumed = run(data, resume_from=tmp_path / "state", stateful=True, **kwargs)
    for got, expected in zip(
        clone_params(resumed.model), clone_params(uninterrupted.model), strict=True
    ):
        assert torch.equal(got, expected)
    assert data.loaded == (18 - 8) * 4  # shuffled, 3 epochs of 6 batches: none read twice
