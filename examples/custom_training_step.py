r"""Dict batches and a model that computes its own loss, as Hugging Face models do.

Hugging Face Transformers models take keyword arguments (`input_ids`, `attention_mask`,
`labels`) and, given `labels`, return an output object holding both `loss` and `logits`. The
default `Trainer` step methods call `model(inputs)` and `loss_func(outputs, targets)` instead,
so this example:

- builds dict batches with a `collate_fn` that pads variable-length token sequences and adds
  an `attention_mask`;
- defines `SequenceClassifier`, a tiny bag-of-embeddings text classifier with the Hugging Face
  calling convention, returning a `SequenceClassifierOutput` with `.loss` and `.logits`;
- subclasses `Trainer` as `ModelLossTrainer`, overriding `calculate_train_batch_loss` and
  `calculate_eval_batch_loss` to call `self.model(**batch)`; it reads `loss` and `logits` by
  attribute or by key, so models returning dicts work too;
- creates the trainer with `loss_func=None`: the model computes its loss;
- records the eval accuracy with `MetricsCallback`, whose `prepare` reads the labels from
  `batch["labels"]`.

The data are generated: token sequences of random length whose label says whether most of
their tokens come from the first or the second half of the vocabulary.

Run it with:

    python examples/custom_training_step.py
    accelerate launch examples/custom_training_step.py

`--quick` trains on a few hundred sequences for a couple of epochs (a few seconds); `--help`
lists every option.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, MetricsCallback

VOCAB_SIZE = 64
PAD_TOKEN_ID = 0


class TokenSequenceDataset(Dataset[dict[str, torch.Tensor]]):
    """Generated token sequences; the label says which half of the vocabulary dominates.

    Token ids are drawn from `1..VOCAB_SIZE - 1` (0 is padding) with a bias towards the lower
    or the upper half; the label is 1 when most tokens are in the upper half.

    Args:
        num_samples: Number of sequences.
        seed: Seed of the generator, so that every process builds the same data.
        min_length: Shortest sequence.
        max_length: Longest sequence.
    """

    def __init__(self, num_samples: int, seed: int, min_length: int = 4, max_length: int = 16):
        generator = torch.Generator().manual_seed(seed)
        half = VOCAB_SIZE // 2
        self.sequences: list[torch.Tensor] = []
        self.labels: list[int] = []
        for index in range(num_samples):
            length = int(torch.randint(min_length, max_length + 1, (1,), generator=generator))
            upper = torch.rand(length, generator=generator) < (0.8 if index % 2 else 0.2)
            low = torch.randint(1, half, (length,), generator=generator)
            high = torch.randint(half, VOCAB_SIZE, (length,), generator=generator)
            self.sequences.append(torch.where(upper, high, low))
            self.labels.append(int(upper.sum() * 2 > length))

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.sequences[index], "labels": torch.tensor(self.labels[index])}


def collate_token_batch(samples: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad the sequences of a batch to its longest one and build the attention mask.

    Args:
        samples: Items of `TokenSequenceDataset`.

    Returns:
        `input_ids` and `attention_mask` of shape `(batch, longest)` and `labels` of shape
        `(batch,)`; the mask is 1 on real tokens and 0 on padding.
    """
    input_ids = pad_sequence(
        [sample["input_ids"] for sample in samples], batch_first=True, padding_value=PAD_TOKEN_ID
    )
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD_TOKEN_ID).long(),
        "labels": torch.stack([sample["labels"] for sample in samples]),
    }


@dataclass
class SequenceClassifierOutput:
    """What `SequenceClassifier` returns, like a Hugging Face `ModelOutput`.

    Attributes:
        loss: The mean cross-entropy loss, when `labels` were given; else `None`.
        logits: Class logits of shape `(batch, num_classes)`.
    """

    loss: torch.Tensor | None
    logits: torch.Tensor


class SequenceClassifier(nn.Module):
    """A bag-of-embeddings classifier with the Hugging Face calling convention.

    Args:
        vocab_size: Number of token ids.
        hidden_size: Size of the token embeddings.
        num_classes: Number of output logits.
    """

    def __init__(self, vocab_size: int = VOCAB_SIZE, hidden_size: int = 32, num_classes: int = 2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=PAD_TOKEN_ID)
        self.classifier = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.ReLU(), nn.Linear(hidden_size, num_classes)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        """Return the logits, and the loss when `labels` are given.

        Args:
            input_ids: Token ids, `(batch, length)`.
            attention_mask: 1 on real tokens, 0 on padding, `(batch, length)`.
            labels: Class indices, `(batch,)`, or `None`.

        Returns:
            The output with `loss` (`None` without labels) and `logits`.
        """
        mask = attention_mask.unsqueeze(-1).to(self.embeddings.weight.dtype)
        pooled = (self.embeddings(input_ids) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        logits = self.classifier(pooled)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def output_field(outputs: Any, name: str) -> Any:
    """Return `outputs[name]` for a mapping, else `outputs.name` (both work on `ModelOutput`)."""
    return outputs[name] if isinstance(outputs, Mapping) else getattr(outputs, name)


class ModelLossTrainer(Trainer):
    """A trainer for dict batches and models that return their own loss.

    Each batch is passed as keyword arguments (`self.model(**batch)`); the model's `loss` is
    the loss and its `logits` are the `model_outputs` that callbacks see.
    """

    def calculate_train_batch_loss(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Run the model on the batch's keyword arguments and take the loss it computed."""
        outputs = self.model(**batch)
        return {
            "loss": output_field(outputs, "loss"),
            "model_outputs": output_field(outputs, "logits"),
            "batch_size": batch["input_ids"].size(0),
        }

    def calculate_eval_batch_loss(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Like `calculate_train_batch_loss`, without gradients."""
        with torch.no_grad():
            return self.calculate_train_batch_loss(batch)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.

    Returns:
        The options: `num_epochs`, `batch_size`, `lr`, `num_samples`, `seed` and `quick`.
    """
    parser = argparse.ArgumentParser(
        description="Train a model that computes its own loss on dict batches."
    )
    parser.add_argument("--num_epochs", type=int, default=10, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size per process")
    parser.add_argument("--lr", type=float, default=1e-2, help="learning rate of AdamW")
    parser.add_argument("--num_samples", type=int, default=2000, help="training sequences")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="defaults for a run of a few seconds: 300 sequences, 3 epochs",
    )
    if parser.parse_known_args(argv)[0].quick:  # explicit options still win
        parser.set_defaults(num_samples=300, num_epochs=3)
    return parser.parse_args(argv)


def accuracy_callback(num_classes: int = 2) -> MetricsCallback:
    """Eval accuracy as `accuracy`, from the logits and `batch["labels"]` of dict batches."""
    return MetricsCallback(
        MulticlassAccuracy(num_classes=num_classes, average="micro"),
        name="accuracy",
        prepare=lambda batch, output: (output["model_outputs"].argmax(dim=-1), batch["labels"]),
    )


def train(args: argparse.Namespace) -> Trainer:
    """Build the data, the model and the trainer (with `loss_func=None`), and train.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer; its run history holds `train_loss_epoch`, `eval_loss_epoch` and
        `accuracy` for every epoch.
    """
    set_seed(args.seed)
    train_dataset = TokenSequenceDataset(args.num_samples, seed=0)
    eval_dataset = TokenSequenceDataset(max(args.num_samples // 4, 1), seed=1)
    model = SequenceClassifier()
    trainer = ModelLossTrainer(
        model,
        loss_func=None,  # the model computes its own loss
        optimizer=torch.optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=(*DEFAULT_CALLBACKS, accuracy_callback()),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        num_epochs=args.num_epochs,
        per_device_batch_size=args.batch_size,
        collate_fn=collate_token_batch,
        # The items are already tensors in memory: load them in the main process.
        train_dataloader_kwargs={"num_workers": 0},
        eval_dataloader_kwargs={"num_workers": 0},
    )
    return trainer


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    """Train and return the loss and accuracy of every epoch.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        `train_loss_epoch`, `eval_loss_epoch` and `accuracy`, one value per epoch.
    """
    trainer = train(parse_args(argv))
    names = ("train_loss_epoch", "eval_loss_epoch", "accuracy")
    history = {name: list(trainer.run_history.get_metric_values(name)) for name in names}
    trainer.print(f"final eval accuracy: {history['accuracy'][-1]:.3f}")
    return history


if __name__ == "__main__":
    main()
