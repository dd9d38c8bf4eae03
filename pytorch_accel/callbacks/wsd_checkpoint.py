"""Save the model before and after every decay of a `WSDLrScheduler`."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytorch_accel.callback import TrainerCallback
from pytorch_accel.checks import fail
from pytorch_accel.outputs import DefaultPath, RunPaths, redirected_paths
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.protocols import TrainerLike

__all__ = ["WSDCheckpointCallback"]

PRE_DECAY = "wsd_pre_decay"
POST_DECAY = "wsd_post_decay"


class WSDCheckpointCallback(TrainerCallback):
    """Save a checkpoint before and after every decay phase of a `WSDLrScheduler`.

    After the last stable update of each period (counted by the scheduler) it writes
    `<save_dir>/checkpoint_<update>_wsd_pre_decay.pt` (with the optimizer and scheduler, to
    continue from), and after the period's last decay update
    `<save_dir>/checkpoint_<update>_wsd_post_decay.pt`, with `Trainer.save_checkpoint` (by the
    main process, atomically; loadable with `Trainer.load_checkpoint` or
    `load_pretrained_weights`). Each file also holds `step`, `checkpoint_type`, `total_steps`
    and `decay_phase_ratio`.

    Args:
        save_dir: The directory of the checkpoint files (created when the first is written;
            in ``trainer.run_dir`` when left out and the trainer has an ``output_dir``).
        save_optimizer: Include the optimizer state in post-decay checkpoints.
        save_scheduler: Include the scheduler state in post-decay checkpoints.
        initial_checkpoint: A checkpoint file to load (model, optimizer, scheduler) when
            training starts, e.g. a pre-decay checkpoint to continue from.

    Attributes:
        saved_checkpoints: The checkpoint files saved so far, in order (on every process).
        last_checkpoint_step: The update of the last checkpoint saved (or loaded as
            ``initial_checkpoint``), or ``None``; pytorch-accelerated's attribute.

    Example:
        ```python
        wsd = WSDCheckpointCallback(save_dir="checkpoints")
        trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, wsd))
        trainer.train(train_dataset, num_epochs=100,
                      create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(num_checkpoints=3))
        ```
    """

    may_stop_training = False

    def __init__(
        self,
        save_dir: str | os.PathLike[str] = DefaultPath("checkpoints"),
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        initial_checkpoint: str | os.PathLike[str] | None = None,
    ) -> None:
        _check_path("save_dir", save_dir)
        if initial_checkpoint is not None:
            _check_path("initial_checkpoint", initial_checkpoint)
        self.save_dir = Path(save_dir)
        self._run_paths = RunPaths(save_dir=save_dir)
        self.save_optimizer = save_optimizer
        self.save_scheduler = save_scheduler
        self.initial_checkpoint = None if initial_checkpoint is None else Path(initial_checkpoint)
        self.saved_checkpoints: list[Path] = []
        self.last_checkpoint_step: int | None = None
        self._pending: dict[int, list[str]] = {}

    def redirect_outputs(self, directory: Path) -> AbstractContextManager[None]:
        """Write the checkpoints under ``directory`` meanwhile (for ``train(dry_run=...)``)."""
        return redirected_paths(self, directory, "save_dir")

    def place_outputs(self, run_dir: Path) -> None:
        """Put the checkpoints under ``run_dir`` if ``save_dir`` was left at its default."""
        self._run_paths.place(self, run_dir)

    def checkpoint_path(self, step: int, checkpoint_type: str) -> Path:
        """Return the file of the `checkpoint_type` checkpoint saved after update `step`."""
        return self.save_dir / f"checkpoint_{step}_{checkpoint_type}.pt"

    def on_training_run_start(self, trainer: TrainerLike, **kwargs: Any) -> None:
        """Plan the checkpoints of this run, and load `initial_checkpoint` if given."""
        scheduler = _wsd_scheduler(trainer)
        self._pending = {}
        for info in scheduler.get_decay_info():
            if info["pre_decay_step"] > 0:
                self._pending.setdefault(info["pre_decay_step"], []).append(PRE_DECAY)
            self._pending.setdefault(info["period_end"], []).append(POST_DECAY)
        if self.initial_checkpoint is not None:
            loaded = trainer.load_checkpoint(self.initial_checkpoint)
            self.last_checkpoint_step = loaded.get("step")
            get_logger().info(f"Loaded WSD checkpoint {str(self.initial_checkpoint)!r}")

    def on_train_step_end(
        self, trainer: TrainerLike, batch: Any, batch_output: dict[str, Any], **kwargs: Any
    ) -> None:
        """Save the checkpoints due after the update the scheduler has just counted."""
        step = trainer.scheduler.get_current_step()
        for checkpoint_type in self._pending.pop(step, ()):
            self._save(trainer, step, checkpoint_type)

    def _save(self, trainer: TrainerLike, step: int, checkpoint_type: str) -> None:
        scheduler = trainer.scheduler
        pre_decay = checkpoint_type == PRE_DECAY
        path = self.checkpoint_path(step, checkpoint_type)
        trainer.save_checkpoint(
            path,
            checkpoint_kwargs={
                "step": step,
                "checkpoint_type": checkpoint_type,
                "total_steps": scheduler.total_steps,
                "decay_phase_ratio": scheduler.decay_phase_ratio,
            },
            save_optimizer=pre_decay or self.save_optimizer,
            save_scheduler=pre_decay or self.save_scheduler,
        )
        self.saved_checkpoints.append(path)
        self.last_checkpoint_step = step
        get_logger().info(f"Saved {checkpoint_type} checkpoint after update {step}: {path}")


def _check_path(name: str, path: object) -> None:
    if not isinstance(path, (str, os.PathLike)):
        fail(
            TypeError,
            "WSDCheckpointCallback",
            name,
            path,
            "a str or os.PathLike path",
            f"Pass e.g. {name}='checkpoints'.",
        )


def _wsd_scheduler(trainer: TrainerLike) -> Any:
    scheduler = trainer.scheduler
    if not all(hasattr(scheduler, name) for name in ("get_decay_info", "get_current_step")):
        fail(
            ValueError,
            "WSDCheckpointCallback",
            "trainer.scheduler",
            scheduler,
            "a WSDLrScheduler",
            "Pass create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(...) to train().",
        )
    return scheduler
