"""Run history and the on-device loss tracker."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator

from pytorch_accel.tracking import InMemoryRunHistory, LossTracker, MetricNotFoundError


def test_reading_an_unrecorded_metric_is_a_clear_error_and_creates_nothing() -> None:
    history = InMemoryRunHistory()
    history.update_metric("train_loss_epoch", 1.0)
    with pytest.raises(
        MetricNotFoundError, match=r"'eval_loss_epoch'.*Recorded metrics: train_loss_epoch"
    ):
        history.get_latest_metric("eval_loss_epoch")
    with pytest.raises(ValueError, match="eval_loss_epoch"):  # pytorch-accelerated raised this
        history.get_metric_values("eval_loss_epoch")
    with pytest.raises(KeyError):
        history.delete_metric("eval_loss_epoch")
    assert history.get_metric_names() == {"train_loss_epoch"}


def test_prefix_epoch_and_reset() -> None:
    history = InMemoryRunHistory()
    history.set_metric_name_prefix("ema_model_")
    history.update_metric("eval_loss_epoch", 2.0)
    history.set_metric_name_prefix()
    history.update_metric("eval_loss_epoch", 3.0)
    assert history.metric_name_prefix == ""
    assert history.get_metric_values("ema_model_eval_loss_epoch") == [2.0]
    assert history.get_latest_metric("eval_loss_epoch") == 3.0
    values = history.get_metric_values("eval_loss_epoch")
    values.append(99.0)  # a copy: the history is not changed through it
    assert history.get_metric_values("eval_loss_epoch") == [3.0]
    history._increment_epoch()
    assert history.current_epoch == 2
    history.delete_metric("eval_loss_epoch")
    history.reset()
    assert history.current_epoch == 1
    assert history.get_metric_names() == set()


def test_loss_tracker_is_sample_weighted_and_stays_on_device() -> None:
    tracker = LossTracker()
    assert tracker.reduce(Accelerator(cpu=True)) != tracker.reduce(Accelerator(cpu=True))  # nan
    tracker.update(torch.tensor(1.0), 3)
    tracker.update(torch.tensor([2.0, 4.0]), 1)  # per-sample losses are averaged
    tracker.update(torch.tensor(0.5, dtype=torch.bfloat16), 4)
    assert isinstance(tracker.total_loss, torch.Tensor)
    assert tracker.total_loss.dtype == torch.float32
    assert tracker.running_count == 8
    expected = (1.0 * 3 + 3.0 * 1 + 0.5 * 4) / 8
    assert tracker.average == pytest.approx(expected)
    assert tracker.reduce(Accelerator(cpu=True)) == pytest.approx(expected)
    assert tracker.loss_value is not None
    assert tracker.loss_value.item() == 0.5
    tracker.reset()
    assert tracker.total_loss is None
    assert tracker.running_count == 0


def test_loss_tracker_detaches() -> None:
    weight = torch.ones(1, requires_grad=True)
    tracker = LossTracker()
    tracker.update((weight * 2).sum(), 2)
    assert tracker.total_loss is not None
    assert not tracker.total_loss.requires_grad


@pytest.mark.parametrize("fold_every", [1, 3, 256])
def test_folding_pending_losses_is_exact(fold_every: int) -> None:
    tracker = LossTracker()
    tracker.fold_every = fold_every
    losses = [0.5, 1.5, 2.0, 4.0, 3.25, 1.0, 0.75]
    sizes = [4, 4, 4, 4, 4, 4, 2]
    for loss, size in zip(losses, sizes, strict=True):
        tracker.update(torch.tensor(loss), size)
    expected = sum(loss * size for loss, size in zip(losses, sizes, strict=True))
    assert tracker.total_loss is not None
    assert tracker.total_loss.item() == pytest.approx(expected)
    assert tracker.reduce(Accelerator(cpu=True)) == pytest.approx(expected / sum(sizes))


def test_tensor_batch_sizes_are_supported() -> None:
    tracker = LossTracker()
    tracker.update(torch.tensor(2.0), torch.tensor(3))
    tracker.update(torch.tensor(1.0), torch.tensor(1))
    assert tracker.average == pytest.approx(7 / 4)


@pytest.mark.parametrize("fold_every", [1, 3, 256])
def test_count_last_value_and_state_are_the_same_either_side_of_a_fold(fold_every: int) -> None:
    weight = torch.ones(1, requires_grad=True)
    tracker = LossTracker()
    tracker.fold_every = fold_every
    for step, size in enumerate([4, 4, 2, 4, 1], start=1):
        tracker.update((weight * step).sum(), size)
        assert tracker.loss_value is not None
        assert tracker.loss_value.item() == step
        assert not tracker.loss_value.requires_grad
    assert tracker.running_count == 15
    restored = LossTracker()
    restored.fold_every = fold_every
    restored.load_state_dict(tracker.state_dict(), torch.device("cpu"))
    for copy in (tracker, restored):  # the restored copy goes on exactly as the original
        copy.update(torch.tensor(6.0), 3)
        assert copy.running_count == 18
        assert copy.loss_value is not None
        assert copy.loss_value.item() == 6.0
    assert tracker.total_loss is not None
    assert restored.total_loss is not None
    assert torch.equal(tracker.total_loss, restored.total_loss)
    assert tracker.total_loss.item() == 1 * 4 + 2 * 4 + 3 * 2 + 4 * 4 + 5 * 1 + 6 * 3
