"""The splitter of ``train(on_oom="split")``: more micro-batches of the same total on OOM.

The loop's step hook (see ``pytorch_accel.plugins``); ``pytorch_accel.micro_batches`` says
what it does and holds the choices and errors ``train()`` checks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import (
    concatenate,
    find_batch_size,
    recursively_apply,
    slice_tensors,
)
from accelerate.utils.memory import clear_device_cache

from pytorch_accel._batches import NUM_ITEMS_IN_BATCH
from pytorch_accel._checks import check_batch_output, fail
from pytorch_accel.distributed import AgreedFlag
from pytorch_accel.errors import StopTrainingError
from pytorch_accel.micro_batches import BatchDoesNotFitError, is_out_of_memory
from pytorch_accel.tracking import BATCH_OUTPUT_KEYS, get_logger

if TYPE_CHECKING:
    from pytorch_accel.plugins import TrainStep

__all__ = ["MicroBatchSplitter"]

_OK, _OOM, _STOP, _STUCK, _FAIL = 0, 1, 2, 3, 4
"""What a step did on one process, agreed as the maximum over the processes: an error beats
an out-of-memory error that cannot be split further, which beats a stop, which beats a split."""


class MicroBatchSplitter:
    """Runs each training step in ``splits`` micro-batches (a power of two), doubled on OOM.

    With ``num_processes > 1`` the processes agree after every step; a ``probe`` raises
    ``BatchDoesNotFitError`` on out-of-memory instead of splitting.
    """

    def __init__(self, num_processes: int, probe: bool = False) -> None:
        self.splits = 1
        self._probe = probe
        self._announce: str | None = None
        self._agreement = AgreedFlag() if num_processes > 1 else None

    def synchronises(self, model: torch.nn.Module) -> bool:
        """Whether the loop, not DDP, synchronises ``model``'s replicas (several processes).

        Raises ``ValueError`` for a model DDP does not wrap (FSDP, DeepSpeed): its collectives
        in the backward pass could not be agreed on.
        """
        if self._agreement is None:
            return False
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            fail(
                ValueError,
                "Trainer.train",
                "on_oom",
                "split",
                "'raise' with several processes and a model that DDP does not wrap",
                f"The model is a {type(model).__name__}: its collectives in the backward pass "
                "would wait for a process that ran out of memory. Use DDP, or on_oom='raise'.",
            )
        return True

    def end_window(self) -> bool:
        """Whether the window that ends here has gradients: always (no step is skipped)."""
        return True

    def run_step(self, step: TrainStep, batch: Any, scale: float) -> dict[str, Any]:
        """Run the training step of ``batch`` in micro-batches (the loop's step hook).

        Returns the micro-batches' merged output, tracked.
        """
        batch_output = self.run(step, batch, scale)
        step.track(batch_output)
        return batch_output

    def run(self, step: TrainStep, batch: Any, scale: float) -> dict[str, Any]:
        """Forward and back-propagate ``batch`` in micro-batches; return its merged output.

        ``scale`` is the batch's share of its window. Raises ``BatchDoesNotFitError`` when
        probing, and ``RuntimeError`` on out-of-memory with micro-batches of one sample.
        """
        weighting = step.item_weighting
        while True:
            parameters = list(step.model.parameters())
            held = [parameter.grad for parameter in parameters]  # the window's earlier steps
            for parameter in parameters:
                parameter.grad = None
            counted = weighting.snapshot()
            outputs: list[dict[str, Any]] = []
            own, agreed, error = self._attempt(step, batch, scale, outputs)
            if agreed == _OK:
                for parameter, grad in zip(parameters, held, strict=True):  # add them back
                    if parameter.grad is None:
                        parameter.grad = grad
                    elif grad is not None:
                        parameter.grad.add_(grad)
                if self._announce is not None:
                    self._say_split(batch)
                return _merged(outputs)
            outputs.clear()  # drop what the failed step holds, then free it
            for parameter, grad in zip(parameters, held, strict=True):
                parameter.grad = grad
            del parameters, held
            weighting.restore(counted)
            clear_device_cache(garbage_collection=True)
            self._after_failure(step, batch, own, agreed, error)

    def _attempt(
        self, step: TrainStep, batch: Any, scale: float, outputs: list[Any]
    ) -> tuple[int, int, BaseException | None]:
        """Run the step's micro-batches; return its outcome here, the agreed one, the error."""
        weighting = step.item_weighting
        agreement, own = self._agreement, _OK
        error: BaseException | None = None
        try:
            for chunk, share in self._chunks(batch):
                output = check_batch_output(step.forward(chunk), "calculate_train_batch_loss")
                if agreement is not None and weighting.agrees_on_reference:
                    # the weighting's first exchange: agree on the forward passes before it
                    agreed = agreement.settle(_OK)
                    if agreed != _OK:
                        return _OK, agreed, None
                scaled = step.scaled_loss(output, scale * share)
                step.backward(output, scaled, chunk)
                outputs.append(output)
        except StopTrainingError as stop:
            own, error = _STOP, stop
        except Exception as raised:
            if is_out_of_memory(raised):
                rows = math.ceil(int(find_batch_size(batch)) / self.splits)
                own = _STUCK if rows <= 1 and not self._probe else _OOM
                if own == _OOM:
                    raised.with_traceback(None)  # its frames hold the failed step's tensors
            elif agreement is None:
                raise
            else:
                own = _FAIL
            error = raised
        if agreement is None:
            return own, own, error
        return own, agreement.settle(own), error

    def _after_failure(
        self,
        step: TrainStep,
        batch: Any,
        own: int,
        agreed: int,
        error: BaseException | None,
    ) -> None:
        """Raise what the processes agreed on, or split further (and say so once)."""
        if agreed == _STUCK:
            raise RuntimeError(
                "Trainer.train: out of memory with micro-batches of one sample (on_oom='split' "
                "cannot split them further; see the traceback of the process that ran out). "
                "Use a smaller model or lower precision, or fewer samples per batch."
            ) from error
        if own == agreed and error is not None and agreed != _OOM:
            raise error
        if agreed == _STOP:
            raise StopTrainingError("Stopping: another process raised StopTrainingError.")
        if agreed == _FAIL:
            raise RuntimeError(
                "Trainer.train: calculate_train_batch_loss or the backward pass raised on "
                "another process (see its traceback); every process stops with it."
            )
        where = step.position()
        if self._probe:
            raise BatchDoesNotFitError(f"The batch of {where} ran out of memory.")
        self.splits *= 2
        if self._announce is None:  # said once the step went through
            reason = "another process ran out of memory" if error is None else f"{error}"
            self._announce = f"on_oom='split': out of memory in {where} ({reason})."

    def _say_split(self, batch: Any) -> None:
        rows = find_batch_size(batch)
        get_logger().warning(
            f"{self._announce} From now on each batch of {rows} samples runs as {self.splits} "
            f"micro-batches of at most {math.ceil(rows / self.splits)}; the global batch and "
            "the updates are unchanged."
        )
        self._announce = None

    def _chunks(self, batch: Any) -> Iterator[tuple[Any, float]]:
        """The step's micro-batches, each with its share of the batch's rows."""
        if self.splits == 1:
            yield batch, 1.0
            return
        if isinstance(batch, Mapping) and NUM_ITEMS_IN_BATCH in batch:
            fail(
                ValueError,
                "Trainer.train",
                "on_oom",
                "split",
                "'raise' for batches that carry num_items_in_batch",
                "The count is the whole batch's and cannot be split with its rows: return "
                "num_items from calculate_train_batch_loss, computed from the micro-batch's "
                "labels (e.g. (labels != -100).sum()), instead of the batch's count.",
            )
        rows = find_batch_size(batch)
        bounds = [index * rows // self.splits for index in range(self.splits + 1)]
        for start, end in itertools.pairwise(bounds):
            if end > start:
                yield slice_tensors(batch, slice(start, end)), (end - start) / rows


def _merged(outputs: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``batch_output`` for the step: its micro-batches' outputs combined.

    ``loss`` and the extra scalars are the means weighted by ``num_items`` (else by batch
    size), ``batch_size`` and ``num_items`` the sums, ``model_outputs`` (and other tensors)
    concatenated, detached.
    """
    if len(outputs) == 1:
        return outputs[0]
    sizes = [output["batch_size"] for output in outputs]
    counts = [output.get("num_items") for output in outputs]
    merged: dict[str, Any] = {"batch_size": sum(sizes)}
    if all(count is not None for count in counts):
        merged["num_items"] = sum(counts)
    loss_weights = counts if "num_items" in merged else sizes
    merged["loss"] = _weighted_mean([output["loss"] for output in outputs], loss_weights)
    for key in outputs[0].keys() - merged.keys():
        values = [output.get(key) for output in outputs]
        scalar = all(
            type(value) is float
            or (isinstance(value, torch.Tensor) and value.ndim == 0 and value.is_floating_point())
            for value in values
        )
        if scalar and key not in BATCH_OUTPUT_KEYS:
            merged[key] = _weighted_mean(values, sizes)
            continue
        try:
            merged[key] = concatenate(recursively_apply(torch.Tensor.detach, values))
        except Exception:  # not tensors of one structure: the last micro-batch's
            merged[key] = values[-1]
    return merged


def _weighted_mean(values: list[Any], weights: list[Any]) -> Any:
    total = sum(
        (value.detach() if isinstance(value, torch.Tensor) else value) * weight
        for value, weight in zip(values, weights, strict=True)
    )
    return total / sum(weights)
