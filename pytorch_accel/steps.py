"""The overridable step methods and hooks of the ``Trainer``, and its process utilities.

``Trainer`` inherits these from ``TrainerSteps``: the training loop
(``pytorch_accel.training_loop``) calls them at every batch, epoch and run, so a subclass
customises the loop by overriding them. See the Training loop page of the documentation for
when each one runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accel._validation import inputs_and_targets
from pytorch_accel.preparation import Preparation

__all__ = ["TrainerSteps"]


class TrainerSteps:
    """The step methods, hooks and process utilities of a trainer (part of ``Trainer``)."""

    model: nn.Module
    loss_func: Callable[..., torch.Tensor] | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    _accelerator: Accelerator
    _preparation: Preparation

    def training_run_start(self) -> None:
        """Hook at the start of a training run (before ``on_training_run_start``)."""

    def train_epoch_start(self) -> None:
        """Hook at the start of each training epoch: puts the model in train mode."""
        self.model.train()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one training batch.

        Args:
            batch: ``(inputs, targets)`` by default.

        Returns:
            A dict with ``loss`` (the batch's mean loss, un-scaled), ``model_outputs`` and
            ``batch_size``. Gradient accumulation scaling happens in the loop.
        """
        pair = type(batch) is list and len(batch) == 2  # default_collate's (inputs, targets)
        inputs, targets = batch if pair else inputs_and_targets(batch, "calculate_train_batch_loss")
        model_outputs = self.model(inputs)
        loss = self.loss_func(model_outputs, targets)  # type: ignore[misc]  # checked by train()
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def backward_step(self, loss: torch.Tensor) -> None:
        """Run the backward pass of an already scaled loss.

        Through ``accelerator.backward`` when it does work (gradient scaling, DeepSpeed, ...);
        where it would only call ``loss.backward()``, that is called directly.
        """
        if self._preparation.direct_optimizer is None:
            self._accelerator.backward(loss)
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    def optimizer_step(self) -> None:
        """Update the parameters.

        Through accelerate's optimizer wrapper when it does work (gradient scaler, XLA,
        DeepSpeed, ...); where it would only forward the call, the inner optimizer is stepped
        directly, which saves most of accelerate's per-step overhead.
        """
        (self._preparation.direct_optimizer or self.optimizer).step()

    def scheduler_step(self) -> None:
        """Step the scheduler (called after each optimizer update that was not skipped)."""
        self.scheduler.step()

    def optimizer_zero_grad(self) -> None:
        """Reset the gradients after an update (to ``None``, as both torch and accelerate do)."""
        (self._preparation.direct_optimizer or self.optimizer).zero_grad()

    def train_epoch_end(self) -> None:
        """Hook at the end of each training epoch (``train_loss_epoch`` is recorded)."""

    def eval_epoch_start(self) -> None:
        """Hook at the start of each evaluation epoch: puts the model in eval mode."""
        self.model.eval()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Compute the loss of one evaluation batch, without gradients.

        Args:
            batch: ``(inputs, targets)`` by default.

        Returns:
            A dict with ``loss``, ``model_outputs`` and ``batch_size``.
        """
        with torch.no_grad():
            inputs, targets = inputs_and_targets(batch, "calculate_eval_batch_loss")
            model_outputs = self.model(inputs)
            loss = self.loss_func(model_outputs, targets)  # type: ignore[misc]  # checked on entry
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": targets.shape[0]}

    def calculate_predict_batch(self, batch: Any) -> Any:
        """Return the model's outputs for one batch, for ``predict()``.

        Args:
            batch: ``(inputs, ...)`` (a tuple or list, whose first item is the model's input),
                or the inputs themselves.

        Returns:
            The model's outputs (a tensor, or a structure of tensors with the batch first).
        """
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.model(inputs)

    def eval_epoch_end(self) -> None:
        """Hook at the end of each evaluation epoch (its loss is recorded)."""

    def training_run_epoch_end(self) -> None:
        """Hook after each completed epoch of a training run (train, then eval)."""

    def training_run_end(self) -> None:
        """Hook at the end of a training run, also after an early stop."""

    def evaluation_run_start(self) -> None:
        """Hook at the start of an evaluation run."""

    def evaluation_run_end(self) -> None:
        """Hook at the end of an evaluation run."""

    def gather(self, tensor: Any, padding_value: float | None = None) -> Any:
        """Gather tensors from all processes, concatenated on the first dimension.

        Args:
            tensor: A tensor, or a nested list/tuple/dict of tensors.
            padding_value: If given, first pad every process's tensors to the same first
                dimension with this value (needed when sizes differ).

        Returns:
            The gathered tensor(s). Every process must call this.
        """
        if padding_value is not None:
            tensor = self._accelerator.pad_across_processes(tensor, pad_index=padding_value)
        return self._accelerator.gather(tensor)

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather predictions or targets from all processes, without duplicated samples.

        When the eval set does not divide evenly, accelerate pads the last batches with
        repeated samples; this drops them, so metrics see every sample exactly once.
        """
        return self._accelerator.gather_for_metrics(data)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once per node (on each node's main process)."""
        self._accelerator.print(*args, **kwargs)

    def get_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """Return the model without its distributed or mixed-precision wrappers."""
        return self._accelerator.unwrap_model(  # type: ignore[no-any-return]
            self.model, keep_torch_compile=keep_torch_compile
        )
