"""Tools beside the facade: functions over a trainer, reached without ``trainer.py`` importing them.

- ``lr_finder``: the learning-rate range test (``Trainer.find_lr``).
- ``batch_size_search``: the largest per-device batch size that trains
  (``Trainer.find_batch_size``).
- ``_dry_run``: dry runs and overfit runs (``train(dry_run=...)``,
  ``train(overfit_batches=...)``), and the trial runs the batch-size search uses.

Each works on a ``ToolTrainer`` (``_dry_run``): a trainer's public surface and the parts of
its run state the tools set aside and restore.
"""
