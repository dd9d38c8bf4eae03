"""Compute torchmetrics metrics on gathered predictions and record them in the run history."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import send_to_device

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_bool, check_callable, fail

if TYPE_CHECKING:
    from torchmetrics import Metric, MetricCollection

    from pytorch_accel.protocols import TrainerLike

__all__ = ["MetricsCallback", "Prepare", "default_prepare", "metric_name_of"]

Prepare = Callable[[Any, Mapping[str, Any]], tuple[Any, Any]]
"""``prepare(batch, batch_output) -> (predictions, targets)``."""

INTERMEDIATE_PREFIX = "intermediate_"
"""Prefix of the values computed in an intermediate evaluation (``is_intermediate=True``)."""

_INSTALL_HINT = 'MetricsCallback needs torchmetrics: pip install "pytorch-accel[metrics]".'


class MetricsCallback(TrainerCallback):
    """Update torchmetrics metrics on every eval step and record them at each epoch's end.

    At each evaluation step, ``prepare(batch, batch_output)`` gives ``(predictions, targets)``,
    gathered from all processes with ``trainer.gather_for_metrics`` (without the samples
    accelerate repeats to even out the last batches) and passed to the metrics' ``update``;
    at the end of the evaluation epoch the metrics are computed, recorded in the run history
    and reset. With ``train=True`` a copy does the same on the training steps.

    Names: a bare ``Metric`` is recorded as ``name``, by default its class name in snake case
    (``MulticlassAccuracy`` → ``multiclass_accuracy``); a ``MetricCollection`` (or a dict of
    metrics) under its keys. Evaluation values get ``prefix``, training values
    ``train_prefix``; an intermediate evaluation (``is_intermediate=True``) adds
    ``intermediate_`` in front, as the trainer does for its loss. A scalar result is recorded
    as a float, any other tensor as a (nested) list.

    Every process gathers all predictions and computes the same values; torchmetrics' own
    cross-process synchronisation is switched off (it would count every sample once per
    process). Gathering is a collective: every process must run the same steps.

    The metrics are moved to ``trainer.device`` when each run starts. Order ``-20``:
    callbacks of the default order can read its values at the same event. The training
    metrics' state is part of the training state (``state_dict``), so a run resumed
    mid-epoch records the same training metrics as an uninterrupted one.

    Args:
        metrics: A torchmetrics ``Metric``, ``MetricCollection`` or dict of metrics.
        train: Also compute the metrics on the training steps (costs a gather per step).
        prefix: Prepended to the names of evaluation values.
        train_prefix: Prepended to the names of training values.
        name: The name of a bare ``Metric`` (not allowed with a collection).
        prepare: ``prepare(batch, batch_output) -> (predictions, targets)``; defaults to
            ``default_prepare``. Subclasses may override the ``prepare`` method instead.

    Raises:
        ImportError: If torchmetrics is not installed.

    Example:
        ```python
        from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

        metrics = MetricsCallback(
            {"accuracy": MulticlassAccuracy(num_classes=10),
             "f1": MulticlassF1Score(num_classes=10)},
            train=True,
        )
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, metrics))
        trainer.train(train_dataset, num_epochs=3, eval_dataset=eval_dataset)
        trainer.run_history.get_metric_values("accuracy")  # also "f1", "train_accuracy", ...
        ```
    """

    order = -20
    may_stop_training = False

    def __init__(
        self,
        metrics: Metric | MetricCollection | Mapping[str, Metric],
        *,
        train: bool = False,
        prefix: str = "",
        train_prefix: str = "train_",
        name: str | None = None,
        prepare: Prepare | None = None,
    ) -> None:
        _check_arguments(train, prefix, train_prefix, name, prepare)
        self.eval_metrics, collection = _as_metric(metrics, name)
        self.name = None if collection else name or metric_name_of(self.eval_metrics)
        self.prefix, self.train_prefix = prefix, train_prefix
        self._prepare_fn = prepare
        _no_own_sync(self.eval_metrics)
        self.train_metrics = self.eval_metrics.clone() if train else None
        self._updated = {"eval": False, "train": False}
        self._device: torch.device | None = None
        if not train:  # not listening to training steps keeps them free of any work
            self.on_train_epoch_start = None  # type: ignore[assignment]
            self.on_train_step_end = None  # type: ignore[assignment]
            self.on_train_epoch_end = None  # type: ignore[assignment]

    def prepare(self, batch: Any, batch_output: Mapping[str, Any]) -> tuple[Any, Any]:
        """Return ``(predictions, targets)`` of one batch, before gathering; override it."""
        if self._prepare_fn is not None:
            return self._prepare_fn(batch, batch_output)
        return default_prepare(batch, batch_output)

    def state_dict(self) -> dict[str, Any]:
        """Return the training metrics' accumulated state (saved in training states)."""
        if self.train_metrics is None:
            return {}
        return {"train": _metric_states(self.train_metrics), "updated": self._updated["train"]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state returned by ``state_dict``, on the metrics' device."""
        if self.train_metrics is None or not state_dict:
            return
        _load_metric_states(self.train_metrics, state_dict["train"], self._device)
        self._updated["train"] = bool(state_dict["updated"])

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Move the metrics to the trainer's device."""
        self._device = trainer.device
        for metrics in (self.eval_metrics, self.train_metrics):
            if metrics is not None:
                metrics.to(trainer.device)

    on_evaluation_run_start = on_training_run_start

    def on_train_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the training metrics afresh."""
        self._reset("train")

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Update the training metrics with the step's gathered predictions."""
        self._update(trainer, "train", batch, batch_output)

    def on_train_epoch_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Record the training metrics of the epoch and reset them."""
        self._record(trainer, "train", self.train_prefix)

    def on_eval_epoch_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the evaluation metrics afresh."""
        self._reset("eval")

    def on_eval_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Update the evaluation metrics with the step's gathered predictions."""
        self._update(trainer, "eval", batch, batch_output)

    def on_eval_epoch_end(
        self, trainer: TrainerLike, is_intermediate: bool = False, **kwargs: Any
    ) -> None:
        """Record the evaluation metrics of the epoch and reset them."""
        prefix = f"{INTERMEDIATE_PREFIX}{self.prefix}" if is_intermediate else self.prefix
        self._record(trainer, "eval", prefix)

    def _metrics(self, phase: str) -> Metric | MetricCollection:
        metrics = self.eval_metrics if phase == "eval" else self.train_metrics
        assert metrics is not None
        return metrics

    def _reset(self, phase: str) -> None:
        self._metrics(phase).reset()
        self._updated[phase] = False

    def _update(self, trainer: TrainerLike, phase: str, batch: Any, batch_output: Any) -> None:
        if batch_output.get("skipped"):  # skip_failing_batches: skipped on every process
            return
        with torch.no_grad():
            predictions, targets = self.prepare(batch, batch_output)
            predictions, targets = trainer.gather_for_metrics((predictions, targets))
            self._metrics(phase).update(predictions, targets)
        self._updated[phase] = True

    def _record(self, trainer: TrainerLike, phase: str, prefix: str) -> None:
        """Compute, record and reset; an epoch without updates (stopped early) records nothing."""
        metrics = self._metrics(phase)
        if self._updated[phase]:
            for key, value in self._named(metrics.compute()).items():
                trainer.run_history.update_metric(f"{prefix}{key}", _to_python(value))
        self._reset(phase)

    def _named(self, values: Any) -> dict[str, Any]:
        """Name the computed values: a collection's by their keys, a bare metric's by ``name``."""
        if self.name is None:
            return dict(values)
        if isinstance(values, Mapping):  # a metric computing several values, e.g. mAP
            return {f"{self.name}_{key}": value for key, value in values.items()}
        return {self.name: values}


def default_prepare(batch: Any, batch_output: Mapping[str, Any]) -> tuple[Any, Any]:
    """Return the class predictions and the targets of a ``(inputs, targets)`` batch.

    Predictions are ``batch_output["model_outputs"]``, reduced with ``argmax`` over dimension
    1 when that is a class dimension (size > 1), as in logits ``(N, C)`` or ``(N, C, H, W)``.
    Targets are ``batch[1]``, or ``batch["labels"]`` for a dict batch. Metrics that need
    scores (AUROC, calibration) need their own ``prepare``, e.g.
    ``lambda batch, output: (output["model_outputs"].softmax(dim=1), batch[1])``.

    Raises:
        ValueError: If ``batch_output`` has no ``model_outputs``.
    """
    if "model_outputs" not in batch_output:
        raise ValueError(
            "MetricsCallback: batch_output has no 'model_outputs' (keys: "
            f"{sorted(batch_output)}). Return it from calculate_*_batch_loss, or pass "
            "MetricsCallback(..., prepare=lambda batch, output: (predictions, targets))."
        )
    outputs = batch_output["model_outputs"]
    if isinstance(outputs, torch.Tensor) and outputs.ndim >= 2 and outputs.shape[1] > 1:
        outputs = outputs.argmax(dim=1)
    if isinstance(batch, Mapping):
        if "labels" not in batch:
            raise ValueError(
                "MetricsCallback: a dict batch gives the targets as 'labels', got keys "
                f"{sorted(batch)}. Add 'labels' to the batch, or pass MetricsCallback(..., "
                "prepare=lambda batch, output: (predictions, targets))."
            )
        return outputs, batch["labels"]
    return outputs, batch[1]


def _metric_states(metrics: Metric | MetricCollection) -> dict[str, dict[str, Any]]:
    """Return the accumulated state of each metric (``metric_state``), by its collection key."""
    return {key: dict(metric.metric_state) for key, metric in _members(metrics, copy_state=False)}


def _load_metric_states(
    metrics: Metric | MetricCollection,
    states: Mapping[str, Mapping[str, Any]],
    device: torch.device | None,
) -> None:
    """Set the states ``_metric_states`` returned on ``metrics`` (moved to ``device``).

    A collection's members get states of their own first (``copy_state``); metrics of one
    compute group share them again at the next update.
    """
    for key, metric in _members(metrics, copy_state=True):
        state = states[key] if device is None else send_to_device(states[key], device)
        for name, value in state.items():
            setattr(metric, name, value)


def _members(metrics: Metric | MetricCollection, *, copy_state: bool) -> list[tuple[str, Metric]]:
    from torchmetrics import Metric, MetricCollection

    if isinstance(metrics, MetricCollection):
        members = metrics.items(keep_base=True, copy_state=copy_state)
        return [(key, metric) for key, metric in members if isinstance(metric, Metric)]
    return [("", metrics)]


def metric_name_of(metric: object) -> str:
    """Return the class name of ``metric`` in snake case.

    ``MulticlassAccuracy`` → ``multiclass_accuracy``, ``MulticlassF1Score`` →
    ``multiclass_f1_score``, ``BinaryAUROC`` → ``binary_auroc``.
    """
    name = type(metric).__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _as_metric(metrics: object, name: str | None) -> tuple[Metric | MetricCollection, bool]:
    """The metrics as a ``Metric`` or ``MetricCollection``, and whether it is a collection."""
    try:
        from torchmetrics import Metric, MetricCollection
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    if isinstance(metrics, Mapping):
        metrics = MetricCollection(dict(metrics))
    if not isinstance(metrics, (Metric, MetricCollection)):
        fail(
            TypeError,
            "MetricsCallback",
            "metrics",
            metrics,
            "a torchmetrics Metric, MetricCollection or dict of metrics",
            "Pass e.g. MulticlassAccuracy(num_classes=10).",
        )
    if name is not None and isinstance(metrics, MetricCollection):
        fail(
            ValueError,
            "MetricsCallback",
            "name",
            name,
            "None with a MetricCollection",
            "Name the metrics of a collection with its keys, e.g. {'accuracy': ...}.",
        )
    return metrics, isinstance(metrics, MetricCollection)


def _never_distributed() -> bool:
    return False


def _no_own_sync(metrics: Metric | MetricCollection) -> None:
    """Stop torchmetrics from summing states across processes: the inputs are gathered already."""
    from torchmetrics import Metric

    for module in metrics.modules():
        if isinstance(module, Metric):
            module.distributed_available_fn = _never_distributed


def _to_python(value: Any) -> Any:
    """A scalar tensor as a Python number, any other tensor as a nested list (one host read)."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def _check_arguments(
    train: object, prefix: object, train_prefix: object, name: object, prepare: object
) -> None:
    where = "MetricsCallback"
    check_bool(where, "train", train)
    for arg, value in (("prefix", prefix), ("train_prefix", train_prefix)):
        if not isinstance(value, str):
            fail(TypeError, where, arg, value, "a str", f"Pass e.g. {arg}='val_'.")
    if name is not None and (not isinstance(name, str) or not name):
        fail(
            TypeError, where, "name", name, "a non-empty str or None", "Pass e.g. name='accuracy'."
        )
    check_callable(
        where, "prepare", prepare, "Pass a function (batch, batch_output) -> (preds, targets)."
    )
