"""The largest batch that fits: ``Trainer.find_batch_size`` (Lightning's ``BatchSizeFinder``).

Each trial trains a few steps at one per-device batch size, inside ``_dry_run.trial_run``
(callbacks' files redirected, the run history fresh), and then puts the model, optimizer,
scheduler, run history and random states back as they were, bitwise. The steps run with a
*probing* ``MicroBatchSplitter``: an out-of-memory error on any process ends the trial on every
process at the same step (one agreement per step with several processes), so a trial that
fails on one process only does not leave the others waiting in DDP.

``mode="power"`` doubles the batch size from ``init_batch_size`` until a trial fails (or the
dataset or ``max_batch_size`` is reached); ``"binsearch"`` then halves the interval between the
last size that fitted and the first that did not. When even ``init_batch_size`` fails, the size
is halved until one fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelerate.utils.memory import clear_device_cache

from pytorch_accel._checks import check_choice, check_positive_int, fail
from pytorch_accel.micro_batches import is_out_of_memory
from pytorch_accel.tools._dry_run import trial_run
from pytorch_accel.tracking import get_logger

if TYPE_CHECKING:
    from pytorch_accel.tools._dry_run import ToolTrainer

__all__ = ["SEARCH_MODES", "find_batch_size"]

SEARCH_MODES = ("power", "binsearch")
"""How ``find_batch_size`` searches: doubling only, or doubling then bisecting."""

_NOT_SEARCHED = (
    "per_device_batch_size",
    "num_epochs",
    "max_num_train_steps",
    "eval_dataset",
    "resume_from",
    "dry_run",
    "overfit_batches",
    "skip_failing_batches",
    "on_oom",
)
"""``train()`` arguments the search sets itself, or that make no sense in a trial."""


def find_batch_size(
    trainer: ToolTrainer,
    train_dataset: Any,
    *,
    mode: str = "power",
    init_batch_size: int = 2,
    max_batch_size: int | None = None,
    steps_per_trial: int = 3,
    max_trials: int = 25,
    **train_kwargs: Any,
) -> int:
    """Return the largest per-device batch size that trains ``steps_per_trial`` steps.

    Each trial calls ``trainer.train(train_dataset, per_device_batch_size=size, ...)`` for a
    few steps and puts everything back (see the module); ``train_kwargs`` are passed on
    (``collate_fn``, ``train_dataloader_kwargs``, ``gradient_accumulation_steps``, ...).

    Args:
        trainer: The trainer, with its model and optimizer.
        train_dataset: The training data (as for ``train()``).
        mode: ``"power"``: the largest power of two times ``init_batch_size`` that fits;
            ``"binsearch"``: then bisect up to the first size that does not.
        init_batch_size: The first size tried.
        max_batch_size: The largest size tried (default: the dataset's samples per process).
        steps_per_trial: Training steps (micro-batches) per trial.
        max_trials: The most trials.
        train_kwargs: More ``train()`` arguments for the trials.

    Returns:
        The largest batch size per process that fitted.

    Raises:
        TypeError, ValueError: For a bad argument, or a ``train()`` argument the search sets.
        RuntimeError: When not even a batch of one sample fits.
    """
    where = "Trainer.find_batch_size"
    check_choice(where, "mode", mode, SEARCH_MODES, "Pass mode='power'.")
    check_positive_int(where, "init_batch_size", init_batch_size)
    check_positive_int(where, "max_batch_size", max_batch_size, allow_none=True)
    check_positive_int(where, "steps_per_trial", steps_per_trial)
    check_positive_int(where, "max_trials", max_trials)
    for name in _NOT_SEARCHED:
        if name in train_kwargs:
            fail(
                ValueError,
                where,
                name,
                train_kwargs[name],
                "left out",
                "The search sets the batch size and the length of its trials itself.",
            )
    try:  # the largest size worth trying: the samples per process, or max_batch_size
        samples: int | None = len(train_dataset) // trainer.accelerator.num_processes
        length: dict[str, Any] = {"num_epochs": 1}
    except TypeError:  # a stream: no length, trials counted in updates
        samples, length = None, {"max_num_train_steps": steps_per_trial}
    sizes = [size for size in (samples, max_batch_size) if size is not None]
    limit = max(1, min(sizes)) if sizes else 2**31
    trials = 0

    def fits(size: int) -> bool:
        nonlocal trials
        trials += 1
        fitted = _trial(trainer, train_dataset, size, steps_per_trial, {**length, **train_kwargs})
        get_logger().info(f"Batch size {size}: {'fits' if fitted else 'out of memory'}.")
        return fitted

    size = min(init_batch_size, limit)
    if not fits(size):
        while size > 1:  # halve until a size fits
            size //= 2
            if fits(size):
                return size
        raise RuntimeError(
            "Trainer.find_batch_size: not even a batch of one sample fits in memory."
        )
    fitted, failed = size, None
    while trials < max_trials and fitted < limit:
        size = min(fitted * 2, limit)
        if not fits(size):
            failed = size
            break
        fitted = size
    if mode == "binsearch" and failed is not None:
        while trials < max_trials and failed - fitted > 1:
            size = (fitted + failed) // 2
            if fits(size):
                fitted = size
            else:
                failed = size
    get_logger().info(f"find_batch_size: the largest batch size that fits is {fitted}.")
    return fitted


def _trial(
    trainer: ToolTrainer, train_dataset: Any, size: int, steps: int, train_kwargs: dict[str, Any]
) -> bool:
    """Whether ``steps`` training steps at batch size ``size`` fit; everything put back."""
    state = trainer._state
    eval_batch_size = state.eval_batch_size
    # a trial's out-of-memory error is the search's to handle: no on_exception for it
    with trial_run(trainer, steps), trainer.callback_handler.exceptions_handled_by_caller():
        state.probing = True
        try:
            trainer.train(train_dataset, per_device_batch_size=size, **train_kwargs)
        except Exception as error:  # BatchDoesNotFitError, or out of memory outside the steps
            if not is_out_of_memory(error):
                raise
            fitted = False
        else:
            fitted = True
        finally:
            state.probing = False
            state.eval_batch_size = eval_batch_size  # evaluate()'s default: not a trial's
    if not fitted:
        clear_device_cache(garbage_collection=True)
    return fitted
