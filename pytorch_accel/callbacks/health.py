"""Training health: the gradient norm of a chosen type, and where values became non-finite."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_positive_int, fail

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["GradientHealthCallback"]

_MAX_NAMED = 5
"""How many parameters a non-finite report names."""


class GradientHealthCallback(TrainerCallback):
    """Log the gradient norm of a chosen type, and report non-finite gradients and weights.

    Every ``log_every_n_updates`` updates (the update's global count), at
    ``on_optimizer_step_start``, it computes on the device, without reading anything on the
    host:

    - the total gradient norm of type ``norm_type`` (``2.0``, ``1.0``, ``math.inf``, ...),
      logged with ``trainer.log`` as ``grad_norm_l<type>`` (``grad_norm_l2``,
      ``grad_norm_linf``): the run history gets its mean over the epoch's logging points as
      ``train_grad_norm_l2_epoch``, and step logging (``TrackingCallback``,
      ``RunRecordCallback``) its mean over each interval as ``train_grad_norm_l2_step``. These
      are the gradients the optimizer applies: after clipping by value, and, with
      ``train(max_grad_norm=...)`` and ``norm_type=2``, the norm before clipping by norm that
      the trainer already computed (``trainer.grad_norm``);
    - with ``per_layer=True``, the same norm for each top-level module of the model
      (``grad_norm_l2_<module>``, e.g. ``grad_norm_l2_encoder``);
    - the number of non-finite gradient values, logged (summed) as ``nonfinite_grads``, and
      for each parameter, kept on the device.

    At each epoch end (host reads of two small tensors, beside the epoch's own exchange) it
    warns (``RuntimeWarning``) naming the parameters whose gradients were not finite at the
    epoch's first logging point with any (where it started: an update spreads
    them), and those whose weights are not finite at the epoch's end, e.g.
    ``non-finite gradients first at update 120 (epoch 2): encoder.1.weight (3 of 64
    values)``. The reports are kept in ``reports``. A ``GradScaler`` (fp16) skips updates
    with non-finite gradients on purpose: those are reported too.

    Gradients are read from the local process: under DDP they are the averaged gradients,
    the same on every process; under FSDP each process holds shards, and the norms are of
    this process's shards (the logged mean across processes is not the global norm).

    Args:
        norm_type: The norm's type (``p`` of the ``p``-norm; ``math.inf`` for the largest
            absolute value).
        log_every_n_updates: Compute at every this many updates.
        per_layer: Also log the norm of each top-level module's gradients.
        report_nonfinite: Count non-finite gradients and report them (and non-finite weights)
            at epoch ends.

    Raises:
        ValueError: If ``norm_type`` is not a positive number or ``log_every_n_updates`` not
            a positive int.

    Example:
        ```python
        health = GradientHealthCallback(norm_type=2.0, log_every_n_updates=50)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, health))
        ```
    """

    may_stop_training = False

    def __init__(
        self,
        norm_type: float = 2.0,
        log_every_n_updates: int = 50,
        *,
        per_layer: bool = False,
        report_nonfinite: bool = True,
    ) -> None:
        where = "GradientHealthCallback"
        valid = isinstance(norm_type, (int, float)) and not isinstance(norm_type, bool)
        if not valid or not norm_type > 0:
            fail(
                ValueError,
                where,
                "norm_type",
                norm_type,
                "a positive number (2.0, 1.0, math.inf)",
                "Pass norm_type=2.0 for the Euclidean norm.",
            )
        check_positive_int(where, "log_every_n_updates", log_every_n_updates)
        check_bool(where, "per_layer", per_layer)
        check_bool(where, "report_nonfinite", report_nonfinite)
        self.norm_type = float(norm_type)
        self.log_every_n_updates = log_every_n_updates
        self.per_layer = per_layer
        self.report_nonfinite = report_nonfinite
        self.name = f"grad_norm_l{'inf' if math.isinf(norm_type) else f'{norm_type:g}'}"
        self.reports: list[str] = []
        self._bad_grads: torch.Tensor | None = None  # per parameter: the epoch's worst count
        self._grad_names: list[str] = []  # the parameters of ``_bad_grads``
        self._bad_update = torch.zeros((), dtype=torch.long)  # the update of ``_bad_grads``

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start the epoch's per-parameter counts."""
        self._bad_grads = None

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """At a logging point, compute the norms and counts on the device and log them."""
        if (trainer.global_num_updates + 1) % self.log_every_n_updates:
            return
        named = [
            (name, parameter.grad.detach())
            for name, parameter in trainer.get_model().named_parameters()
            if parameter.grad is not None
        ]
        if not named:
            return
        grads = [grad for _, grad in named]
        given = trainer.grad_norm
        use_given = given is not None and self.norm_type == 2.0
        total = given if use_given else torch.nn.utils.get_total_norm(grads, self.norm_type)
        metrics: dict[str, Any] = {self.name: total}
        if self.per_layer:
            layers: dict[str, list[torch.Tensor]] = {}
            for name, grad in named:
                layers.setdefault(name.split(".", 1)[0], []).append(grad)
            for layer, tensors in layers.items():
                norm = torch.nn.utils.get_total_norm(tensors, self.norm_type)
                metrics[f"{self.name}_{layer}"] = norm
        trainer.log_dict(metrics)
        if self.report_nonfinite:
            counts = torch.stack([(~torch.isfinite(grad)).sum() for grad in grads])
            names = [name for name, _ in named]
            if self._bad_grads is not None and names != self._grad_names:
                self._bad_grads = None  # other parameters have gradients now: start again
            self._grad_names = names
            update = torch.full((), trainer.global_num_updates + 1, device=counts.device)
            if self._bad_grads is None:
                self._bad_grads, self._bad_update = counts, update
            else:  # keep the first logging point with a non-finite value (on the device)
                seen = self._bad_grads.sum() > 0
                self._bad_grads = torch.where(seen, self._bad_grads, counts)
                self._bad_update = torch.where(seen, self._bad_update, update)
            trainer.log("nonfinite_grads", counts.sum(), reduce="sum")

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """Warn naming the parameters with non-finite gradients or weights (two host reads)."""
        if not self.report_nonfinite:
            return
        model = trainer.get_model()
        parameters = list(model.named_parameters())
        weights = torch.stack([(~torch.isfinite(p.detach())).sum() for _, p in parameters])
        epoch = trainer.run_history.current_epoch
        bad_weights = weights.tolist()
        sizes = {name: p.numel() for name, p in parameters}
        names = [name for name, _ in parameters]
        report = _named("weights", names, bad_weights, sizes, f"at the end of epoch {epoch}")
        if self._bad_grads is not None:
            *bad_grads, update = torch.cat([self._bad_grads, self._bad_update.view(1)]).tolist()
            where = f"first at update {update} (epoch {epoch})"
            report = _named("gradients", self._grad_names, bad_grads, sizes, where) + report
        if report:
            text = "; ".join(report)
            self.reports.append(text)
            warnings.warn(f"GradientHealthCallback: {text}", RuntimeWarning, stacklevel=2)
        self._bad_grads = None


def _named(
    kind: str, names: list[str], counts: list[int], sizes: dict[str, int], where: str
) -> list[str]:
    """``non-finite <kind> <where>: a (3 of 64 values), ...``, or nothing."""
    bad = [(name, count) for name, count in zip(names, counts, strict=True) if count]
    if not bad:
        return []
    shown = ", ".join(
        f"{name} ({count} of {sizes[name]} values)" for name, count in bad[:_MAX_NAMED]
    )
    more = f" and {len(bad) - _MAX_NAMED} more" if len(bad) > _MAX_NAMED else ""
    return [f"non-finite {kind} {where}: {shown}{more}"]
