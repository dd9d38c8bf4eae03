"""``PackingCollator``: packed batches train a causal LM exactly as the same batches padded.

A tiny GPT-2 trained on sequences of varying lengths, batched padded (labels -100 at the
padding, ``num_items_in_batch`` counted) or packed into one row (block-causal mask, positions
restarting), with and without gradient accumulation, ends with the same weights (1e-6).
"""

from __future__ import annotations

import pytest
import torch
from helpers import make_tiny_gpt2

from pytorch_accel import Trainer
from pytorch_accel.packing import PackingCollator

pytest.importorskip("transformers")

LENGTHS = [3, 7, 2, 5, 9, 4, 6, 1, 8, 5, 3, 6]


def samples() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(1, 12, (length,), generator=generator)} for length in LENGTHS
    ]


def padded(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-padded to the batch's longest, labels -100 at the padding, tokens counted."""
    longest = max(len(sample["input_ids"]) for sample in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sample in enumerate(batch):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        mask[row, : len(sample["input_ids"])] = 1
    labels = ids.masked_fill(mask == 0, -100)
    count = (labels[:, 1:] != -100).sum()
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "num_items_in_batch": count}


def trained(collate: object, accumulation: int) -> dict[str, torch.Tensor]:
    model = make_tiny_gpt2()
    trainer = Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.5), ())
    trainer.train(
        samples(),
        num_epochs=2,
        per_device_batch_size=4,
        gradient_accumulation_steps=accumulation,
        collate_fn=collate,
        train_dataloader_kwargs={"shuffle": False},
    )
    return {name: value.detach().clone() for name, value in model.named_parameters()}


@pytest.mark.parametrize("accumulation", [1, 3])
def test_packed_batches_train_to_the_weights_of_padded_ones(accumulation: int) -> None:
    expected = trained(padded, accumulation)
    got = trained(PackingCollator(), accumulation)
    start = dict(make_tiny_gpt2().named_parameters())
    assert any(not torch.equal(value, start[name]) for name, value in got.items())
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)


def test_a_packed_batch_holds_one_row_and_counts_the_shifted_labels() -> None:
    batch = PackingCollator()(
        [{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, -100]}]
    )

    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, -100]]
    assert int(batch["num_items_in_batch"]) == 2
    assert batch["attention_mask"][0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    assert "attention_mask" not in PackingCollator(block_mask=False)([{"input_ids": [1, 2]}])


@pytest.mark.bad_input
def test_samples_that_cannot_be_packed_are_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"sample 0 is a list without 'input_ids'"):
        PackingCollator()([[1, 2, 3]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"sample 1 has 2 input_ids and 3 labels"):
        PackingCollator()([{"input_ids": [1]}, {"input_ids": [1, 2], "labels": [1, 2, 3]}])
    with pytest.raises(ValueError, match=r"sample 0's input_ids has shape \(0,\)"):
        PackingCollator()([{"input_ids": []}])
    with pytest.raises(TypeError, match=r"block_mask must be True or False"):
        PackingCollator(block_mask="yes")  # type: ignore[arg-type]
