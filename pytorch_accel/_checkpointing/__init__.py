"""Checkpoints and training states: one writer, one integrity scheme, one loader, one fit check.

``files`` (the atomic writer, the integrity scheme, the safe loader), ``fit`` (does a saved
state fit), ``checkpoint`` (``Trainer.save_checkpoint``'s file), ``store`` (training-state
directories), ``staging`` (a state's files staged, written, published), ``training_state``
(saving, loading, resuming) and ``resume`` (where a resumed run picks up).
"""
