"""The trainer's math and run semantics, checked against hand-written PyTorch."""

from __future__ import annotations

import torch
from helpers import (
    RecordingCallback,
    clone_params,
    hand_written_loop,
    make_model,
    make_regression_dataset,
    make_trainer,
)
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer

UNSHUFFLED = {"shuffle": False}


def assert_same_params(model: nn.Module, reference: nn.Module) -> None:
    for trained, expected in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(trained.detach(), expected.detach())


def test_weights_equal_hand_written_loop_bitwise(regression_dataset: TensorDataset) -> None:
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=3)
    trainer = make_trainer(model)
    trainer.train(
        regression_dataset,
        num_epochs=3,
        per_device_batch_size=8,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    assert_same_params(trainer.get_model(), reference)


def test_shuffled_training_equals_hand_written_loop_from_same_seed(
    regression_dataset: TensorDataset,
) -> None:
    model = make_model()
    torch.manual_seed(123)
    reference = hand_written_loop(
        model, regression_dataset, batch_size=8, num_epochs=2, shuffle=True
    )
    trainer = make_trainer(model)
    torch.manual_seed(123)
    trainer.train(regression_dataset, num_epochs=2, per_device_batch_size=8)
    assert_same_params(trainer.get_model(), reference)


def test_accumulation_over_seven_batches_matches_reference() -> None:
    dataset = make_regression_dataset(7 * 4)
    model = make_model()
    reference = hand_written_loop(model, dataset, batch_size=4, num_epochs=2, accumulation_steps=3)
    recorder = RecordingCallback()
    trainer = make_trainer(model, callbacks=(recorder,))
    trainer.train(
        dataset,
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    # windows of 3, 3 and 1 micro-batches: 3 updates per epoch
    assert recorder.events.count("on_optimizer_step_end") == 6
    assert trainer.run_config is not None
    assert trainer.run_config.num_update_steps_per_epoch == 3
    for trained, expected in zip(
        trainer.get_model().parameters(), reference.parameters(), strict=True
    ):
        torch.testing.assert_close(trained, expected, rtol=0, atol=1e-7)


def test_short_last_window_is_not_under_weighted() -> None:
    # one epoch of 4 batches with steps=3: the last window is a single batch and must be
    # weighted as a full update (scale 1), not 1/3
    dataset = make_regression_dataset(16)
    model = make_model()
    reference = hand_written_loop(model, dataset, batch_size=4, num_epochs=1, accumulation_steps=3)
    under_weighted = hand_written_loop(model, dataset, batch_size=4, num_epochs=1)
    trainer = make_trainer(model)
    trainer.train(
        dataset,
        num_epochs=1,
        per_device_batch_size=4,
        gradient_accumulation_steps=3,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    trained = clone_params(trainer.get_model())
    for value, expected in zip(trained, reference.parameters(), strict=True):
        torch.testing.assert_close(value, expected.detach(), rtol=0, atol=1e-7)
    assert not all(
        torch.equal(value, other.detach())
        for value, other in zip(trained, under_weighted.parameters(), strict=True)
    )


def test_clipping_by_value_and_by_norm_match_reference(regression_dataset: TensorDataset) -> None:
    for options, reference_options in (
        ({"gradient_clip_value": 0.01}, {"clip_value": 0.01}),
        ({"max_grad_norm": 0.05}, {"max_grad_norm": 0.05}),
    ):
        model = make_model()
        reference = hand_written_loop(
            model,
            regression_dataset,
            batch_size=8,
            num_epochs=1,
            accumulation_steps=2,
            **reference_options,
        )
        trainer = make_trainer(model)
        trainer.train(
            regression_dataset,
            num_epochs=1,
            per_device_batch_size=8,
            gradient_accumulation_steps=2,
            train_dataloader_kwargs=UNSHUFFLED,
            **options,
        )
        for trained, expected in zip(
            trainer.get_model().parameters(), reference.parameters(), strict=True
        ):
            torch.testing.assert_close(trained, expected, rtol=0, atol=1e-7)


def test_reported_loss_is_the_unscaled_sample_weighted_mean() -> None:
    # 30 samples in batches of 8 (last batch 6), accumulation 3, lr 0: the epoch loss must be
    # the plain MSE over all samples, whatever the batching and the accumulation scaling
    dataset = make_regression_dataset(30)
    model = make_model()
    recorder = RecordingCallback()
    trainer = make_trainer(model, callbacks=(recorder,), lr=0.0)
    trainer.train(dataset, num_epochs=1, per_device_batch_size=8, gradient_accumulation_steps=3)
    inputs, targets = dataset.tensors
    expected = nn.functional.mse_loss(model(inputs), targets).item()
    assert abs(trainer.run_history.get_latest_metric("train_loss_epoch") - expected) < 1e-6
    step_losses = [
        kwargs["batch_output"]["loss"].item()
        for event, kwargs in zip(recorder.events, recorder.kwargs, strict=True)
        if event == "on_train_step_end"
    ]
    batch_sizes = [8, 8, 8, 6]
    weighted = sum(loss * size for loss, size in zip(step_losses, batch_sizes, strict=True))
    assert abs(weighted / 30 - expected) < 1e-6


def test_max_num_train_steps_stops_at_whichever_comes_first(
    regression_dataset: TensorDataset,
) -> None:
    trainer = make_trainer()
    trainer.train(regression_dataset, num_epochs=5, per_device_batch_size=8, max_num_train_steps=10)
    assert trainer.num_updates == 10
    assert trainer.run_config is not None
    assert trainer.run_config.num_epochs == 2
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2

    trainer.train(regression_dataset, num_epochs=2, per_device_batch_size=8, max_num_train_steps=99)
    assert trainer.num_updates == 16
    assert trainer.run_config.num_epochs == 2


def test_repeated_train_calls_run_the_epochs_they_ask_for(
    regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    trainer = make_trainer()
    trainer.train(regression_dataset, num_epochs=2, eval_dataset=small_eval_dataset)
    first_loader = trainer.train_dataloader
    trainer.train(
        regression_dataset,
        num_epochs=3,
        eval_dataset=small_eval_dataset,
        reset_run_history=False,
        max_num_train_steps=100,
    )
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 5
    assert len(trainer.run_history.get_metric_values("eval_loss_epoch")) == 5
    assert trainer.run_history.current_epoch == 6
    assert trainer.train_dataloader is not first_loader

    trainer.train(regression_dataset, num_epochs=1)
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 1
    assert trainer.run_history.current_epoch == 2


def test_param_group_added_between_calls_is_trained(regression_dataset: TensorDataset) -> None:
    model = make_model()
    head = model[2]
    for parameter in head.parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.05)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    trainer.train(regression_dataset, num_epochs=1)
    frozen = clone_params(head)
    assert all(torch.equal(a, b) for a, b in zip(frozen, clone_params(head), strict=True))

    for parameter in head.parameters():
        parameter.requires_grad_(True)
    trainer.optimizer.add_param_group({"params": list(head.parameters())})
    trainer.train(regression_dataset, num_epochs=1)
    assert not any(torch.equal(a, b) for a, b in zip(frozen, clone_params(head), strict=True))


def test_accelerator_is_created_once_and_dataloaders_do_not_accumulate(
    regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    trainer = make_trainer()
    accelerator = trainer.accelerator
    for _ in range(3):
        trainer.train(regression_dataset, num_epochs=1, eval_dataset=small_eval_dataset)
    trainer.evaluate(small_eval_dataset)
    assert trainer.accelerator is accelerator
    assert len(accelerator._dataloaders) == 1  # only the current run's


def test_train_never_reseeds(regression_dataset: TensorDataset) -> None:
    states = []
    for seed in (1, 2):
        trainer = make_trainer()
        torch.manual_seed(seed)
        trainer.train(regression_dataset, num_epochs=1)
        states.append(torch.random.get_rng_state())
    assert not torch.equal(states[0], states[1])


def test_evaluate_records_evaluation_loss_and_keeps_history(
    regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    trainer = make_trainer()
    trainer.train(regression_dataset, num_epochs=2, eval_dataset=small_eval_dataset)
    trainer.evaluate()  # defaults to the last eval_dataset
    history = trainer.run_history
    assert history.get_latest_metric("evaluation_loss") == history.get_latest_metric(
        "eval_loss_epoch"
    )
    assert len(history.get_metric_values("train_loss_epoch")) == 2
    trainer.evaluate(regression_dataset, per_device_batch_size=5)
    assert len(history.get_metric_values("evaluation_loss")) == 2


def test_evaluate_before_train_prepares_the_model(small_eval_dataset: TensorDataset) -> None:
    trainer = make_trainer()
    trainer.evaluate(small_eval_dataset)
    inputs, targets = small_eval_dataset.tensors
    expected = nn.functional.mse_loss(trainer.get_model()(inputs), targets).item()
    assert abs(trainer.run_history.get_latest_metric("evaluation_loss") - expected) < 1e-6


class DictBatchTrainer(Trainer):
    """A model that computes its own loss from a dict batch, as Hugging Face models do."""

    def calculate_train_batch_loss(self, batch: dict[str, torch.Tensor]) -> dict[str, object]:
        predictions = self.model(batch["x"])
        loss = nn.functional.mse_loss(predictions, batch["y"])
        return {"loss": loss, "model_outputs": predictions, "batch_size": batch["x"].size(0)}

    def calculate_eval_batch_loss(self, batch: dict[str, torch.Tensor]) -> dict[str, object]:
        with torch.no_grad():
            return self.calculate_train_batch_loss(batch)


def test_overridden_steps_with_dict_batches(regression_dataset: TensorDataset) -> None:
    model = make_model()
    reference = hand_written_loop(model, regression_dataset, batch_size=8, num_epochs=2)
    trainer = DictBatchTrainer(model, None, torch.optim.SGD(model.parameters(), lr=0.05), ())
    trainer.train(
        regression_dataset,
        num_epochs=2,
        eval_dataset=regression_dataset,
        collate_fn=lambda samples: {
            "x": torch.stack([s[0] for s in samples]),
            "y": torch.stack([s[1] for s in samples]),
        },
        train_dataloader_kwargs=UNSHUFFLED,
    )
    assert_same_params(trainer.get_model(), reference)
    assert trainer.run_history.get_latest_metric("eval_loss_epoch") > 0


def test_scheduler_steps_once_per_update_and_is_recreated_each_call(
    regression_dataset: TensorDataset,
) -> None:
    from functools import partial

    from torch.optim.lr_scheduler import LambdaLR

    trainer = make_trainer()
    trainer.train(
        regression_dataset,
        num_epochs=2,
        gradient_accumulation_steps=3,
        create_scheduler_fn=partial(LambdaLR, lr_lambda=lambda step: 1.0),
    )
    first = trainer.scheduler
    assert first.last_epoch == 2 * 3  # 8 batches / 3 -> 3 updates per epoch
    trainer.train(
        regression_dataset,
        num_epochs=1,
        create_scheduler_fn=partial(LambdaLR, lr_lambda=lambda step: 1.0),
    )
    assert trainer.scheduler is not first
    assert trainer.scheduler.last_epoch == 8


def test_a_stop_inside_an_accumulation_window_does_not_leak_into_the_next_run() -> None:
    from pytorch_accel.callbacks import StopTrainingError, TrainerCallback

    class StopAfterFirstMicroBatch(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: object) -> None:
            raise StopTrainingError

    dataset = make_regression_dataset(16)
    model = make_model()
    reference = hand_written_loop(model, dataset, batch_size=8, num_epochs=1)
    trainer = make_trainer(model)
    stopper = trainer.callback_handler.add_callback(StopAfterFirstMicroBatch())
    trainer.train(
        dataset,
        num_epochs=1,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    assert trainer.num_updates == 0  # the window's update was never taken
    trainer.callback_handler.remove_callback(stopper)
    trainer.train(
        dataset, num_epochs=1, per_device_batch_size=8, train_dataloader_kwargs=UNSHUFFLED
    )
    assert_same_params(trainer.get_model(), reference)


def test_batch_limits_shape_the_run() -> None:
    dataset = make_regression_dataset(32)  # 8 batches of 4
    model = make_model()
    first_three = TensorDataset(*(tensor[:12] for tensor in dataset.tensors))
    reference = hand_written_loop(
        model, first_three, batch_size=4, num_epochs=1, accumulation_steps=2
    )  # the same first 3 batches, in windows of 2 and 1
    recorder = RecordingCallback()
    trainer = make_trainer(model, callbacks=(recorder,))
    trainer.limit_train_batches, trainer.limit_eval_batches = 3, 1
    trainer.train(
        dataset,
        num_epochs=1,
        eval_dataset=dataset,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    assert trainer.run_config is not None
    assert trainer.run_config.train_dataloader_len == 3
    assert trainer.run_config.num_update_steps_per_epoch == 2  # windows of 2 and 1
    assert recorder.events.count("on_train_step_start") == 3
    assert recorder.events.count("on_optimizer_step_end") == 2
    assert recorder.events.count("on_eval_step_start") == 1
    inputs, targets = dataset.tensors
    first_batch_loss = nn.functional.mse_loss(trainer.get_model()(inputs[:4]), targets[:4]).item()
    assert abs(trainer.run_history.get_latest_metric("eval_loss_epoch") - first_batch_loss) < 1e-6
    assert_same_params(trainer.get_model(), reference)


def test_run_eval_epoch_from_a_callback_leaves_training_untouched(
    regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    from pytorch_accel.callbacks import TrainerCallback

    modes: list[bool] = []

    class EvaluateEveryThreeUpdates(TrainerCallback):
        def on_optimizer_step_end(self, trainer: Trainer, **kwargs: object) -> None:
            if trainer.num_updates % 3 == 0:
                trainer.run_eval_epoch()
                modes.append(trainer.model.training)

    plain = make_trainer(make_model())
    plain.train(regression_dataset, num_epochs=1, train_dataloader_kwargs=UNSHUFFLED)
    recorder = RecordingCallback()
    trainer = make_trainer(make_model(), callbacks=(EvaluateEveryThreeUpdates(), recorder))
    trainer.train(
        regression_dataset,
        num_epochs=1,
        eval_dataset=small_eval_dataset,
        train_dataloader_kwargs=UNSHUFFLED,
    )
    history = trainer.run_history
    assert len(history.get_metric_values("intermediate_eval_loss")) == 2  # after updates 3 and 6
    assert modes == [True, True]
    assert history.get_latest_metric("train_loss_epoch") == plain.run_history.get_latest_metric(
        "train_loss_epoch"
    )
    starts = [
        kw
        for e, kw in zip(recorder.events, recorder.kwargs, strict=True)
        if e == "on_eval_epoch_start"
    ]
    assert [kw["is_intermediate"] for kw in starts] == [True, True, False]


def test_run_eval_epoch_without_an_eval_set_is_an_error(regression_dataset: TensorDataset) -> None:
    import pytest

    from pytorch_accel.callbacks import TrainerCallback

    class Evaluate(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: object) -> None:
            trainer.run_eval_epoch()

    with pytest.raises(
        ValueError, match=r"Trainer\.run_eval_epoch: eval_dataset must be a dataset"
    ):
        make_trainer(callbacks=(Evaluate(),)).train(regression_dataset, num_epochs=1)


def test_grad_norm_is_the_norm_before_clipping(regression_dataset: TensorDataset) -> None:
    from pytorch_accel.callbacks import TrainerCallback

    norms: list[tuple[float, float]] = []

    class Probe(TrainerCallback):
        def on_optimizer_step_start(self, trainer: Trainer, **kwargs: object) -> None:
            clipped = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in trainer.model.parameters()])
            )
            assert trainer.grad_norm is not None
            norms.append((trainer.grad_norm.item(), clipped.item()))

    trainer = make_trainer(callbacks=(Probe(),))
    assert trainer.grad_norm is None
    trainer.train(regression_dataset, num_epochs=1, max_grad_norm=0.01)
    assert all(before > 0.01 and abs(after - 0.01) < 1e-4 for before, after in norms)
