"""Checkpoints and training states: one writer, one integrity scheme, one loader, one fit check.

- ``files``: the atomic writer (every file the package writes), the one integrity scheme
  (size and CRC-32 of a file's bytes, computed while it is written) that guards what it reads
  back, and the safe loader (read once, ``weights_only``).
- ``fit``: whether a saved model, optimizer or scheduler state fits the trainer's.
- ``checkpoint``: the portable checkpoint file of ``Trainer.save_checkpoint``.
- ``store``: training-state directories: manifest, publish, verify, find, tidy.
- ``staging``: a training state's files staged (in host memory for a save written in the
  background), written by each process, and published once every process wrote its part.
- ``training_state``: saving, loading and resuming a trainer's training states.
- ``resume``: where a resumed run picks up, and the train dataloader that can resume mid-epoch.
"""
