"""ModelEmaCallback in real training runs: the average, its evaluation, the swap, the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_regression_dataset, make_trainer
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel._checkpointing.checkpoint import load_checkpoint_file
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.ema import ModelEmaCallback

TRAIN, EVAL = make_regression_dataset(32), make_regression_dataset(20, seed=1)
UNSHUFFLED = {"shuffle": False}
State = dict[str, torch.Tensor]


def make_bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))


def snapshot(trainer: Trainer) -> State:
    return {name: t.detach().clone() for name, t in trainer.get_model().state_dict().items()}


def assert_states_equal(actual: State, expected: State) -> None:
    assert actual.keys() == expected.keys()
    for name in actual:
        assert torch.equal(actual[name], expected[name]), name


class WeightLog(TrainerCallback):
    """Snapshots the model at the start of each run and after each update."""

    def __init__(self) -> None:
        self.start: State = {}
        self.updates: list[State] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.start = snapshot(trainer)

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.updates.append(snapshot(trainer))


class Around(TrainerCallback):
    """Snapshots the model at ``on_training_run_epoch_end`` with a given order."""

    def __init__(self, order: int) -> None:
        self.order = order  # type: ignore[misc]
        self.states: list[State] = []

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.states.append(snapshot(trainer))


def hand_computed_ema(
    start: State, updates: list[State], decay: float, warmup_from: int | None = 0
) -> State:
    """The EMA of ``updates``, warmed up as timm's ModelEmaV3 from update ``warmup_from``.

    ``warmup_from=None``: the constant ``decay``.
    """
    ema = {name: tensor.clone() for name, tensor in start.items()}
    for index, weights in enumerate(updates):
        rate = decay
        if warmup_from is not None:
            rate = min(decay, 1 - (1 + warmup_from + index) ** (-2 / 3))
        for name, tensor in weights.items():
            if tensor.is_floating_point():
                ema[name] = rate * ema[name] + (1 - rate) * tensor
            else:
                ema[name] = tensor.clone()
    return ema


def train_with_ema(
    ema: ModelEmaCallback, *extra: TrainerCallback, epochs: int = 2, **options: Any
) -> Trainer:
    trainer = make_trainer(make_bn_model(), callbacks=(ema, *extra))
    trainer.train(
        TRAIN,
        num_epochs=epochs,
        eval_dataset=EVAL,
        per_device_batch_size=8,
        train_dataloader_kwargs=UNSHUFFLED,
        **options,
    )
    return trainer


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"decay": 1.0}, ValueError, r"decay must be between 0 and 1 \(exclusive\)"),
        ({"decay": 0}, ValueError, r"decay must be between 0 and 1"),
        ({"decay": "0.9"}, TypeError, r"decay must be a float"),
        ({"decay": True}, TypeError, r"decay must be a float"),
        ({"evaluate_during_training": 1}, TypeError, r"evaluate_during_training must be a bool"),
        ({"save_path": 5}, TypeError, r"save_path must be a file path or None"),
        ({"reset_on_train": "no"}, TypeError, r"reset_on_train must be a bool"),
    ],
)
def test_constructor_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=r"^ModelEmaCallback: " + match):
        ModelEmaCallback(**kwargs)


def test_ema_equals_a_hand_computed_average_after_each_update(tmp_path: Path) -> None:
    log = WeightLog()
    ema = ModelEmaCallback(decay=0.8, evaluate_during_training=False, save_path=None)
    train_with_ema(ema, log, gradient_accumulation_steps=3)
    assert len(log.updates) == ema.num_ema_updates == 2 * 2  # ceil(4 batches / 3) per epoch
    expected = hand_computed_ema(log.start, log.updates, 0.8)
    actual = ema.state_dict()["ema_state_dict"]
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        torch.testing.assert_close(tensor, expected[name])
    tracked = "1.num_batches_tracked"
    assert actual[tracked].dtype == torch.long
    assert int(actual[tracked]) == int(log.updates[-1][tracked]) == 8  # copied, not averaged


def test_the_decay_warms_up_by_default_as_timm_model_ema_v3() -> None:
    log = WeightLog()
    ema = ModelEmaCallback(evaluate_during_training=False, save_path=None)  # decay 0.99
    train_with_ema(ema, log, epochs=1)
    first = hand_computed_ema(log.start, log.updates[:1], 0.99)
    assert_states_equal(first, log.updates[0])  # the first update copies the weights
    expected = hand_computed_ema(log.start, log.updates, 0.99)
    for name, tensor in ema.state_dict()["ema_state_dict"].items():
        torch.testing.assert_close(tensor, expected[name])
    assert ema.current_decay() == pytest.approx(1 - 5 ** (-2 / 3))  # after 4 updates


def test_warmup_false_uses_the_decay_from_the_first_update() -> None:
    log = WeightLog()
    ema = ModelEmaCallback(evaluate_during_training=False, save_path=None, warmup=False)
    train_with_ema(ema, log, epochs=1)
    expected = hand_computed_ema(log.start, log.updates, 0.99, warmup_from=None)
    for name, tensor in ema.state_dict()["ema_state_dict"].items():
        torch.testing.assert_close(tensor, expected[name])
    assert ema.current_decay() == 0.99


def test_ema_evaluation_records_its_metric_and_restores_the_weights_exactly() -> None:
    before, after = Around(30), Around(45)
    ema = ModelEmaCallback(decay=0.5, save_path=None)
    trainer = train_with_ema(ema, before, after, epochs=3)
    history = trainer.run_history
    assert len(history.get_metric_values("ema_model_eval_loss_epoch")) == 3
    assert len(history.get_metric_values("eval_loss_epoch")) == 3
    assert history.metric_name_prefix == ""
    for state_before, state_after in zip(before.states, after.states, strict=True):
        assert_states_equal(state_after, state_before)
    # The last value is the loss of the final EMA weights on the whole eval set.
    reference = make_bn_model()
    reference.load_state_dict(ema.state_dict()["ema_state_dict"])
    reference.eval()
    inputs, targets = EVAL.tensors
    expected = nn.functional.mse_loss(reference(inputs), targets).item()
    assert history.get_latest_metric("ema_model_eval_loss_epoch") == pytest.approx(expected)
    assert expected != pytest.approx(history.get_latest_metric("eval_loss_epoch"))


def test_training_is_unchanged_by_the_ema_and_its_evaluation() -> None:
    torch.manual_seed(3)
    plain = make_trainer(make_bn_model())
    plain.train(TRAIN, num_epochs=3, eval_dataset=EVAL, per_device_batch_size=8)
    torch.manual_seed(3)
    trainer = make_trainer(make_bn_model(), callbacks=(ModelEmaCallback(save_path=None),))
    trainer.train(TRAIN, num_epochs=3, eval_dataset=EVAL, per_device_batch_size=8)  # shuffled
    assert_states_equal(snapshot(trainer), snapshot(plain))
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert trainer.run_history.get_metric_values(name) == plain.run_history.get_metric_values(
            name
        )


def test_metric_callbacks_record_under_the_ema_prefix_during_its_evaluation() -> None:
    class CountEvalSteps(TrainerCallback):
        def __init__(self) -> None:
            self.steps = 0

        def on_eval_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            self.steps += 1

        def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.run_history.update_metric("eval_steps", self.steps)
            self.steps = 0

    trainer = train_with_ema(ModelEmaCallback(save_path=None), CountEvalSteps(), epochs=1)
    assert trainer.run_history.get_metric_values("ema_model_eval_steps") == [3]
    assert trainer.run_history.get_metric_values("eval_steps") == [3]


@pytest.mark.parametrize("stop", [False, True])
def test_the_swap_is_undone_when_the_evaluation_raises(stop: bool) -> None:
    class RaiseInEmaEval(TrainerCallback):
        def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
            if trainer.run_history.metric_name_prefix == "ema_model_":
                raise StopTrainingError("stop") if stop else RuntimeError("boom")

    before = Around(30)
    callbacks = (ModelEmaCallback(save_path=None), RaiseInEmaEval(), before)
    trainer = make_trainer(make_bn_model(), callbacks=callbacks)
    if stop:
        trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)  # a clean stop
    else:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)
    assert len(before.states) == 1
    assert trainer.run_history.metric_name_prefix == ""
    assert_states_equal(snapshot(trainer), before.states[0])


def test_the_ema_weights_are_saved_at_the_end_and_load_into_a_model(tmp_path: Path) -> None:
    ema = ModelEmaCallback(decay=0.9, evaluate_during_training=False, save_path=tmp_path / "e.pt")
    train_with_ema(ema)
    checkpoint = load_checkpoint_file(tmp_path / "e.pt")
    assert_states_equal(checkpoint["model_state_dict"], ema.state_dict()["ema_state_dict"])
    assert checkpoint["ema_decay"] == 0.9
    assert checkpoint["num_ema_updates"] == 8
    assert "optimizer_state_dict" not in checkpoint
    other = make_trainer(make_bn_model())
    other.load_checkpoint(tmp_path / "e.pt")
    assert_states_equal(snapshot(other), ema.state_dict()["ema_state_dict"])


def test_no_eval_set_or_evaluation_off_records_no_ema_metric() -> None:
    trainer = make_trainer(make_bn_model(), callbacks=(ModelEmaCallback(save_path=None),))
    trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)
    off = train_with_ema(ModelEmaCallback(evaluate_during_training=False, save_path=None))
    for history in (trainer.run_history, off.run_history):
        assert not any(name.startswith("ema_model_") for name in history.get_metric_names())


def test_state_dict_round_trip_continues_the_average() -> None:
    first = ModelEmaCallback(decay=0.7, evaluate_during_training=False, save_path=None)
    trainer = train_with_ema(first, epochs=1)
    saved = {k: v.clone() for k, v in first.state_dict()["ema_state_dict"].items()}
    second = ModelEmaCallback(decay=0.7, evaluate_during_training=False, save_path=None)
    second.load_state_dict(first.state_dict())
    log = WeightLog()
    resumed = make_trainer(make_bn_model(), callbacks=(second, log))
    resumed.get_model().load_state_dict(trainer.get_model().state_dict())
    resumed.train(TRAIN, num_epochs=1, per_device_batch_size=8)
    expected = hand_computed_ema(saved, log.updates, 0.7, warmup_from=4)  # continued
    for name, tensor in second.state_dict()["ema_state_dict"].items():
        torch.testing.assert_close(tensor, expected[name])
    assert second.num_ema_updates == 8


def test_reset_on_train_restarts_from_the_model() -> None:
    ema = ModelEmaCallback(0.9, evaluate_during_training=False, save_path=None, reset_on_train=True)
    log = WeightLog()
    trainer = make_trainer(make_bn_model(), callbacks=(ema, log))
    trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)
    log.updates.clear()
    trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)
    expected = hand_computed_ema(log.start, log.updates, 0.9)
    for name, tensor in ema.state_dict()["ema_state_dict"].items():
        torch.testing.assert_close(tensor, expected[name])


def test_an_ema_that_does_not_fit_the_model_is_an_error() -> None:
    ema = ModelEmaCallback(save_path=None)
    ema.load_state_dict({"ema_state_dict": {"weight": torch.zeros(3)}})
    trainer = make_trainer(make_bn_model(), callbacks=(ema,))
    with pytest.raises(ValueError, match=r"the EMA does not fit the model .* reset_on_train=True"):
        trainer.train(TRAIN, num_epochs=1)
    with pytest.raises(ValueError, match=r"ema_state_dict'\] must be a non-empty dict"):
        ema.load_state_dict({})


def test_swapped_into_evaluates_the_ema_weights_after_training() -> None:
    ema = ModelEmaCallback(decay=0.9, evaluate_during_training=False, save_path=None)
    trainer = train_with_ema(ema)
    weights = snapshot(trainer)
    averaged = {k: v.clone() for k, v in ema.state_dict()["ema_state_dict"].items()}
    with ema.swapped_into(trainer):
        assert_states_equal(snapshot(trainer), averaged)
        trainer.evaluate(EVAL)
    assert_states_equal(snapshot(trainer), weights)
    assert_states_equal(ema.state_dict()["ema_state_dict"], averaged)
    assert trainer.run_history.get_latest_metric("evaluation_loss") != pytest.approx(
        trainer.run_history.get_latest_metric("eval_loss_epoch")
    )
