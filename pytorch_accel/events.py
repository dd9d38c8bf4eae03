"""The events a ``Trainer`` fires, and the order it fires them in.

Each event calls the method of the same name on every callback that defines it. Where the
trainer has a hook of the same name without the ``on_`` prefix (``train_epoch_start`` for
``on_train_epoch_start``), the hook runs first, then the callbacks.

A training run, ``train()``, fires:

    on_training_run_start
    for each epoch:
        on_train_epoch_start
        for each batch:
            on_train_step_start
            on_backward_start
            on_backward_end
            if this batch completes an accumulation window:
                on_optimizer_step_start
                on_optimizer_step_end
            on_train_step_end
            on_train_progress        (now and then, see below)
        on_train_progress            (if steps were done since the last one)
        on_train_epoch_end
        if there is an eval set:
            on_eval_epoch_start
            for each batch:
                on_eval_step_start
                on_eval_step_end
                on_eval_progress     (now and then)
            on_eval_progress         (if steps were done since the last one)
            on_eval_epoch_end
        on_training_run_epoch_end
    on_training_run_end

An evaluation run, ``evaluate()``, fires:

    on_evaluation_run_start
    on_eval_epoch_start
    for each batch:
        on_eval_step_start
        on_eval_step_end
        on_eval_progress             (now and then)
    on_eval_progress                 (if steps were done since the last one)
    on_eval_epoch_end
    on_evaluation_run_end

A prediction run, ``predict()``, fires:

    on_predict_run_start
    for each batch:
        on_predict_step_start
        on_predict_step_end          (with the batch's gathered ``predictions``)
    on_predict_run_end

Saving and loading fire, on every process, inside the method that saves or loads:

    Trainer.save_training_state:  on_save_training_state
    Trainer.load_training_state:  on_load_training_state
    train(resume_from=...):       on_load_training_state  (before on_training_run_start)
    Trainer.save_checkpoint:      on_save_checkpoint
    Trainer.load_checkpoint:      on_load_checkpoint

(``save_checkpoint`` and the others are the trainer's methods that fire these events, not
hooks run before them.) ``SaveTrainingStateCallback`` saves through ``save_training_state``;
``SaveBestModelCallback``, ``ModelEmaCallback`` and ``WSDCheckpointCallback`` save through
``save_checkpoint``, so these events fire inside theirs.

- ``on_save_training_state`` receives ``directory``, the hidden directory the state is being
  written in, and ``output_dir``, where it is published once complete. It fires once this
  process's files of the trainer are in ``directory`` (in a background save,
  ``blocking=False``, as soon as they are staged in host memory: the trainer's files may still
  be being written) and before the manifest is written: a file a callback writes into
  ``directory`` then is covered by the manifest's digests, verified before the state is loaded
  again, and a file changed afterwards makes the state refused. Write a file under a name of
  your own (per process, e.g. with ``trainer.accelerator.process_index`` in it, when every
  process writes one); a ``.pt``, ``.pkl`` or ``.bin`` file must load with
  ``torch.load(..., weights_only=True)``. An exception raised here abandons the save on every
  process.
- ``on_load_training_state`` receives ``directory``, the state just loaded (verified, and its
  files, a callback's included, checked against the manifest), after the model, optimizer,
  random states, run history and update counts were loaded. Random numbers drawn in either
  training-state event change none of the run's random states (a resume stays exact).
- ``on_save_checkpoint`` receives ``checkpoint``, the dict about to be written (with
  ``model_state_dict`` and the other entries; an entry a callback adds to it is saved, and
  must be a tensor, number, string or container of them), and ``path``. The main process's
  dict is written.
- ``on_load_checkpoint`` receives ``checkpoint``, the whole dict just loaded (what
  ``load_checkpoint`` returns, a callback's entries included), and ``path``, after the model,
  optimizer and scheduler states were loaded.

What happens at each point:

- ``on_optimizer_step_start`` fires after gradients were unscaled (mixed precision) and clipped,
  just before the optimizer update; ``on_optimizer_step_end`` right after it, before the
  scheduler step and ``zero_grad``: the place for an EMA update.
- ``on_train_step_end`` fires after the backward pass and after the update of that step, with
  ``batch``, ``batch_output`` (the dict from ``calculate_train_batch_loss``, loss un-scaled) and
  ``step`` (0-based index in the epoch).
- ``on_eval_step_end`` fires with ``batch`` and ``batch_output`` (``{"skipped": True, ...}``
  for a batch that ``skip_failing_batches`` skipped); ``on_eval_epoch_start`` and
  ``on_eval_epoch_end`` receive ``is_intermediate`` (``True`` for an evaluation started in the
  middle of a training epoch), ``eval_set`` (the name of the set, ``None`` for the one
  unnamed set; ``trainer.eval_set`` holds it for the step events) and ``sanity_check``
  (``True`` for the few batches ``train(sanity_eval_batches=...)`` checks before training,
  whose recorded metrics are then removed: skip side effects such as logging then).
- ``on_training_run_epoch_end`` receives ``evaluated``: ``False`` when the run's eval sets
  were not evaluated after this epoch (``train(eval_every_n_epochs=...)``), ``True``
  otherwise (also in a run without eval sets).
- ``on_predict_step_end`` fires with ``batch`` and ``predictions``: the batch's outputs
  gathered from every process (without the samples accelerate repeats) and moved to
  ``predict()``'s ``output_device``, the same on every process; a callback can write them
  out as they come. For a batch that ``skip_failing_batches`` skipped: ``predictions=None``
  and ``skipped=True``.
- ``on_train_progress`` and ``on_eval_progress`` report ``steps_done``, the steps of the epoch
  done so far (a resumed epoch counts the batches it skipped), for progress displays. They
  fire after the epoch's first step, then at strides of steps that double while the events
  come less than ``Trainer.progress_interval`` (0.05 s) apart and halve once they come slower,
  and once more just before the epoch's end event, with the final count. As the strides
  follow the clock, processes fire them at different steps: a progress listener must not
  raise ``StopTrainingError`` (it becomes a ``RuntimeError``), call collectives or save
  training state.
- A callback added during a run gets each event from its next firing on, and the step events
  from the next step on, so that its ``on_*_step_start`` and ``on_*_step_end`` pair.
- The epoch's mean loss is recorded in the run history (``train_loss_epoch``,
  ``eval_loss_epoch`` or ``evaluation_loss``) just before the epoch's end hook and event.

Stopping early: raising ``StopTrainingError`` in any hook or callback ends the run once the
event it was raised in has reached every callback, so the order of callbacks never decides who
sees the last event. The levels that were open are then closed, innermost first, so every
``..._epoch_start`` and ``..._run_start`` that fired gets its ``..._end``; then
``on_stop_training_error`` fires, then the run's end hook and event. A step does not complete
after a stop raised before its end, so ``on_train_step_end`` only fires for steps that produced
an output; an update not yet taken is dropped. ``on_training_run_epoch_end`` fires only for
completed epochs.

When an exception other than ``StopTrainingError`` escapes ``train()``, ``evaluate()`` or
``predict()`` (an error, or ``KeyboardInterrupt`` on Ctrl-C), no further event of the run
fires: ``on_exception`` fires once, with ``exception`` and ``where`` (``"train"``,
``"evaluate"`` or ``"predict"``), on the process where it was raised, and the exception
propagates. It is the place to close files and trackers; it must not call collectives (the
other processes may not have failed). ``SystemExit`` (raised after a preemption save) does
not fire it: that run ended through its stop events.

A stop raised in ``on_train_step_end`` of the second batch (no accumulation) ends the run
with:

    on_train_step_start
    on_backward_start
    on_backward_end
    on_optimizer_step_start
    on_optimizer_step_end
    on_train_step_end
    on_train_progress                (steps_done=2, if anyone listens)
    on_train_epoch_end
    on_stop_training_error
    on_training_run_end
"""

from __future__ import annotations

__all__ = ["BUILTIN_EVENTS", "PROGRESS_EVENTS"]

BUILTIN_EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_training_run_start",
    "on_train_epoch_start",
    "on_train_step_start",
    "on_backward_start",
    "on_backward_end",
    "on_optimizer_step_start",
    "on_optimizer_step_end",
    "on_train_step_end",
    "on_train_progress",
    "on_train_epoch_end",
    "on_eval_epoch_start",
    "on_eval_step_start",
    "on_eval_step_end",
    "on_eval_progress",
    "on_eval_epoch_end",
    "on_training_run_epoch_end",
    "on_training_run_end",
    "on_evaluation_run_start",
    "on_evaluation_run_end",
    "on_predict_run_start",
    "on_predict_step_start",
    "on_predict_step_end",
    "on_predict_run_end",
    "on_stop_training_error",
    "on_exception",
    "on_save_training_state",
    "on_load_training_state",
    "on_save_checkpoint",
    "on_load_checkpoint",
)
"""Every event the trainer fires: a training run's, roughly in order, then saves and loads."""

PROGRESS_EVENTS: tuple[str, ...] = ("on_train_progress", "on_eval_progress")
"""The events that report an epoch's progress now and then (with ``steps_done``)."""
