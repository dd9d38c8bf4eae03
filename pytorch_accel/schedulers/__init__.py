"""Parameter schedulers stepped once per optimizer update, with exact end points.

`CosineLrScheduler` and `WSDLrScheduler` are stateful: the `Trainer` calls `step()` after every
optimizer update, and the last update of the run uses exactly the final scheduled value. Build
them with `create_scheduler_fn(...)`, whose epoch and update counts are placeholders the trainer
fills in. `LRWarmupScheduler` adds a warmup to any scheduler. See the "Schedulers" page of
the documentation for the exact value of each update. `SchedulerStepping` steps a scheduler
per epoch, or with a monitored metric after each evaluation (`ReduceLROnPlateau`).
"""

from pytorch_accel.schedulers.cosine_scheduler import CosineLrScheduler
from pytorch_accel.schedulers.scheduler_base import SchedulerBase, StatefulSchedulerBase
from pytorch_accel.schedulers.stepping import SchedulerInterval, SchedulerStepping
from pytorch_accel.schedulers.warmup import LRWarmupScheduler
from pytorch_accel.schedulers.wsd_scheduler import WSDLrScheduler, estimate_checkpoint_steps

__all__ = [
    "CosineLrScheduler",
    "LRWarmupScheduler",
    "SchedulerBase",
    "SchedulerInterval",
    "SchedulerStepping",
    "StatefulSchedulerBase",
    "WSDLrScheduler",
    "estimate_checkpoint_steps",
]
