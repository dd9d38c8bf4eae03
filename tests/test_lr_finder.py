"""The learning-rate range test, ``Trainer.find_lr``, in one process (2 processes: distributed)."""

from __future__ import annotations

import copy
import functools
import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import TokenDataset, make_regression_dataset, make_tiny_bert
from torch import nn
from torch.optim.lr_scheduler import StepLR

from pytorch_accel import Trainer
from pytorch_accel.tools.lr_finder import LRFinderResult, steepest_index, valley_index


def make_model(seed: int = 0) -> nn.Module:
    """Weights, buffers (batch norm) and random draws (dropout): everything a sweep changes."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)
    )


def make_trainer(trainer_class: type[Trainer] = Trainer, lr: float = 0.01) -> Trainer:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return trainer_class(model, nn.MSELoss(), optimizer, callbacks=())


DATA = make_regression_dataset(96)


def everything(trainer: Trainer) -> dict[str, Any]:
    """A deep copy of all a sweep must leave unchanged."""
    model = trainer.model
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "lrs": [group["lr"] for group in trainer.optimizer.param_groups],
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "modes": [module.training for module in model.modules()],
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].copy(),
    }


def assert_same(before: Any, after: Any) -> None:
    if isinstance(before, torch.Tensor):
        assert torch.equal(before, after)
    elif isinstance(before, dict):
        assert before.keys() == after.keys()
        for key in before:
            assert_same(before[key], after[key])
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after)
        for mine, theirs in zip(before, after, strict=True):
            assert_same(mine, theirs)
    elif isinstance(before, np.ndarray):
        assert np.array_equal(before, after)
    else:
        assert before == after


def test_a_sweep_leaves_model_optimizer_scheduler_and_random_states_bitwise_as_they_were() -> None:
    trainer = make_trainer()
    trainer.train(  # a trained state: Adam moments, a scheduler, grads, a model in eval mode
        DATA,
        num_epochs=1,
        per_device_batch_size=16,
        create_scheduler_fn=functools.partial(StepLR, step_size=2, gamma=0.5),
    )
    trainer.model.eval()
    trainer.model[0].weight.grad = torch.ones_like(trainer.model[0].weight)
    before = everything(trainer)
    result = trainer.find_lr(DATA, per_device_batch_size=16, num_steps=30)
    assert len(result.lrs) >= 10  # it did train: the comparison can fail
    assert_same(before, everything(trainer))


def test_the_sweep_changes_what_it_restores() -> None:
    """Without the restore, the weights and random states would differ (the test can fail)."""
    from pytorch_accel.tools.lr_finder import Snapshot

    trainer = make_trainer()
    before = everything(trainer)
    original = Snapshot.restore
    try:
        Snapshot.restore = lambda self, trainer: None  # type: ignore[method-assign]
        trainer.find_lr(DATA, per_device_batch_size=16, num_steps=10, divergence=None)
    finally:
        Snapshot.restore = original  # type: ignore[method-assign]
    changed = everything(trainer)
    assert not torch.equal(before["model"]["0.weight"], changed["model"]["0.weight"])
    assert not torch.equal(before["model"]["1.running_mean"], changed["model"]["1.running_mean"])
    assert before["lrs"] != changed["lrs"]


def test_train_after_find_lr_gives_the_same_weights_as_train_alone() -> None:
    def run(sweep_first: bool) -> list[torch.Tensor]:
        torch.manual_seed(7)
        trainer = make_trainer()
        if sweep_first:
            trainer.find_lr(DATA, per_device_batch_size=16, num_steps=20)
        trainer.train(DATA, num_epochs=2, per_device_batch_size=16)
        return [p.detach().clone() for p in trainer.model.parameters()]

    for mine, theirs in zip(run(True), run(False), strict=True):
        assert torch.equal(mine, theirs)


def test_the_sweep_is_exponential_smoothed_and_stops_on_divergence() -> None:
    trainer = make_trainer(lr=0.01)
    result = trainer.find_lr(
        DATA, per_device_batch_size=16, start_lr=1e-5, end_lr=1e3, num_steps=50, check_every=1
    )
    n = len(result.lrs)
    assert result.diverged_at == n - 1 < 49  # Adam at 1e3 diverges
    expected = [1e-5 * (1e3 / 1e-5) ** (i / 49) for i in range(n)]
    assert result.lrs == pytest.approx(expected, rel=1e-12)
    average, smoothed = 0.0, []
    for i, loss in enumerate(result.losses, start=1):
        average = 0.98 * average + 0.02 * loss
        smoothed.append(average / (1 - 0.98**i))
    assert result.smoothed_losses == pytest.approx(smoothed, rel=1e-12)
    last = result.smoothed_losses[-1]
    assert not math.isfinite(last) or last > 4 * min(result.smoothed_losses[:-1])
    assert all(s <= 4 * min(result.smoothed_losses[: i + 1]) for i, s in enumerate(smoothed[:-1]))
    assert result.suggestion == result.valley is not None
    assert 1e-5 < result.suggestion < result.lrs[-1]
    assert "suggested lr (valley)" in str(result)


def test_without_divergence_it_sweeps_to_end_lr() -> None:
    result = make_trainer().find_lr(
        DATA, per_device_batch_size=16, num_steps=12, end_lr=1e-3, divergence=None
    )
    assert len(result.lrs) == len(result.losses) == 12
    assert result.lrs[0] == 1e-7
    assert result.lrs[-1] == pytest.approx(1e-3, rel=1e-12)
    assert result.diverged_at is None


def test_checking_every_n_updates_gives_the_same_result_as_every_update() -> None:
    """The updates run past a divergence between two checks are discarded."""
    results = [
        make_trainer().find_lr(
            DATA, per_device_batch_size=16, end_lr=1e3, num_steps=60, check_every=every
        )
        for every in (1, 7)
    ]
    assert results[0].diverged_at is not None
    assert results[0] == results[1]


def test_steps_go_through_the_trainers_step_methods_with_accumulation() -> None:
    calls = {"loss": 0, "backward": 0, "optimizer": 0}

    class Counting(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            calls["loss"] += 1
            return super().calculate_train_batch_loss(batch)

        def backward_step(self, loss: torch.Tensor) -> None:
            calls["backward"] += 1
            super().backward_step(loss)

        def optimizer_step(self) -> None:
            calls["optimizer"] += 1
            super().optimizer_step()

    trainer = make_trainer(Counting)
    result = trainer.find_lr(
        DATA, per_device_batch_size=8, num_steps=15, gradient_accumulation_steps=3, divergence=None
    )
    # 15 updates of 3 micro-batches: 45 batches, more than the 12 of one pass
    assert calls == {"loss": 45, "backward": 45, "optimizer": 15}
    assert len(result.losses) == 15


def test_dict_batches_of_a_hugging_face_model() -> None:
    model = make_tiny_bert()
    trainer = Trainer(model, None, torch.optim.AdamW(model.parameters(), lr=1e-3), callbacks=())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = trainer.find_lr(TokenDataset(64), per_device_batch_size=8, num_steps=20)
    assert len(result.losses) >= 10
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def fastai_valley(lrs: list[float], losses: list[float]) -> float:
    """fastai's ``valley``, as fastai 2.7 writes it."""
    n = len(losses)
    max_start, max_end = 0, 0
    lds = [1] * n
    for i in range(1, n):
        for j in range(0, i):
            if (losses[i] < losses[j]) and (lds[i] < lds[j] + 1):
                lds[i] = lds[j] + 1
            if lds[max_end] < lds[i]:
                max_end = i
                max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    idx = max_start + int(sections) + int(sections / 2)
    return lrs[idx]


@pytest.mark.parametrize("seed", range(5))
def test_suggestions_match_fastai_valley_and_numpy_gradient(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lrs = list(np.geomspace(1e-6, 1, 40))
    losses = list(2 - np.tanh(np.linspace(-3, 3, 40)) + rng.normal(0, 0.1, 40))
    assert lrs[valley_index(losses)] == fastai_valley(lrs, losses)
    assert steepest_index(losses) == int(np.gradient(np.array(losses)).argmin())


def test_plot_draws_the_curve_and_the_suggestion(tmp_path: Path) -> None:
    result = make_trainer().find_lr(DATA, per_device_batch_size=16, num_steps=30)
    ax = result.plot(path=str(tmp_path / "lr.png"))
    assert (tmp_path / "lr.png").stat().st_size > 0
    assert ax.get_xscale() == "log"
    assert len(ax.lines) == 2  # the curve and the suggestion


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    result = LRFinderResult(
        [1e-3, 1e-2], [1.0, 0.5], [1.0, 0.7], None, "valley", None, None, None, None
    )
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r'pip install "pytorch-accel\[plot\]"'):
        result.plot()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"end_lr": 1e-8}, ValueError, r"end_lr must be greater than start_lr \(1e-07\)"),
        ({"num_steps": 1}, ValueError, r"num_steps must be at least 2, got 1"),
        ({"method": "min"}, ValueError, r"method must be 'valley', 'steepest' or 'minimum'"),
        ({"smoothing": 1.0}, ValueError, r"smoothing must be in \[0, 1\), got 1.0"),
        ({"divergence": 0}, ValueError, r"divergence must be a number > 0 or None, got 0"),
        ({"start_lr": "1e-7"}, TypeError, r"start_lr must be a finite number > 0"),
        ({"check_every": 0}, ValueError, r"check_every must be a positive int, got 0"),
        ({"max_grad_norm": 0}, ValueError, r"max_grad_norm must be a number > 0 or None"),
        ({"train_dataset": None}, TypeError, r"train_dataset must be a map-style dataset"),
        (
            {"train_dataset": torch.utils.data.DataLoader(DATA), "per_device_batch_size": 4},
            ValueError,
            r"per_device_batch_size must be None when train_dataset is a DataLoader",
        ),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    trainer = make_trainer()
    with pytest.raises(error, match=rf"Trainer\.find_lr: {match}"):
        trainer.find_lr(**{"train_dataset": DATA, **kwargs})


def test_steepest_ignores_a_descent_after_a_spike_and_minimum_is_a_tenth_of_the_lowest() -> None:
    from pytorch_accel.tools.lr_finder import _Sweep

    # flat, a descent to the lowest loss at index 29, a spike, then a long fall from it
    curve = (
        [2.3] * 15
        + [2.3 - 0.02 * i for i in range(1, 16)]
        + [4.0]
        + [3.9 - 0.1 * i for i in range(19)]
    )
    lrs = [10 ** (-7 + 8 * i / 49) for i in range(50)]
    sweep = _Sweep(lrs, 0.0, None, 5)
    for loss in curve:
        sweep.record(torch.tensor(loss))
    result = sweep.result("steepest")
    assert result.smoothed_losses == pytest.approx(curve)
    assert lrs.index(result.steepest) in range(15, 31)  # the descent, not the fall after the spike
    assert result.minimum == pytest.approx(lrs[29] / 10)  # the lowest of [5, 45)
    assert result.suggestion == result.steepest


def test_the_host_reads_the_losses_once_per_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads by the package (the data loader's own, of CPU seeds and orders, are not counted)."""
    reads: list[str] = []
    for name in ("item", "__bool__", "__float__", "__int__", "tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _n: str = name, _o: Any = original) -> Any:
            if sys._getframe(1).f_globals.get("__name__", "").startswith("pytorch_accel"):
                reads.append(_n)
            return _o(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    model = make_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.find_lr(DATA, per_device_batch_size=16, num_steps=25, end_lr=1e-2, check_every=10)
    assert reads == ["tolist"] * 3  # after updates 10, 20 and 25: not once per update


def test_gradients_are_clipped_as_in_training() -> None:
    def sweep(**clipping: float) -> LRFinderResult:
        model = make_model()
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
        return trainer.find_lr(DATA, per_device_batch_size=16, end_lr=100.0, **clipping)

    assert sweep().diverged_at is not None
    # with every gradient element clipped to 1e-9 the weights barely move, even at lr 100
    assert sweep(gradient_clip_value=1e-9).diverged_at is None
    assert sweep(max_grad_norm=1e-9).diverged_at is None


@pytest.mark.bad_input
def test_find_lr_inside_train_is_refused() -> None:
    from pytorch_accel.callbacks import TrainerCallback

    class SweepInside(TrainerCallback):
        def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.find_lr(DATA)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(SweepInside(),))
    with pytest.raises(RuntimeError, match=r"Trainer\.find_lr: called while train\(\) is running"):
        trainer.train(DATA, num_epochs=1)
