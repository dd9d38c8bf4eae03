"""Token-exact gradient accumulation: N micro-batches of variable length equal one large batch.

With ``num_items`` in the step's output (from ``num_items_in_batch`` in a dict batch), each
accumulation window is normalised by its loss elements, not by its number of micro-batches.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import (
    TinyTokenModel,
    VariableLengthTokens,
    counting_collate,
    large_batch_loop,
    make_tiny_gpt2,
)
from torch import nn
from torch.utils.data import default_collate

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback


def max_difference(first: nn.Module, second: nn.Module) -> float:
    return max(
        (a - b).abs().max().item()
        for a, b in zip(first.parameters(), second.parameters(), strict=True)
    )


def train(
    model: nn.Module,
    data: Any,
    *,
    batch_size: int,
    accumulation: int,
    collate_fn: Any,
    num_epochs: int = 2,
    lr: float = 0.1,
    callbacks: tuple[TrainerCallback, ...] = (),
    **kwargs: Any,
) -> Trainer:
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=lr), callbacks)
    trainer.train(
        data,
        num_epochs=num_epochs,
        per_device_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        collate_fn=collate_fn,
        train_dataloader_kwargs={"shuffle": False},
        **kwargs,
    )
    return trainer


@pytest.mark.parametrize("num_samples", [16, 14])  # 14: a short last window (4 and 3 batches)
def test_accumulated_variable_length_batches_equal_the_large_batch(num_samples: int) -> None:
    data = VariableLengthTokens(num_samples)
    model = TinyTokenModel()
    reference = large_batch_loop(model, data, window_samples=8, num_epochs=2)
    trainer = train(model, data, batch_size=2, accumulation=4, collate_fn=counting_collate())
    assert max_difference(trainer.get_model(), reference) < 1e-6


def test_without_a_count_accumulation_weights_micro_batches_alike() -> None:
    """What token-exact accumulation fixes: the per-batch means are weighted by count."""
    data = VariableLengthTokens(16)
    model = TinyTokenModel()
    reference = large_batch_loop(model, data, window_samples=8, num_epochs=2)
    trainer = train(model, data, batch_size=2, accumulation=4, collate_fn=default_collate)
    assert max_difference(trainer.get_model(), reference) > 1e-3


def test_a_causal_language_model_accumulates_like_its_large_batch() -> None:
    pytest.importorskip("transformers")
    data = VariableLengthTokens(12)
    model = make_tiny_gpt2()
    reference = large_batch_loop(model, data, window_samples=6, num_epochs=2)
    trainer = train(model, data, batch_size=2, accumulation=3, collate_fn=counting_collate(True))
    assert max_difference(trainer.get_model(), reference) < 1e-6
    unweighted = train(
        make_tiny_gpt2(), data, batch_size=2, accumulation=3, collate_fn=default_collate
    )
    assert max_difference(unweighted.get_model(), reference) > 1e-4


def test_one_large_batch_with_a_count_trains_as_without() -> None:
    """No accumulation: the window is one batch, whose mean over its tokens is the loss."""
    data = VariableLengthTokens(16)
    model = TinyTokenModel()
    counted = train(
        TinyTokenModel(), data, batch_size=8, accumulation=1, collate_fn=counting_collate()
    )
    plain = train(model, data, batch_size=8, accumulation=1, collate_fn=default_collate)
    assert max_difference(counted.get_model(), plain.get_model()) < 1e-6


def token_mean_loss(model: nn.Module, data: VariableLengthTokens) -> float:
    with torch.no_grad():
        return float(model(**default_collate([data[i] for i in range(len(data))]))["loss"])


def test_train_and_eval_losses_are_token_means() -> None:
    data, eval_data = VariableLengthTokens(16), VariableLengthTokens(10, seed=1)
    model = TinyTokenModel()
    expected_train, expected_eval = token_mean_loss(model, data), token_mean_loss(model, eval_data)
    trainer = train(
        model,
        data,
        batch_size=2,
        accumulation=4,
        collate_fn=counting_collate(),
        num_epochs=1,
        lr=0.0,
        eval_dataset=eval_data,
    )
    history = trainer.run_history
    assert history.get_latest_metric("train_loss_epoch") == pytest.approx(expected_train, 1e-6)
    assert history.get_latest_metric("eval_loss_epoch") == pytest.approx(expected_eval, 1e-6)
    unweighted = train(
        TinyTokenModel(), data, batch_size=2, accumulation=4, collate_fn=default_collate, lr=0.0
    )
    assert unweighted.run_history.get_latest_metric("train_loss_epoch") != pytest.approx(
        expected_train, 1e-4
    )


class CountingTrainer(Trainer):
    """Returns ``num_items`` from an overridden step, for batches chosen by ``counted``."""

    def __init__(
        self, *args: Any, counted: Any = lambda step: True, as_int: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.counted, self.as_int, self.steps = counted, as_int, 0

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if self.counted(self.steps):
            count = (batch["labels"] != -100).sum()
            output["num_items"] = int(count) if self.as_int else count
        self.steps += 1
        return output


@pytest.mark.parametrize("as_int", [False, True])
def test_an_overridden_step_returning_num_items_is_token_exact(as_int: bool) -> None:
    data = VariableLengthTokens(16)
    model = TinyTokenModel()
    reference = large_batch_loop(model, data, window_samples=8, num_epochs=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = CountingTrainer(model, None, optimizer, as_int=as_int)
    trainer.train(
        data,
        num_epochs=2,
        per_device_batch_size=2,
        gradient_accumulation_steps=4,
        train_dataloader_kwargs={"shuffle": False},
    )
    assert max_difference(trainer.get_model(), reference) < 1e-6


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("counted", "message"),
    [
        (lambda step: step != 2, "'num_items'.. is missing in batch 3 of epoch 1"),
        (lambda step: step == 1, "'num_items'.. is present in batch 2 of epoch 1"),
    ],
)
def test_a_run_mixing_counted_and_uncounted_batches_is_refused(counted: Any, message: str) -> None:
    model = TinyTokenModel()
    trainer = CountingTrainer(
        model, None, torch.optim.SGD(model.parameters(), lr=0.1), counted=counted
    )
    with pytest.raises(ValueError, match=message + ".*in every batch of the run|or from none"):
        trainer.train(VariableLengthTokens(8), num_epochs=1, per_device_batch_size=2)


@pytest.mark.bad_input
def test_a_count_that_is_not_a_number_is_refused() -> None:
    def collate(samples: list[Any]) -> dict[str, Any]:
        batch: dict[str, Any] = default_collate(samples)
        batch["num_items_in_batch"] = (batch["labels"] != -100).sum(dim=1)  # per row
        return batch

    model = TinyTokenModel()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match=r"num_items'\] must be .* got Tensor of shape \(2,\)"):
        trainer.train(
            VariableLengthTokens(8), num_epochs=1, per_device_batch_size=2, collate_fn=collate
        )


def test_a_loss_func_model_is_not_given_the_count() -> None:
    """With a loss_func the model only gets its inputs; the count still weights the batch."""

    class LogitsOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyTokenModel()

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids)["logits"]

    def loss_func(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())

    data = VariableLengthTokens(16)
    model = LogitsOnly()
    reference = large_batch_loop(model.inner, data, window_samples=8, num_epochs=2)
    trainer = Trainer(model, loss_func, torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.train(
        data,
        num_epochs=2,
        per_device_batch_size=2,
        gradient_accumulation_steps=4,
        collate_fn=counting_collate(),
        train_dataloader_kwargs={"shuffle": False},
    )
    assert max_difference(trainer.get_model().inner, reference) < 1e-6


def test_a_resume_inside_a_window_continues_its_count(tmp_path: Any) -> None:
    """The window's count so far is part of the training state: the resumed run is exact."""
    from helpers import SaveAtStep

    data = VariableLengthTokens(16)
    whole = train(
        TinyTokenModel(), data, batch_size=2, accumulation=4, collate_fn=counting_collate()
    )
    saver = SaveAtStep(tmp_path / "state", step=2)  # after 2 of the first window's 4 batches
    first = train(
        TinyTokenModel(),
        data,
        batch_size=2,
        accumulation=4,
        collate_fn=counting_collate(),
        callbacks=(saver,),
    )
    del first
    resumed = train(
        TinyTokenModel(seed=5),
        data,
        batch_size=2,
        accumulation=4,
        collate_fn=counting_collate(),
        resume_from=tmp_path / "state",
    )
    assert max_difference(resumed.get_model(), whole.get_model()) < 1e-7


def test_the_loss_is_not_read_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weighting and normalising stay on the device: no tensor is read during the steps."""
    reads: list[str] = []

    class Probe(TrainerCallback):
        active = False

        def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
            Probe.active = True

        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            Probe.active = False

    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _n: str = name, _o: Any = original) -> Any:
            if Probe.active:
                reads.append(_n)
            return _o(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    data = VariableLengthTokens(16)
    train(
        TinyTokenModel(),
        data,
        batch_size=2,
        accumulation=4,
        collate_fn=counting_collate(),
        callbacks=(Probe(),),
    )
    assert reads == []


@pytest.mark.bad_input
def test_pytorch_accelerateds_count_key_is_pointed_to_num_items() -> None:
    """Ported code returning ``num_items_in_batch`` expects a compensation that is not made."""

    class Ported(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_train_batch_loss(batch)
            output["num_items_in_batch"] = (batch["labels"] != -100).sum()
            return output

    model = TinyTokenModel()
    trainer = Ported(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.warns(UserWarning, match=r"num_items_in_batch'\] is not interpreted.*'num_items'"):
        trainer.train(VariableLengthTokens(8), num_epochs=1, per_device_batch_size=2)


def test_the_back_propagated_loss_stays_the_size_of_a_mean() -> None:
    """Weighted by num_items / (a power of two near the usual count), not by num_items alone.

    Mixed precision's gradient scaler would otherwise see losses (and gradients) as many times
    larger as a micro-batch has tokens, and skip updates until it has scaled them down.
    """
    ratios: list[float] = []

    class Recording(CountingTrainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_train_batch_loss(batch)
            self.loss = output["loss"].detach()
            return output

        def backward_step(self, loss: torch.Tensor) -> None:
            ratios.append(float(loss.detach() / self.loss))
            super().backward_step(loss)

    data = VariableLengthTokens(32, length=40)  # 2 to 80 tokens per micro-batch of 2
    model = TinyTokenModel()
    trainer = Recording(model, None, torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.train(data, num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=4)
    assert 0.7 < ratios[0] < 1.42  # the first micro-batch's count, to the nearest power of two
    assert 0.5 < sorted(ratios)[len(ratios) // 2] < 2  # by num_items alone: about 40
    assert max(ratios) < 10  # by num_items alone: up to 80


def test_the_norm_is_clipped_after_the_window_is_normalised() -> None:
    data = VariableLengthTokens(16)
    model = TinyTokenModel()
    reference = large_batch_loop(model, data, window_samples=8, num_epochs=2, max_grad_norm=0.05)
    trainer = train(
        model, data, batch_size=2, accumulation=4, collate_fn=counting_collate(), max_grad_norm=0.05
    )
    assert max_difference(trainer.get_model(), reference) < 1e-6
    unclipped = large_batch_loop(model, data, window_samples=8, num_epochs=2)
    assert max_difference(unclipped, reference) > 1e-3  # the clipping mattered
