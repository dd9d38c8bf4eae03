"""Training health: detect loss spikes, then skip the update or go back to the last good state."""

from __future__ import annotations

import copy
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import check_choice, check_number, check_positive_int, fail
from pytorch_accel.distributed import AgreedFlag, group_size, reduce_across_processes

if TYPE_CHECKING:
    from pytorch_accel.trainer import Trainer

__all__ = ["LossSpikeCallback"]

_WHERE = "LossSpikeCallback"


class LossSpikeCallback(TrainerCallback):
    """Detect loss spikes on the device; skip the update, or restore the last good state.

    A training step's loss is a *spike* when it is not finite, or when it is above ``factor``
    times the median (``statistic="mean"``: the mean) of the last ``window`` losses that were
    not spikes, once ``min_history`` such losses are known. The rule is evaluated on the
    device at ``on_backward_start`` (before the spike's gradients exist), with no host read.
    The losses are each process's own (one per training step, of the step's batch).

    ``action="skip"``: an update whose accumulation window holds a spike (on any process) is
    undone on the device: before the update the parameters and the optimizer state are copied
    (on the device), and after it they are put back where the flag is set (``torch.where``),
    so the weights and the optimizer state are those of a run that omitted that update; no
    host read, at the cost of one copy of the parameters and the optimizer state in device
    memory, written at each update. The update still counts: the scheduler steps and
    ``num_updates`` advances (a run keeps its planned length and schedule; knowing on the host
    which update was skipped would take a host read per step). Optimizer state created by
    the skipped update (the first update) is reset to zeros, as torch's optimizers create it;
    optimizer state held on the host while the flag is on the device (torch's ``Adam``/
    ``AdamW`` keep their step count on the CPU unless ``capturable=True`` or ``fused=True``)
    cannot be put back without a host read: it is left as stepped (for Adam: the bias
    correction counts the skipped update), with a warning. With several processes, the
    processes agree with one all-reduce of one number per update (on the device's stream: no
    host wait). The skipped updates are counted on the device and reported at each epoch end
    (``skipped_updates``, and a ``RuntimeWarning``).

    ``action="rollback"``: every ``check_every_n_updates`` updates and at each epoch end, the
    processes agree (``AgreedFlag``: one host read of one flag) on whether a spike was seen
    since the last check. If none was, a host-memory copy of the model's, the optimizer's and
    the scheduler's state is taken (the last good state; the first is taken at the run's
    start). If one was, that copy is loaded back: the updates since it are undone, and the
    batches they trained on (from the last good state up to the check, the spike's included)
    are skipped: the data goes on from the check. The model's, optimizer's and scheduler's
    states are restored; the update counters, the run history (the epoch's mean loss keeps
    the skipped batches' losses) and the random states go on. For a model whose steps draw
    no random numbers, the weights then equal those of a run whose data lacked those batches
    (with ``check_every_n_updates=1``, exactly the batches up to and including the spike,
    at one host read per update). Each rollback is recorded in ``rollbacks`` as
    ``(update of the restored state, update of the check)`` and warned about. Not under
    FSDP (each process holds shards): refused at the run's start.

    Nothing is saved in training states: a resumed run starts a new history of losses.

    Args:
        action: ``"skip"`` or ``"rollback"``.
        factor: A loss above ``factor`` times the history's statistic is a spike (> 1; for
            non-negative losses).
        window: How many recent losses the statistic is taken over.
        statistic: ``"median"`` (robust to the odd high loss) or ``"mean"``.
        min_history: No finite loss is a spike before this many losses are in the history.
        check_every_n_updates: ``action="rollback"``: agree on spikes and take the good state
            every this many updates.

    Raises:
        ValueError: If an argument is out of range (``factor`` not above 1, a count below 1).
        TypeError: If an argument has the wrong type.

    Example:
        ```python
        spikes = LossSpikeCallback("skip", factor=4.0, window=50, min_history=10)
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, spikes))
        ```
    """

    may_stop_training = False
    order = 10  # before ModelEmaCallback (40) and saves (1000): they see the weights put back

    def __init__(
        self,
        action: str = "skip",
        *,
        factor: float = 5.0,
        window: int = 100,
        statistic: str = "median",
        min_history: int = 10,
        check_every_n_updates: int = 50,
    ) -> None:
        check_choice(
            _WHERE, "action", action, ("skip", "rollback"), "Pass action='skip' or 'rollback'."
        )
        check_number(_WHERE, "factor", factor, strict=True, finite=True)
        if not factor > 1:
            fail(
                ValueError,
                _WHERE,
                "factor",
                factor,
                "a number > 1",
                "A loss above factor x the recent median is a spike: pass e.g. factor=5.0.",
            )
        check_positive_int(_WHERE, "window", window)
        check_choice(_WHERE, "statistic", statistic, ("median", "mean"), "Pass statistic='median'.")
        check_positive_int(_WHERE, "min_history", min_history)
        if min_history > window:
            fail(
                ValueError,
                _WHERE,
                "min_history",
                min_history,
                f"at most window ({window})",
                "The history holds window losses: pass a smaller min_history or a larger window.",
            )
        check_positive_int(_WHERE, "check_every_n_updates", check_every_n_updates)
        self.action = action
        self.factor = float(factor)
        self.window = window
        self.statistic = statistic
        self.min_history = min_history
        self.check_every_n_updates = check_every_n_updates
        self.skipped_updates = 0
        self.rollbacks: list[tuple[int, int]] = []
        self._history: torch.Tensor | None = None  # the recent good losses (NaN: none yet)
        self._known: torch.Tensor | None = None  # how many good losses were recorded
        self._slot = 0
        self._flag: torch.Tensor | None = None  # a spike in the open window (or since a check)
        self._skipped: torch.Tensor | None = None  # updates skipped in the epoch
        self._saved: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # name, tensor, copy
        self._before: dict[int, set[str]] = {}  # the optimizer state's keys before an update
        self._warned = False
        self._agreement: AgreedFlag | None = None
        self._good: dict[str, Any] | None = None  # rollback: the last good state, on the host
        self._good_update = 0
        self._checked_update = 0

    # ---------------------------------------------------------------------- detection

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Start a history of losses; for a rollback, check the model and take the first state."""
        self._history = self._known = self._flag = None
        self._slot = 0
        if group_size() > 1 and self.action == "rollback" and self._agreement is None:
            self._agreement = AgreedFlag()  # every process, at the same point
        if self.action == "rollback":
            if "FSDP" in str(trainer.accelerator.distributed_type):
                fail(
                    ValueError,
                    _WHERE,
                    "action",
                    self.action,
                    "'skip' under FSDP",
                    "Each process holds shards, which a host copy does not restore: pass "
                    "action='skip', or use SaveTrainingStateCallback and resume_from.",
                )
            self._take_good_state(trainer)
            self._checked_update = trainer.num_updates

    def on_backward_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Flag the step's loss if it is a spike; record it in the history if not (no read)."""
        loss = kwargs["batch_output"]["loss"].detach().float()
        if loss.dim():
            loss = loss.mean()
        if self._history is None or self._known is None:
            self._history = torch.full((self.window,), math.nan, device=loss.device)
            self._known = torch.zeros((), dtype=torch.long, device=loss.device)
        if self._flag is None:
            self._flag = torch.zeros((), dtype=torch.bool, device=loss.device)
        history = self._history
        typical = torch.nanmedian(history) if self.statistic == "median" else history.nanmean()
        warm = self._known >= self.min_history
        spike = ~torch.isfinite(loss) | (warm & (loss > self.factor * typical))
        slot = self._slot % self.window
        history[slot] = torch.where(spike, history[slot], loss)
        self._slot += 1
        self._known += (~spike).long()
        self._flag = self._flag | spike

    # --------------------------------------------------------------------------- skip

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """``skip``: agree on the window's flag, and copy the parameters and optimizer state."""
        if self.action != "skip":
            return
        if self._flag is None:  # no loss seen: no spike, and the same collective as the others
            self._flag = torch.zeros((), dtype=torch.bool, device=trainer.device)
        if group_size() > 1:  # one all-reduce of one number, on the device's stream
            self._flag = reduce_across_processes(self._flag.float().view(1))[0] > 0
        self._saved = [
            ("parameters", parameter, parameter.detach().clone())
            for parameter in trainer.get_model().parameters()
        ]
        for owner, state in trainer.optimizer.state.items():
            if owner.grad is not None:  # the optimizer skips parameters without gradients
                self._saved.extend(
                    (str(key), value, value.clone())
                    for key, value in state.items()
                    if isinstance(value, torch.Tensor)
                )
        self._before = {id(state): set(state) for state in trainer.optimizer.state.values()}

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """``skip``: put the copies back where the window had a spike (on the device)."""
        if self.action != "skip" or self._flag is None:
            return
        flag = self._flag
        skipped_here: list[str] = []
        with torch.no_grad():
            for name, tensor, saved in self._saved:
                self._put_back(name, tensor, saved, flag, skipped_here)
            for state in trainer.optimizer.state.values():
                before = self._before.get(id(state), set())
                for key, value in state.items():
                    if key in before:
                        continue  # saved above (or not a tensor)
                    if isinstance(value, torch.Tensor):  # created by this update: as new
                        zeros = torch.zeros_like(value)
                        self._put_back(str(key), value, zeros, flag, skipped_here)
            for state in trainer.optimizer.state.values():
                skipped_here.extend(
                    str(key)
                    for key, value in state.items()
                    if value is not None and not isinstance(value, torch.Tensor)
                )
        if skipped_here and not self._warned:
            self._warned = True
            warnings.warn(
                f"{_WHERE}: optimizer state {sorted(set(skipped_here))} is held apart from the "
                f"loss (on the host, or not a tensor) and is not put back when an update is "
                "skipped (for Adam: the bias correction counts the skipped update). Create "
                "the optimizer with capturable=True or fused=True for an exact skip.",
                RuntimeWarning,
                stacklevel=2,
            )
        skipped = flag.long()
        self._skipped = skipped if self._skipped is None else self._skipped + skipped
        self._saved, self._before = [], {}
        self._flag = torch.zeros_like(flag)

    @staticmethod
    def _put_back(
        name: str, tensor: torch.Tensor, saved: torch.Tensor, flag: torch.Tensor, left: list[str]
    ) -> None:
        """``tensor`` becomes ``saved`` where ``flag`` is set, on the device (no host read).

        A tensor on the host while the flag is on a device is left as it is (named in ``left``).
        """
        if tensor.device != flag.device:
            if flag.device.type != "cpu":  # moving the flag to the host would wait for it
                left.append(name)
                return
            flag = flag.to(tensor.device)  # host to device: no wait
        torch.where(flag, saved, tensor, out=tensor)

    # ----------------------------------------------------------------------- rollback

    def on_train_step_end(
        self, trainer: Trainer, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """``rollback``: at every ``check_every_n_updates`` updates, check."""
        if self.action != "rollback":
            return
        done = trainer.num_updates
        if done != self._checked_update and done % self.check_every_n_updates == 0:
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """``rollback``: check; ``skip``: report the epoch's skipped updates (one host read)."""
        if self.action == "rollback":
            if trainer.num_updates != self._checked_update:
                self._check(trainer)
            return
        if self._skipped is not None:
            count = int(self._skipped.item())
            self._skipped = None
            if count:
                self.skipped_updates += count
                epoch = trainer.run_history.current_epoch
                warnings.warn(
                    f"{_WHERE}: skipped {count} update(s) with a loss spike in epoch {epoch}.",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def _check(self, trainer: Trainer) -> None:
        """Agree on a spike since the last check: restore the good state, or take a new one."""
        self._checked_update = trainer.num_updates
        seen = 0 if self._flag is None else int(self._flag.item())
        if self._agreement is not None:
            seen = self._agreement.settle(seen)
        if self._flag is not None:
            self._flag = torch.zeros_like(self._flag)
        if not seen:
            self._take_good_state(trainer)
            return
        assert self._good is not None  # taken at the run's start
        model = trainer.get_model()
        model.load_state_dict(self._good["model"])
        _inner(trainer).load_state_dict(copy.deepcopy(self._good["optimizer"]))
        if trainer.scheduler is not None and self._good["scheduler"] is not None:
            trainer.scheduler.load_state_dict(copy.deepcopy(self._good["scheduler"]))
        trainer.optimizer.zero_grad()
        self.rollbacks.append((self._good_update, trainer.num_updates))
        warnings.warn(
            f"{_WHERE}: a loss spike since update {self._good_update}: restored the state of "
            f"update {self._good_update} at update {trainer.num_updates}, skipping the batches "
            "in between.",
            RuntimeWarning,
            stacklevel=2,
        )

    def _take_good_state(self, trainer: Trainer) -> None:
        """Copy the model's, optimizer's and scheduler's states to host memory."""
        scheduler = trainer.scheduler
        self._good = {
            "model": _on_host(trainer.get_model().state_dict()),
            "optimizer": _on_host(_inner(trainer).state_dict()),
            "scheduler": None if scheduler is None else copy.deepcopy(scheduler.state_dict()),
        }
        self._good_update = trainer.num_updates


def _inner(trainer: Trainer) -> torch.optim.Optimizer:
    """The torch optimizer (inside accelerate's wrapper): it puts loaded state on its devices."""
    optimizer: torch.optim.Optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return optimizer


def _on_host(value: Any) -> Any:
    """A copy of ``value`` with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _on_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(item) for item in value)
    return copy.deepcopy(value)
