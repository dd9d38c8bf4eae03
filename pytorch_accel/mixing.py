"""Several training sets in one run: ``train({"a": set_a, "b": set_b}, ...)``.

A mapping of named, map-style datasets (or a ``TrainingSets``, to choose the rule) is turned,
once, at ``train()``'s entry, into one dataset (``MixedDataset``, their concatenation) and a
batch sampler (``MixingBatchSampler``) that draws each epoch's batches by a sampling rule:

- ``"proportional"`` (the default): every sample of every set once per epoch; the sets'
  batches interleaved at random (each set's share of the epoch is its share of the batches).
- ``"weighted"``: the epoch has as many batches as the proportional one; each set gets its
  weight's share of them (rounded by largest remainder), drawn from its own shuffled passes
  (a small set with a large weight is seen several times per epoch, a large one with a small
  weight in part, continuing where it stopped in no later epoch: every epoch draws anew).
- ``"round_robin"``: one batch of each set in turn, in the mapping's order; a set that runs
  out drops out; every sample once per epoch.

**Each batch comes from one set** (as Lightning's ``CombinedLoader`` in its ``sequential``
mode and multi-task samplers do), not mixed per item (as Hugging Face's
``interleave_datasets``): the sets may collate differently (other keys, other lengths), and a
batch's loss is one set's, so the loss of each set is logged exactly, on the device, with
``Trainer.log`` (``train_loss_<name>_epoch``, weighted as ``train_loss_epoch`` is). Mixing per
item is a ``ConcatDataset`` with a ``WeightedRandomSampler`` in ``train_dataloader_kwargs``.

The order is drawn from the sampler's ``generator``, the one accelerate makes and shares
between processes (from the global torch generator on one process), at the epoch's first
index request, where the resumable epoch (``_resumable.EpochRandomness``) records and
replays the random states: a run resumed mid-epoch draws the same order and skips the
batches already trained on, as for one dataset. With several processes, accelerate deals the
epoch's batches out in turn (batch ``i`` to process ``i % processes``), so each set is split
across the processes and every sample is trained once per epoch (the last round padded with
the first batches, as accelerate pads any dataset).

Nothing here is imported by a run over one dataset.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterator, Mapping, Sized
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import ConcatDataset, DataLoader, IterableDataset

from pytorch_accel._checks import check_positive_int, fail
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.dataloaders import EVAL_SET_NAME_PATTERN

if TYPE_CHECKING:
    from pytorch_accel.run_config import TrainArguments

__all__ = [
    "MIXING_RULES",
    "MixedDataset",
    "MixingBatchSampler",
    "SetLossesCallback",
    "TrainingSets",
    "mix_training_sets",
]

MIXING_RULES = ("proportional", "weighted", "round_robin")
"""The sampling rules of ``TrainingSets``."""


class TrainingSets(Mapping[str, Any]):
    """Named training sets and how to mix them: pass it as ``train(train_dataset=...)``.

    A plain mapping ``{"a": set_a, "b": set_b}`` is the same as ``TrainingSets`` of it with
    the default rule (``"proportional"``).

    Args:
        sets: Set names (a letter, then letters, digits, ``_ . -``: they name the per-set
            losses) to map-style datasets with at least one sample.
        rule: ``"proportional"``, ``"weighted"`` or ``"round_robin"`` (see the module);
            default ``"weighted"`` with ``weights``, else ``"proportional"``.
        weights: Each set's share of the batches: a number >= 0 per set name, not all 0
            (they need not sum to 1); only with the rule ``"weighted"``.

    Raises:
        TypeError: If ``sets`` is not a mapping, a name not a string, a set not a map-style
            dataset, or a weight not a number.
        ValueError: If ``sets`` is empty, a set empty, a name unusable, the rule unknown, or
            the weights do not name the sets exactly, or are negative, infinite or all 0.
    """

    def __init__(
        self,
        sets: Mapping[str, Any],
        *,
        rule: str | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        where = "TrainingSets"
        self._sets = _checked_sets(where, "sets", sets)
        if rule is None:
            rule = "proportional" if weights is None else "weighted"
        if rule not in MIXING_RULES:
            fail(
                ValueError,
                where,
                "rule",
                rule,
                f"one of {', '.join(map(repr, MIXING_RULES))}",
                "Pass rule='proportional' (the default), rule='weighted' with weights={...}, "
                "or rule='round_robin'.",
            )
        self.rule: str = rule
        self.weights: dict[str, float] | None = (
            None if weights is None and rule != "weighted" else self._checked_weights(weights)
        )

    def _checked_weights(self, weights: object) -> dict[str, float]:
        """Check ``weights`` against the sets and the rule; return them as floats."""
        where, names = "TrainingSets", list(self._sets)
        example = ", ".join(f"{name!r}: 1.0" for name in names)
        if self.rule != "weighted":
            fail(
                ValueError,
                where,
                "weights",
                weights,
                f"None with rule={self.rule!r}",
                "Leave weights out, or pass rule='weighted' to mix the sets by weight.",
            )
        if not isinstance(weights, Mapping):
            fail(
                TypeError,
                where,
                "weights",
                weights,
                "a mapping of set names to numbers",
                f"Pass e.g. weights={{{example}}}.",
            )
        missing = [name for name in names if name not in weights]
        unknown = [name for name in weights if name not in self._sets]
        if missing or unknown:
            fail(
                ValueError,
                where,
                "weights",
                dict(weights),
                f"one weight per set, named as the sets ({', '.join(map(repr, names))})",
                (f"Add {', '.join(map(repr, missing))}. " if missing else "")
                + (f"Remove {', '.join(map(repr, unknown))}. " if unknown else "")
                + f"E.g. weights={{{example}}}.",
            )
        checked: dict[str, float] = {}
        for name in names:
            value = weights[name]
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not ok or not math.isfinite(float(value)) or float(value) < 0:
                fail(
                    TypeError if not ok else ValueError,
                    where,
                    f"weights[{name!r}]",
                    value,
                    "a finite number >= 0",
                    "Give each set a share such as 0.7 (0 leaves the set out).",
                )
            checked[name] = float(value)
        if not any(checked.values()):
            fail(
                ValueError,
                where,
                "weights",
                checked,
                "at least one weight above 0",
                "Give the sets to train on a positive weight.",
            )
        return checked

    def __getitem__(self, name: str) -> Any:
        return self._sets[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sets)

    def __len__(self) -> int:
        return len(self._sets)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{name!r}: <{len(data)} samples>" for name, data in self._sets.items())
        return f"TrainingSets({{{sizes}}}, rule={self.rule!r}, weights={self.weights!r})"


def _checked_sets(where: str, argument: str, sets: object) -> dict[str, Any]:
    """Check a mapping of named training sets; return it as a dict, in its order."""
    if not isinstance(sets, Mapping):
        fail(
            TypeError,
            where,
            argument,
            sets,
            "a mapping of set names to datasets",
            f"Pass e.g. {argument}={{'a': dataset_a, 'b': dataset_b}}.",
        )
    if not sets:
        fail(
            ValueError,
            where,
            argument,
            sets,
            "a non-empty mapping of set names to datasets",
            f"Pass e.g. {argument}={{'a': dataset_a, 'b': dataset_b}}, or one dataset.",
        )
    for name, data in sets.items():
        if not isinstance(name, str) or not EVAL_SET_NAME_PATTERN.fullmatch(name):
            fail(
                ValueError if isinstance(name, str) else TypeError,
                where,
                f"{argument}'s key",
                name,
                "a name that starts with a letter (letters, digits, _ . -)",
                "Its loss is logged as 'train_loss_<name>_epoch': use e.g. 'wiki' or 'code-v2'.",
            )
        label = f"{argument}[{name!r}]"
        if isinstance(data, (DataLoader, IterableDataset)) or not isinstance(data, Sized):
            fail(
                TypeError,
                where,
                label,
                data,
                "a map-style dataset (with __len__ and __getitem__)",
                "Pass the dataset itself: the sets are batched together by their sampling rule "
                "(a DataLoader's or stream's own order cannot be mixed).",
            )
        if len(data) == 0:
            fail(ValueError, where, label, data, "non-empty", "Pass a dataset with samples.")
    return dict(sets)


class MixedDataset(ConcatDataset):  # type: ignore[type-arg]
    """The training sets concatenated, in the mapping's order, with their names.

    Attributes:
        names: The sets' names, in order.
        sets: The ``TrainingSets`` it was made from.
    """

    def __init__(self, sets: TrainingSets) -> None:
        super().__init__(list(sets.values()))
        self.names: list[str] = list(sets)
        self.sets = sets

    def set_of(self, index: int) -> int:
        """The position (in ``names``) of the set that sample ``index`` belongs to."""
        return bisect.bisect_right(self.cumulative_sizes, index)


class _OrderSource:
    """The sampler accelerate looks up (``batch_sampler.sampler``): it holds the generator.

    With several processes accelerate gives it a generator it shares between them (the
    state of the main process's, at the start of each epoch); the resumable epoch records
    and replays its state.
    """

    def __init__(self) -> None:
        self.generator: torch.Generator | None = None


class MixingBatchSampler:
    """Yields each epoch's batches of a ``MixedDataset``, each from one set, by the rule.

    No ``batch_size`` attribute: its batches may be shorter (a set's last), which accelerate
    deals out to processes as batches of varying size.

    Args:
        dataset: The concatenated sets.
        batch_size: Samples per batch.
        shuffle: Shuffle each set and the order of the batches (else the sets in order, their
            batches spread evenly through the epoch: round-robin is always in turn).
        drop_last: Drop each set's last batch when it is short (``"weighted"``: never short).

    Attributes:
        sampler: What holds the ``generator`` the order is drawn from (accelerate's name).
        epoch_sets: The set (position in ``dataset.names``) of each batch of the epoch drawn
            last, in order, over all processes.
    """

    def __init__(
        self, dataset: MixedDataset, batch_size: int, *, shuffle: bool, drop_last: bool
    ) -> None:
        self.dataset, self.batch_size_of_sets = dataset, batch_size
        self.shuffle, self.drop_last_of_sets = shuffle, drop_last
        self.sampler = _OrderSource()
        self.epoch_sets: list[int] = []
        sizes = [len(data) for data in dataset.datasets]  # type: ignore[arg-type]
        whole = [size // batch_size if drop_last else -(-size // batch_size) for size in sizes]
        self._sizes, self._counts = sizes, whole
        sets = dataset.sets
        if sets.rule == "weighted":
            assert sets.weights is not None
            self._counts = _shares([sets.weights[name] for name in sets], sum(whole))

    def __len__(self) -> int:
        return sum(self._counts)

    def __iter__(self) -> Iterator[list[int]]:
        generator = self.sampler.generator
        if generator is None:  # one process: from the global generator, as RandomSampler does
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            generator = torch.Generator().manual_seed(seed)
        batches = self._batches_of_sets(generator)
        order = self._order(generator)
        self.epoch_sets = order
        cursors = [0] * len(batches)
        for position in order:
            yield batches[position][cursors[position]]
            cursors[position] += 1

    def set_of_step(self, step: int, num_processes: int, process_index: int) -> int:
        """The set of this process's ``step``-th batch of the epoch (accelerate's dealing).

        Batch ``i`` of the epoch goes to process ``i % num_processes``; the last round is
        completed with the epoch's first batches.
        """
        total = len(self.epoch_sets)
        index = step * num_processes + process_index
        if index >= total:
            index = (index - total) % min(total, num_processes)
        return self.epoch_sets[index]

    def _batches_of_sets(self, generator: torch.Generator) -> list[list[list[int]]]:
        """Each set's batches of the epoch, as indices into the concatenation."""
        size, found = self.batch_size_of_sets, []
        offsets = [0, *self.dataset.cumulative_sizes[:-1]]
        weighted = self.dataset.sets.rule == "weighted"
        for offset, length, count in zip(offsets, self._sizes, self._counts, strict=True):
            needed = count * size if weighted else length
            passes = [self._pass(length, generator) for _ in range(max(1, -(-needed // length)))]
            stream = torch.cat(passes)[:needed]
            indices = (stream + offset).tolist()
            batches = [indices[start : start + size] for start in range(0, len(indices), size)]
            found.append(batches[:count])
        return found

    def _pass(self, length: int, generator: torch.Generator) -> torch.Tensor:
        """One pass over a set: its indices, shuffled or in order."""
        if self.shuffle:
            return torch.randperm(length, generator=generator)
        return torch.arange(length)

    def _order(self, generator: torch.Generator) -> list[int]:
        """The set of each batch of the epoch, in order."""
        counts = self._counts
        if self.dataset.sets.rule == "round_robin":
            order, left = [], list(counts)
            while any(left):
                for position, remaining in enumerate(left):
                    if remaining:
                        order.append(position)
                        left[position] -= 1
            return order
        flat = [position for position, count in enumerate(counts) for _ in range(count)]
        if self.shuffle:
            return [flat[i] for i in torch.randperm(len(flat), generator=generator).tolist()]
        # in order: each set's batches spread evenly through the epoch (ties: mapping order)
        keyed = [
            ((number + 0.5) / count, position)
            for position, count in enumerate(counts)
            for number in range(count)
        ]
        return [position for _, position in sorted(keyed)]


def _shares(weights: list[float], total: int) -> list[int]:
    """``total`` split by ``weights`` (largest remainders; ties to the earlier set)."""
    scale = sum(weights)
    exact = [weight / scale * total for weight in weights]
    counts = [math.floor(value) for value in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


class SetLossesCallback(TrainerCallback):
    """Logs each training set's loss, ``train_loss_<name>_epoch``, through ``Trainer.log``.

    Each step logs its loss under its set's name (weighted as the epoch's loss: by
    ``num_items``, else the batch size) and nothing (weight 0) under the others', so every
    process logs the same names; the values stay on the device until the epoch's end and are
    saved in a training state saved mid-epoch. Added by ``mix_training_sets`` for one run;
    it removes itself when the run ends, or from a later run over other data.
    """

    order = -100  # before a save at the same step (``SaveTrainingStateCallback``)
    may_stop_training = False

    def __init__(self, dataset: MixedDataset, sampler: MixingBatchSampler) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.names = [f"loss_{name}" for name in dataset.names]
        self._others: list[dict[str, torch.Tensor]] = []  # by set: the others' names, 0
        self._all: dict[str, torch.Tensor] = {}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """Remove itself from a run over other data."""
        if trainer.train_dataset is not self.dataset:
            trainer.callback_handler.remove_callback(self)

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Log the step's loss under its set's name, and weight 0 under the others'."""
        accelerator = trainer.accelerator
        position = self.sampler.set_of_step(
            kwargs["step"], accelerator.num_processes, accelerator.process_index
        )
        if not self._others:
            nothing = torch.zeros((), device=trainer.device)
            self._others = [
                {name: nothing for name in self.names if name != own} for own in self.names
            ]
            self._all = dict.fromkeys(self.names, nothing)
        loss = batch_output["loss"]
        if loss is None:  # a skipped batch (skip_failing_batches): no loss, the same names
            trainer.log_dict(self._all, weight=0)
            return
        weight = batch_output.get("num_items")
        weight = batch_output["batch_size"] if weight is None else weight
        trainer.log(self.names[position], loss, weight=weight)
        if len(self.names) > 1:
            trainer.log_dict(self._others[position], weight=0)

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """Remove itself: the next run says again whether it mixes sets."""
        trainer.callback_handler.remove_callback(self)


def mix_training_sets(trainer: Any, arguments: TrainArguments) -> TrainArguments:
    """Turn ``train()``'s mapping of training sets into one dataset and its batch sampler.

    Adds a ``SetLossesCallback`` to ``trainer`` for the run (replacing an earlier one).

    Args:
        trainer: The trainer whose ``train()`` was called.
        arguments: ``train()``'s arguments, ``train_dataset`` a mapping or ``TrainingSets``.

    Returns:
        The arguments with ``train_dataset`` a ``MixedDataset`` and a ``MixingBatchSampler``
        in ``train_dataloader_kwargs`` (which gave it ``batch_size``, ``shuffle`` and
        ``drop_last``, if they named them). For an overfit run, the ``MixedDataset`` alone:
        it overfits the first batches of the sets' concatenation, in order.
    """
    where, data = "Trainer.train", arguments.train_dataset
    sets = data if isinstance(data, TrainingSets) else None
    if sets is None:
        sets = TrainingSets(_checked_sets(where, "train_dataset", data))
    given = arguments.train_dataloader_kwargs
    if given is not None and not isinstance(given, Mapping):
        return arguments  # the argument checks refuse it
    if arguments.overfit_batches is not None:  # the first batches of the sets, in order
        return arguments.replace(train_dataset=MixedDataset(sets))
    if arguments.auto_scale_lr is not None:  # the run config has no batch size to scale by
        fail(
            ValueError,
            where,
            "auto_scale_lr",
            arguments.auto_scale_lr,
            "None with several training sets",
            "Scale the learning rates yourself: by processes x per_device_batch_size x "
            "gradient_accumulation_steps over your base batch size.",
        )
    kwargs = dict(given or {})
    for name in ("sampler", "batch_sampler"):
        if name in kwargs:
            fail(
                ValueError,
                where,
                f"train_dataloader_kwargs[{name!r}]",
                kwargs[name],
                "left out with several training sets",
                "The sets' sampling rule chooses the batches: pass TrainingSets(sets, rule=..., "
                "weights=...) as train_dataset, or concatenate the sets and use your sampler.",
            )
    batch_size = kwargs.pop("batch_size", None) or arguments.per_device_batch_size or 8
    check_positive_int(where, "per_device_batch_size", batch_size)
    shuffle, drop_last = kwargs.pop("shuffle", True), kwargs.pop("drop_last", False)
    dataset = MixedDataset(sets)
    sampler = MixingBatchSampler(
        dataset, batch_size, shuffle=bool(shuffle), drop_last=bool(drop_last)
    )
    kwargs["batch_sampler"] = sampler
    handler = trainer.callback_handler
    handler.remove_callback(SetLossesCallback)
    handler.add_callback(SetLossesCallback(dataset, sampler))
    return arguments.replace(train_dataset=dataset, train_dataloader_kwargs=kwargs)
