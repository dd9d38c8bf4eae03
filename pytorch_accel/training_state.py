"""Training-state directories, for scripts that look for or inspect them.

A training state is the directory ``Trainer.save_training_state`` writes (see the
Checkpointing page); ``train(resume_from=...)`` and ``Trainer.load_training_state`` load it.
"""

from pytorch_accel._checkpointing.store import (
    MANIFEST_NAME,
    TrainingStateError,
    find_training_states,
    latest_training_state,
    read_manifest,
)

__all__ = [
    "MANIFEST_NAME",
    "TrainingStateError",
    "find_training_states",
    "latest_training_state",
    "read_manifest",
]
