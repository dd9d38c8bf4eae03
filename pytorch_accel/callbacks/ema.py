"""Keep an exponential moving average (EMA) of the model's weights, evaluate it and save it."""

from __future__ import annotations

import contextlib
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import DistributedType

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.callbacks._watch import MetricWatch
from pytorch_accel.checks import check_bool, check_path, fail
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.utils import EmaPairs, ModelEma

if TYPE_CHECKING:
    from pathlib import Path

    from pytorch_accel.protocols import TrainerLike

__all__ = ["EMA_METRIC_PREFIX", "ModelEmaCallback"]

EMA_METRIC_PREFIX = "ema_model_"
"""The run-history prefix of metrics recorded while the EMA weights are evaluated."""


class ModelEmaCallback(TrainerCallback):
    """Maintain ``ema = decay * ema + (1 - decay) * weights`` after every optimizer update.

    The EMA covers the unwrapped model's whole state dict: floating-point parameters and
    buffers (BatchNorm running statistics) are averaged, other tensors (BatchNorm's
    ``num_batches_tracked``) copied. It is kept on the model's device, updated at
    ``on_optimizer_step_end`` after each update the gradient scaler did not skip, and starts
    from the model's weights at the first ``train()``; later runs continue it unless
    ``reset_on_train=True``.

    The decay is warmed up by default, as timm's ``ModelEmaV3(use_warmup=True)`` does: the
    ``n``-th update (counted from 0 since the EMA started) uses
    ``min(decay, 1 - (1 + n) ** (-2 / 3))``: the first copies the weights, the tenth averages
    with 0.80, the hundredth with 0.95, and ``decay=0.99`` is reached after about 1000 updates.
    A short run's EMA then follows the model instead of staying near its initial weights
    (``decay`` 0.99 without warm-up keeps 0.99**72 = 48% of the initial weights after 72
    updates). ``warmup=False`` uses ``decay`` from the first update. The count is kept in
    the callback's state, so a resumed run continues the warm-up where it was.

    With ``evaluate_during_training``, each epoch with an eval set ends with one more
    evaluation epoch of the EMA weights, swapped into ``trainer.get_model()``: every metric
    recorded meanwhile gets the prefix ``ema_model_`` (``ema_model_eval_loss_epoch``) and the
    eval events fire with ``is_intermediate=False``. The prefix, the model's weights and the
    random state are restored exactly afterwards (also if it raises), so training follows the
    same path as without the callback. At the end of each run (also after an early stop) the
    EMA weights are saved to ``save_path`` with ``trainer.save_checkpoint`` (no optimizer
    state), loadable with ``trainer.load_checkpoint``.

    Order ``40``: before ``SaveBestModelCallback`` (50), ``LogMetricsCallback`` (100) and
    ``EarlyStoppingCallback`` (150), so they can use ``ema_model_eval_loss_epoch`` in the
    same epoch. Under FSDP2 each process averages its own shards (no communication); the
    saved weights are gathered by ``save_checkpoint`` like the model's, and a training state
    holds each process's shards. DeepSpeed and FSDP1 are refused.

    Args:
        decay: The weight of the old average, in ``(0, 1)``; ``0.999`` averages over roughly
            the last 1000 updates (once warmed up).
        evaluate_during_training: Evaluate the EMA weights after each epoch with an eval set.
        save_path: Where to save the EMA weights at the end of each run; ``None``: not saved
            (in ``trainer.run_dir`` when left out and the trainer has an ``output_dir``).
        reset_on_train: Restart the EMA from the model's weights at each ``train()``.
        watch_metric: If given (pytorch-accelerated's argument, e.g.
            ``"ema_model_eval_loss_epoch"``), ``save_path`` instead holds the EMA weights of
            the epoch with the best value of this metric, saved when it improves.
        greater_is_better: Whether larger ``watch_metric`` values are better (with a warning
            for a metric that is not a loss when left out).
        model_ema: pytorch-accelerated's EMA class; only ``pytorch_accel.utils.ModelEma`` (or
            ``None``) is accepted: the callback keeps its own average.
        callbacks: Not supported (must be empty): the EMA evaluation runs the trainer's own
            callbacks, whose metrics get the ``ema_model_`` prefix.
        warmup: Warm the decay up over the first updates (see above); ``False``: ``decay``
            from the first update (this callback's behaviour before the warm-up).

    Example:
        ```python
        ema = ModelEmaCallback(decay=0.999, save_path="ema_model.pt")
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, ema))
        trainer.train(train_dataset, num_epochs=10, eval_dataset=eval_dataset)
        trainer.run_history.get_metric_values("ema_model_eval_loss_epoch")
        with ema.swapped_into(trainer):  # the EMA weights, for as long as the block runs
            trainer.evaluate(test_dataset)
        ```
    """

    order = 40
    may_stop_training = False

    def __init__(
        self,
        decay: float = 0.99,
        evaluate_during_training: bool = True,
        save_path: str | os.PathLike[str] | None = DefaultPath("ema_model.pt"),
        reset_on_train: bool = False,
        watch_metric: str | None = None,
        greater_is_better: bool | None = None,
        model_ema: Any = None,
        callbacks: Iterable[Any] = (),
        *,
        warmup: bool = True,
    ) -> None:
        where = "ModelEmaCallback"
        _check_ported_arguments(model_ema, callbacks)
        _check_decay(decay)
        check_bool(where, "evaluate_during_training", evaluate_during_training)
        check_path(where, "save_path", save_path, allow_none=True)
        check_bool(where, "reset_on_train", reset_on_train)
        check_bool(where, "warmup", warmup)
        self.decay = float(decay)
        self.warmup = warmup
        self.evaluate_during_training = evaluate_during_training
        self.save_path = save_path
        self._run_paths = RunPaths(save_path=save_path)
        self.reset_on_train = reset_on_train
        self.num_ema_updates = 0
        self._ema: dict[str, torch.Tensor] | None = None
        self._watch: MetricWatch | None = None
        if watch_metric is not None:
            self._watch = MetricWatch(where, watch_metric, greater_is_better)
        self.best_metric: float | None = None
        self._binding: EmaPairs | None = None  # bound to the model of the current run
        self._sharded_by: int | None = None  # FSDP processes whose shards the EMA holds

    def redirect_outputs(self, directory: Path) -> contextlib.AbstractContextManager[None]:
        """Write the EMA weights under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "save_path")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the EMA weights' file under ``run_dir`` if ``save_path`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def state_dict(self) -> dict[str, Any]:
        """Return the EMA state: ``ema_state_dict`` (name -> tensor), ``decay``, updates.

        The tensors are the live EMA tensors (as in ``nn.Module.state_dict``): save or clone
        them before training continues. Under FSDP2 they are this process's shards.
        """
        return {
            "ema_state_dict": dict(self._ema or {}),
            "decay": self.decay,
            "num_ema_updates": self.num_ema_updates,
            "best_metric": self.best_metric,
            "sharded_by": self._sharded_by,
        }

    def rank_state_dict(self) -> dict[str, Any]:
        """Return this process's shards of the EMA under FSDP2 (else nothing), saved by all."""
        sharded = self._sharded_by is not None and self._ema is not None
        return {
            "sharded_by": self._sharded_by,
            "ema_state_dict": dict(self._ema or {}) if sharded else None,
        }

    def load_rank_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore this process's shards from ``rank_state_dict`` (after ``load_state_dict``)."""
        shards = state_dict.get("ema_state_dict")
        if shards:
            self._hold(shards, state_dict.get("sharded_by"))

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state from ``state_dict()``; it is moved to the model's device when bound.

        Args:
            state_dict: The dict returned by ``state_dict()`` (``decay`` is informational:
                the constructor's is kept).
        """
        weights = state_dict.get("ema_state_dict")
        if not isinstance(weights, Mapping) or not weights:
            fail(
                ValueError,
                "ModelEmaCallback.load_state_dict",
                "state_dict['ema_state_dict']",
                weights,
                "a non-empty dict of tensors",
                "Pass the dict returned by ModelEmaCallback.state_dict() after training.",
            )
        self._hold(weights, state_dict.get("sharded_by"))
        self.num_ema_updates = int(state_dict.get("num_ema_updates", 0))
        self.best_metric = state_dict.get("best_metric")

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Start the EMA from the model's weights (first run, or ``reset_on_train``); bind it."""
        sharded_by = _check_not_sharded(trainer)
        if self._ema is None or self.reset_on_train:
            self._hold(_model_state(trainer), sharded_by)
            self.num_ema_updates = 0
        self._bind(trainer)
        if self._watch is not None:
            self._watch.start_run(trainer)

    def on_optimizer_step_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Move the average towards the updated weights (skipped updates are ignored)."""
        if trainer.accelerator.optimizer_step_was_skipped:
            return
        (self._binding or self._bind(trainer)).update(self.current_decay())
        self.num_ema_updates += 1

    def current_decay(self) -> float:
        """Return the decay the next update uses (warmed up unless ``warmup=False``)."""
        if not self.warmup:
            return self.decay
        warmed: float = 1.0 - (1.0 + self.num_ema_updates) ** (-2.0 / 3.0)
        return min(self.decay, warmed)

    def on_training_run_epoch_end(
        self, trainer: TrainerLike, evaluated: bool = True, **kwargs: Any
    ) -> None:
        """Evaluate the EMA weights (in the epochs the eval sets are); save them if improved."""
        if self.evaluate_during_training and evaluated and trainer.eval_dataloader is not None:
            self.evaluate(trainer)
        if self._watch is None:
            return
        value = self._watch.read_main(trainer, evaluated)
        if self._watch.is_better(value, self.best_metric):  # NaN (no value) never is
            self.best_metric = value
            self._save(trainer)

    def on_training_run_end(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Save the EMA weights to ``save_path``, unless the best are kept (``watch_metric``)."""
        if self._watch is None:
            self._save(trainer)

    def _save(self, trainer: TrainerLike) -> None:
        """Save the EMA weights to ``save_path`` (every process takes part)."""
        if self.save_path is None or self._ema is None:
            return
        with self.swapped_into(trainer):
            trainer.save_checkpoint(
                self.save_path,
                {"ema_decay": self.decay, "num_ema_updates": self.num_ema_updates},
                save_optimizer=False,
                save_scheduler=False,
            )

    def evaluate(self, trainer: TrainerLike) -> None:
        """Evaluate the EMA weights inside ``train()``, with metrics prefixed ``ema_model_``.

        Call it on every process. The model's weights and the run history's prefix are
        restored afterwards, also when the evaluation raises.
        """
        prefixed = trainer.run_history.prefixed(EMA_METRIC_PREFIX, replace=True)
        with self.swapped_into(trainer), prefixed:
            trainer.run_eval_epoch(metric_name="eval_loss_epoch", is_intermediate=False)

    @contextlib.contextmanager
    def swapped_into(self, trainer: TrainerLike) -> Iterator[None]:
        """Put the EMA weights into ``trainer.get_model()`` for the duration of the block.

        The tensors are exchanged in place (the parameters stay the same objects, so the
        optimizer and distributed wrappers are unaffected) and back on exit, also after an
        exception, bit for bit. Inside the block the EMA's tensors hold the model's weights.

        Raises:
            ValueError: If there is no EMA yet (no training run started, nothing loaded).
        """
        pairs = self._bind(trainer).pairs  # afresh: the model may have moved since the run
        _swap(pairs)
        _drop_gathered(trainer)
        try:
            yield
        finally:
            _swap(pairs)
            _drop_gathered(trainer)

    def _hold(self, weights: Mapping[str, torch.Tensor], sharded_by: int | None) -> None:
        """Hold copies of ``weights`` as the EMA, bound to the model at its next use."""
        self._ema = {name: tensor.detach().clone() for name, tensor in weights.items()}
        self._sharded_by = sharded_by
        self._binding = None

    def _bind(self, trainer: TrainerLike) -> EmaPairs:
        """Pair each EMA tensor with the model's tensor of the same name, on its device."""
        if self._ema is None:
            fail(
                ValueError,
                "ModelEmaCallback",
                "state",
                None,
                "an EMA of the model's weights",
                "Start a training run (or call load_state_dict) before using the EMA weights.",
            )
        _check_same_sharding(self._sharded_by, _check_not_sharded(trainer))
        model_state = _model_state(trainer)
        _check_same_layout(self._ema, model_state)
        self._ema = {
            name: self._ema[name].to(tensor.device, tensor.dtype)
            for name, tensor in model_state.items()
        }
        self._binding = EmaPairs.of((self._ema[name], t) for name, t in model_state.items())
        return self._binding


def _model_state(trainer: TrainerLike) -> dict[str, torch.Tensor]:
    """The unwrapped model's state dict, sharing its storage; an FSDP2 ``DTensor`` as its shard.

    A sharded parameter is given as this process's local tensor (``DTensor.to_local``, a view
    of the parameter's storage), so the average is kept and updated per shard.
    """
    state = trainer.get_model(keep_torch_compile=False).state_dict()
    return {name: _local_shard(tensor) for name, tensor in state.items()}


def _local_shard(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _drop_gathered(trainer: TrainerLike) -> None:
    """Free the full parameters FSDP2 keeps gathered, so the next forward gathers the shards.

    FSDP2 keeps the root module's parameters gathered after a forward; swapping the shards
    would otherwise leave the next forward with the weights of before the swap.
    """
    for module in trainer.get_model(keep_torch_compile=False).modules():
        reshard = getattr(module, "reshard", None)
        if callable(reshard) and callable(getattr(module, "unshard", None)):
            reshard()


def _swap(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Exchange the contents of each pair in place; undo the ones done if one fails."""
    done = 0
    try:
        with torch.no_grad():
            for first, second in pairs:
                scratch = first.clone()
                first.copy_(second)
                second.copy_(scratch)
                done += 1
    except BaseException:
        _swap(pairs[:done])
        raise


def _check_ported_arguments(model_ema: Any, callbacks: Iterable[Any]) -> None:
    """Reject pytorch-accelerated's ``model_ema`` and ``callbacks`` where they would differ."""
    if model_ema is not None and model_ema is not ModelEma:
        fail(
            TypeError,
            "ModelEmaCallback",
            "model_ema",
            model_ema,
            "None (or pytorch_accel.utils.ModelEma)",
            "The callback keeps its own average of the whole state dict, updated after every "
            "optimizer update; subclass ModelEmaCallback to change how it averages.",
        )
    if tuple(callbacks):
        fail(
            TypeError,
            "ModelEmaCallback",
            "callbacks",
            callbacks,
            "empty",
            "The EMA evaluation runs the trainer's own callbacks, with their metrics prefixed "
            "'ema_model_'; add the callbacks to the trainer instead.",
        )


def _check_decay(decay: object) -> None:
    if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
        fail(TypeError, "ModelEmaCallback", "decay", decay, "a float", "Pass e.g. decay=0.999.")
    if not 0.0 < float(decay) < 1.0:
        fail(
            ValueError,
            "ModelEmaCallback",
            "decay",
            decay,
            "between 0 and 1 (exclusive)",
            "Pass e.g. decay=0.999 (the weight of the old average).",
        )


def _check_not_sharded(trainer: TrainerLike) -> int | None:
    """Refuse DeepSpeed and FSDP1; return the number of FSDP2 processes (``None``: unsharded)."""
    kind = trainer.accelerator.distributed_type
    version = getattr(getattr(trainer.accelerator.state, "fsdp_plugin", None), "fsdp_version", 2)
    if kind == DistributedType.DEEPSPEED or (kind == DistributedType.FSDP and version == 1):
        fail(
            ValueError,
            "ModelEmaCallback",
            "distributed_type",
            f"{kind} (FSDP version {version})" if kind == DistributedType.FSDP else str(kind),
            "a setup where each process holds the whole model, or FSDP version 2",
            "Use FSDP version 2 (FullyShardedDataParallelPlugin(fsdp_version=2)), DDP or a "
            "single process, or keep the EMA outside the trainer.",
        )
    return int(trainer.accelerator.num_processes) if kind == DistributedType.FSDP else None


def _check_same_sharding(held: int | None, now: int | None) -> None:
    """Refuse an EMA of FSDP2 shards in a run that shards otherwise (another process count)."""
    if held != now:
        raise ValueError(
            f"ModelEmaCallback: the EMA holds {_sharding_in_words(held)}, but this run needs "
            f"{_sharding_in_words(now)}: each process keeps only its own shards of the EMA, "
            "which do not fit another sharding. Resume with the same number of FSDP "
            "processes, or pass reset_on_train=True to restart the EMA from the model's weights."
        )


def _sharding_in_words(processes: int | None) -> str:
    if processes is None:
        return "the whole tensors (unsharded)"
    return f"the shards of {processes} FSDP processes"


def _check_same_layout(ema: Mapping[str, torch.Tensor], model: Mapping[str, torch.Tensor]) -> None:
    mismatched = sorted(set(ema) ^ set(model)) or [
        f"{name}: EMA {list(ema[name].shape)}, model {list(tensor.shape)}"
        for name, tensor in model.items()
        if ema[name].shape != tensor.shape
    ]
    if mismatched:
        raise ValueError(
            f"ModelEmaCallback: the EMA does not fit the model (differing entries: "
            f"{mismatched[:5]}). The model changed since the EMA was made or loaded: pass "
            "reset_on_train=True to restart it from the model's weights."
        )
