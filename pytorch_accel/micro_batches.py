"""On out-of-memory, more micro-batches of the same total: ``train(on_oom="split")``'s choices.

Composer's automatic micro-batching. With ``on_oom="split"`` every training step runs through
a ``MicroBatchSplitter`` (``pytorch_accel.plugins.micro_batches``, on the loop's step hook):
the batch is cut along its first dimension into ``splits`` micro-batches (1 at first), each
back-propagated with its loss scaled by its share of the batch (its rows, or its
``num_items`` in a token-exact run, see ``_batches.ItemWeighting``), so the gradients add up
to the whole batch's. When a step runs out of memory
(``is_out_of_memory``), its partial gradients and item counts are dropped (the window's
earlier gradients are kept), the cache is emptied, ``splits`` doubles and the step runs
again; the run keeps that number of micro-batches to its end and says so once, in the log.

With several processes every step ends with one agreement (``AgreedFlag.settle``): an
out-of-memory error on any process makes every process split and repeat the step together.
The loop then synchronises the DDP replicas at the window's end
(``distributed.synchronise_replicas``), so no process waits in DDP's all-reduce for one that
failed mid-backward. Off (the default), none of this runs: no agreement, no host sync per step.

The batch-size search runs its trials with a *probe*: the same splitter, which on an agreed
out-of-memory error raises ``BatchDoesNotFitError`` on every process instead of splitting.
"""

from __future__ import annotations

import torch
from accelerate.utils.memory import should_reduce_batch_size

__all__ = [
    "ON_OOM",
    "ON_OOM_FIX",
    "BatchDoesNotFitError",
    "is_out_of_memory",
]

ON_OOM = ("raise", "split")
"""What ``train(on_oom=...)`` accepts: raise the error (the default), or split the batch."""

ON_OOM_FIX = (
    "Pass on_oom='split' to run a step that runs out of memory again in twice as many "
    "micro-batches (the global batch and the results stay the same), or 'raise'."
)


class BatchDoesNotFitError(RuntimeError):
    """A probing step ran out of memory (on some process): the batch size does not fit.

    Its message says "out of memory.", so ``is_out_of_memory`` (accelerate's
    ``should_reduce_batch_size``) takes it for one.
    """


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an out-of-memory error (of any device, or of the CPU allocator)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, Exception) and should_reduce_batch_size(error)
    )
