"""``predict(..., pad_value=...)``: a causal language model's logits of varying lengths.

Batches padded each to their own longest sequence give logits ``(batch, length, vocab)`` of
varying lengths, which ``predict()`` refused (``PredictOutputsError``); with ``pad_value``
they are padded along the sequence dimension to the longest and concatenated. (Across two
processes: tests/distributed/test_prediction.py.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import make_tiny_gpt2

from pytorch_accel import PredictOutputsError, Trainer

pytest.importorskip("transformers")

LENGTHS = [3, 5, 2, 7, 4, 6, 1]


def samples() -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        {"input_ids": torch.randint(1, 12, (length,), generator=generator)} for length in LENGTHS
    ]


def pad_batch(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad to the batch's own longest sequence, with an attention mask."""
    longest = max(len(sample["input_ids"]) for sample in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, sample in enumerate(batch):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask}


def make_trainer() -> Trainer:
    model = make_tiny_gpt2()
    return Trainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())


def test_logits_of_varying_lengths_are_padded_along_the_sequence_and_concatenated() -> None:
    trainer = make_trainer()
    data = samples()

    logits = trainer.predict(data, per_device_batch_size=3, collate_fn=pad_batch, pad_value=-1.5)

    assert logits.shape == (len(LENGTHS), max(LENGTHS), 12)
    model = trainer.get_model().eval()
    for row, sample in enumerate(data):
        length = len(sample["input_ids"])
        with torch.no_grad():
            alone = model(input_ids=sample["input_ids"][None]).logits[0]
        torch.testing.assert_close(logits[row, :length], alone, rtol=0, atol=1e-5)
        batch_longest = max(LENGTHS[row - row % 3 : row - row % 3 + 3])
        assert bool((logits[row, batch_longest:] == -1.5).all())  # beyond its batch: padding
        assert not bool((logits[row, :batch_longest] == -1.5).any())


def test_without_pad_value_the_lengths_still_fail_naming_it() -> None:
    with pytest.raises(PredictOutputsError, match=r"pass pad_value=\.\.\."):
        make_trainer().predict(samples(), per_device_batch_size=3, collate_fn=pad_batch)


class Structured(Trainer):
    """Outputs as a dict: logits padded, one output per sample (2-D) left as it is."""

    def calculate_predict_batch(self, batch: Any) -> Any:
        logits = super().calculate_predict_batch(batch)
        return {"logits": logits, "last": (logits[:, -1, :2], logits[:, 0, 0])}


def test_each_output_of_a_structure_is_padded_to_its_own_longest() -> None:
    model = make_tiny_gpt2()
    trainer = Structured(model, None, torch.optim.SGD(model.parameters(), lr=0.1), ())

    outputs = trainer.predict(samples(), per_device_batch_size=3, collate_fn=pad_batch, pad_value=0)

    assert outputs["logits"].shape == (len(LENGTHS), max(LENGTHS), 12)
    assert outputs["last"][0].shape == (len(LENGTHS), 2)
    assert outputs["last"][1].shape == (len(LENGTHS),)


@pytest.mark.bad_input
def test_a_pad_value_that_is_not_a_number_is_refused() -> None:
    trainer = make_trainer()
    with pytest.raises(TypeError, match=r"Trainer.predict: pad_value must be a number or None"):
        trainer.predict(samples(), collate_fn=pad_batch, pad_value="pad")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"pad_value must be a number"):
        trainer.predict(samples(), collate_fn=pad_batch, pad_value=True)
