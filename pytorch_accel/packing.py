"""Padding-free batches for causal language models: the batch's sequences packed in one row.

``PackingCollator`` is a ``collate_fn``: it concatenates the samples' token sequences into one
row, with positions restarting at each sequence, a block-causal attention mask (each token
sees only the earlier tokens of its own sequence), labels ``-100`` at each sequence's first
token (no prediction crosses from one sequence to the next) and ``num_items_in_batch``, so
the loss is the mean over the batch's tokens and accumulation windows are weighted by tokens
(docs/hf-models.md). The logits, loss and gradients are those of the same samples padded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["PackingCollator"]


class PackingCollator:
    """Pack a batch of token sequences into one row, for a causal language model.

    Each sample is a mapping with ``input_ids`` (a 1-D tensor or a list of ints) and
    optionally ``labels`` of the same length (default: the tokens). The batch holds
    ``input_ids``, ``position_ids`` and ``labels`` of shape ``(1, total tokens)``,
    ``attention_mask`` of shape ``(1, 1, total, total)`` (boolean, block-causal) unless
    ``block_mask=False``, and ``num_items_in_batch``: the labels the shifted loss counts.

    Args:
        block_mask: Build the block-causal attention mask, which every attention
            implementation honours (memory: total tokens squared, in booleans). ``False``
            leaves it out, for attention that separates sequences by ``position_ids`` alone
            (``flash_attention_2``); with others, sequences would see each other.

    Example:
        ```python
        trainer.train(tokenized, per_device_batch_size=16, collate_fn=PackingCollator())
        ```
    """

    def __init__(self, block_mask: bool = True) -> None:
        if not isinstance(block_mask, bool):
            raise TypeError(
                f"PackingCollator: block_mask must be True or False, got {block_mask!r}. "
                "Pass block_mask=False only for flash_attention_2."
            )
        self.block_mask = block_mask

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Return the packed batch of ``samples``."""
        ids = [self._tokens(sample, "input_ids", index) for index, sample in enumerate(samples)]
        labels = [
            self._tokens(sample, "labels", index) if "labels" in sample else tokens
            for index, (sample, tokens) in enumerate(zip(samples, ids, strict=True))
        ]
        for index, (tokens, targets) in enumerate(zip(ids, labels, strict=True)):
            if targets.shape != tokens.shape:
                raise ValueError(
                    f"PackingCollator: sample {index} has {len(tokens)} input_ids and "
                    f"{len(targets)} labels; give one label per token (-100 for none)."
                )
        packed_labels = torch.cat([targets.clone() for targets in labels])
        starts = torch.tensor([0, *[len(tokens) for tokens in ids]]).cumsum(0)[:-1]
        packed_labels[starts] = -100  # the first token of each sequence: predicted by nothing
        segment = torch.cat([torch.full((len(t),), i) for i, t in enumerate(ids)])
        batch: dict[str, Any] = {
            "input_ids": torch.cat(ids)[None],
            "position_ids": torch.cat([torch.arange(len(tokens)) for tokens in ids])[None],
            "labels": packed_labels[None],
            "num_items_in_batch": (packed_labels[1:] != -100).sum(),
        }
        if self.block_mask:
            causal = torch.ones(len(segment), len(segment), dtype=torch.bool).tril()
            batch["attention_mask"] = ((segment[:, None] == segment[None, :]) & causal)[None, None]
        return batch

    @staticmethod
    def _tokens(sample: Mapping[str, Any], key: str, index: int) -> torch.Tensor:
        if not isinstance(sample, Mapping) or key not in sample:
            raise TypeError(
                f"PackingCollator: sample {index} is a {type(sample).__name__} without "
                f"{key!r}; each sample must be a mapping with 'input_ids' (and optionally "
                "'labels'), as a tokenised dataset gives it."
            )
        tokens = torch.as_tensor(sample[key])
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ValueError(
                f"PackingCollator: sample {index}'s {key} has shape {tuple(tokens.shape)}; "
                "give one non-empty sequence per sample (a 1-D tensor or list of ints)."
            )
        return tokens
