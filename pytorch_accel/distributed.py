"""Multi-process support: CPU fallback, world-size checks, and agreeing across processes.

Processes agree with one primitive, ``AgreedFlag``: one small all-reduce over gloo, either
blocking (``settle``: at an epoch's or a run's end, where the trainer agrees on a stop) or
started at one step and read at a later one (``start``/``finish``: a check that runs at every
step, such as a preemption signal or a time budget, blocks no step). A callback stops training
by raising ``StopTrainingError``; the trainer agrees on it at fixed points (see
``pytorch_accel._loop``), a callback that agrees itself uses an ``AgreedFlag``. Metric values
are combined with ``reduce_across_processes``: one collective per logging point, on the device.

A failure on one process is named on the others by ``_peer_failures``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedType,
    FullyShardedDataParallelPlugin,
    broadcast_object_list,
)

__all__ = [
    "AgreedFlag",
    "agreement_group",
    "apply_fsdp_request",
    "broadcast_buffers",
    "check_world_size",
    "create_accelerator",
    "effective_mixed_precision",
    "fsdp_requested",
    "gather_objects",
    "gather_rows",
    "group_size",
    "launcher_world_size",
    "main_process_object",
    "needs_cpu_distributed",
    "process_rank",
    "read_reduced",
    "reduce_across_processes",
    "reduction_dtype",
    "synchronise_replicas",
]

_WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launcher_world_size() -> int:
    """Return the number of processes the launcher (torchrun, accelerate launch, MPI) started."""
    for variable in _WORLD_SIZE_VARIABLES:
        value = os.environ.get(variable)
        if value and value.isdigit():
            return int(value)
    return 1


def create_accelerator(accelerator_kwargs: Mapping[str, Any]) -> Accelerator:
    """Create a trainer's accelerator, with ``Trainer(accelerator_kwargs=...)`` over the defaults.

    The default ``Accelerator()`` reads the configuration of ``accelerate config`` and
    ``accelerate launch`` (processes, mixed precision, FSDP/DeepSpeed plugins). When a
    launcher started several processes on a machine without GPUs, it is
    ``Accelerator(cpu=True)``: one gloo process group instead of independent copies.
    Batches are copied to GPUs without blocking (from the pinned memory the default
    dataloaders use there), so loading never synchronises the host with the device.
    """
    defaults = {
        "cpu": needs_cpu_distributed(),
        "dataloader_config": DataLoaderConfiguration(non_blocking=True),
    }
    try:
        accelerator = Accelerator(**{**defaults, **accelerator_kwargs})
    except ValueError as error:
        state = AcceleratorState()  # the process's: accelerate keeps one, shared
        if "already been initialized" not in str(error) or not state.initialized:
            raise
        requested = accelerator_kwargs.get("mixed_precision") or os.environ.get(
            "ACCELERATE_MIXED_PRECISION", "no"
        )
        raise ValueError(
            f"Trainer: accelerator_kwargs asks for mixed_precision={str(requested)!r}, but a "
            f"trainer created earlier in this process set up accelerate with "
            f"mixed_precision={str(state.mixed_precision)!r} (and device "
            f"{str(state.device)!r}): accelerate keeps one setting per process, which cannot "
            "change once set. Give every Trainer of a process the same mixed_precision (and "
            "cpu), or run each setting in a process of its own (a script per precision)."
        ) from None
    _warn_if_precision_ignored(accelerator)
    return accelerator


def effective_mixed_precision(accelerator: Accelerator) -> str:
    """The precision training really runs in: ``"no"`` for fp16 on the CPU (see below)."""
    if _fp16_ignored(accelerator):
        return "no"
    return str(accelerator.mixed_precision)


def _fp16_ignored(accelerator: Accelerator) -> bool:
    """Whether accelerate ignores ``mixed_precision="fp16"``: on the CPU, no autocast, no scaler."""
    return (
        accelerator.mixed_precision == "fp16"
        and accelerator.device.type == "cpu"
        and accelerator.scaler is None
        and not accelerator.native_amp
    )


def _warn_if_precision_ignored(accelerator: Accelerator) -> None:
    """Warn once per trainer where the requested precision is not the one training runs in."""
    if _fp16_ignored(accelerator):
        warnings.warn(
            "Trainer: mixed_precision='fp16' has no effect on the CPU: accelerate uses "
            "neither autocast nor a gradient scaler there, so training runs in float32 (the "
            "run config records mixed_precision='no'). Pass mixed_precision='bf16' for mixed "
            "precision on the CPU, or 'no' to silence this.",
            UserWarning,
            stacklevel=3,
        )


def needs_cpu_distributed() -> bool:
    """Return whether several processes were launched on a machine without GPUs.

    accelerate would then train independent copies; ``Accelerator(cpu=True)`` makes them one
    gloo process group (see ``create_accelerator``).
    """
    if launcher_world_size() <= 1:
        return False
    xpu = getattr(torch, "xpu", None)
    return not (torch.cuda.is_available() or (xpu is not None and xpu.is_available()))


def fsdp_requested(fsdp_plugin: object = None) -> bool:
    """Return whether FSDP was asked for: a plugin, or ``ACCELERATE_USE_FSDP`` (``--use_fsdp``)."""
    return fsdp_plugin is not None or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def apply_fsdp_request(accelerator: Accelerator, fsdp_plugin: object = None) -> None:
    """Make an FSDP request real in a gloo process group, where accelerate drops it.

    accelerate switches to FSDP only from GPU-like run types, so with ``Accelerator(cpu=True)``
    an FSDP plugin or ``accelerate launch --use_fsdp`` would silently give DDP. Called before
    anything is prepared, this sets the run type to FSDP with the plugin (the given one, else
    one from the ``FSDP_*`` environment variables), as accelerate does on GPUs; FSDP1 takes
    the device without an index (``cpu``), as its compute device has none there.

    Args:
        accelerator: The trainer's new accelerator.
        fsdp_plugin: The ``fsdp_plugin`` passed in ``Trainer(accelerator_kwargs=...)``.
    """
    if accelerator.distributed_type != DistributedType.MULTI_CPU or not fsdp_requested(fsdp_plugin):
        return
    plugin: Any = fsdp_plugin if fsdp_plugin is not None else FullyShardedDataParallelPlugin()
    state = accelerator.state
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    # both shared states: accelerate refreshes the accelerator's from the process's
    shared = PartialState._shared_state
    state.distributed_type = shared["distributed_type"] = DistributedType.FSDP
    state.fsdp_plugin = plugin
    if plugin.fsdp_version == 1:
        state.device = shared["device"] = torch.device("cpu")


def check_world_size(num_processes: int) -> None:
    """Raise if the launcher started more processes than the accelerator takes part with.

    Args:
        num_processes: ``accelerator.num_processes``.

    Raises:
        ValueError: If the numbers disagree, naming the variable or flag that fixes it.
    """
    launched = launcher_world_size()
    if launched > 1 and num_processes != launched:
        raise ValueError(
            f"Trainer: the launcher started {launched} processes (WORLD_SIZE={launched}) but the "
            f"Accelerator sees num_processes={num_processes}, so each process would train its own "
            "copy of the model. On a machine without GPUs set ACCELERATE_USE_CPU=1, or return "
            "Accelerator(cpu=True) from _create_accelerator; with GPUs, make one visible per "
            "process (CUDA_VISIBLE_DEVICES) or launch with `accelerate launch --multi_gpu`."
        )


def agreement_group() -> Any:
    """Return the process group for small agreements: gloo, so no GPU stream is synchronised.

    The default group (``None``) when it is gloo, else a new gloo group: call it on every
    process, at the same point.
    """
    return dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None


_NEW_GROUP: Any = object()


class AgreedFlag:
    """A flag that every process reads the same: the maximum of the processes' flags.

    The one primitive by which processes agree on what changes the course of a run: the
    trainer's stop, a skipped failing batch, a preemption signal, a time budget, a watched
    metric (``main_value``). ``settle`` agrees at once (one blocking all-reduce over gloo, so
    no GPU stream is synchronised), where every process waits anyway; ``start`` launches the
    exchange at one step and ``finish``, called on every process at the same later point,
    reads it (long completed by then in gloo's background thread), so a check at every step
    blocks no step. A ``pace`` rides along with each lagged exchange (its maximum is
    ``agreed_pace`` after ``finish``), so the processes can also agree on when to exchange next.

    Args:
        group: The gloo process group (``agreement_group()``); by default one is created
            (call it then on every process at the same point).
    """

    def __init__(self, group: Any = _NEW_GROUP) -> None:
        self._group = agreement_group() if group is _NEW_GROUP else group
        self._work: Any = None
        self._value = torch.zeros(2, dtype=torch.int64)
        self.agreed_pace = 0

    @property
    def pending(self) -> bool:
        """Whether an exchange was started and not yet finished."""
        return self._work is not None

    def start(self, flag: int, pace: int = 0) -> None:
        """Start agreeing on ``flag`` and ``pace`` (finishing a pending exchange first)."""
        self.finish()
        self._value = torch.tensor([flag, pace], dtype=torch.int64)
        self._work = dist.all_reduce(
            self._value, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )

    def finish(self) -> int:
        """Wait for the pending exchange; return its agreed flag (0 if none was pending).

        ``agreed_pace`` is then the exchange's agreed pace (0 if none was pending).
        """
        work, self._work = self._work, None
        if work is None:
            self.agreed_pace = 0
            return 0
        work.wait()
        flag, self.agreed_pace = (int(value) for value in self._value.tolist())
        return flag

    def settle(self, flag: int) -> int:
        """Finish the pending exchange, then agree on ``flag`` at once; return the maximum."""
        earlier = self.finish()
        value = torch.tensor([flag], dtype=torch.int64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._group)
        return max(earlier, int(value[0]))

    def main_value(self, value: float) -> float:
        """Finish the pending exchange, then return the main process's ``value`` on every one.

        For callbacks that decide on a metric recorded per process (save a checkpoint, a
        collective, or not): every process must decide as the main process does.
        """
        self.finish()
        shared = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(shared, src=0, group=self._group)
        return float(shared[0])


def main_process_object(value: Any) -> Any:
    """Return the main process's ``value`` (any picklable object) on every process.

    For what the main process chose (a directory name), where ``AgreedFlag`` agrees on flags
    and numbers. Every process must call it; in one process it returns ``value``.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    shared = [value]
    broadcast_object_list(shared, from_process=0)  # on the device each backend needs
    return shared[0]


def group_size() -> int:
    """The number of processes in the default process group (1 without one)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return int(dist.get_world_size())


def process_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return int(dist.get_rank()) if group_size() > 1 else 0


def gather_rows(row: torch.Tensor) -> list[list[float]]:
    """Every process's 1-D ``row`` (the same length on each), read on the host, in rank order.

    One ``all_gather`` on the row's device and one host read; in one process, ``[row]``.
    Every process must call it at the same point.
    """
    if group_size() == 1:
        return [row.tolist()]
    gathered = [torch.empty_like(row) for _ in range(group_size())]
    dist.all_gather(gathered, row)
    return torch.stack(gathered).tolist()


def gather_objects(value: Any) -> list[Any]:
    """Every process's ``value`` (picklable), in rank order; every process must call it."""
    if group_size() == 1:
        return [value]
    gathered: list[Any] = [None] * group_size()
    dist.all_gather_object(gathered, value)
    return gathered


REDUCTIONS = ("mean", "sum", "max", "min")
"""How ``reduce_across_processes`` combines a value across processes."""


def reduce_across_processes(
    values: torch.Tensor, reductions: Sequence[str] = ("sum",)
) -> torch.Tensor:
    """Combine a tensor across processes, each element by its own reduction, at once.

    One collective, on the device and queued like DDP's own (nothing is read on the host): an
    all-reduce in place when every element is summed, else an ``all_gather`` of the 1-D
    tensor. Every process must call it at the same point, with a tensor of the same length
    and the same ``reductions``; in one process it returns ``values``.

    Args:
        values: The values of this process, one per element.
        reductions: One of ``REDUCTIONS`` per element; by default every element is summed.

    Returns:
        The combined values, the same on every process.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    if all(reduction == "sum" for reduction in reductions):
        dist.all_reduce(values)
        return values
    gathered = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values)
    stacked = torch.stack(gathered)
    combined = stacked.sum(0)
    if "mean" in reductions:
        combined = torch.where(
            _mask(reductions, "mean", values), combined / len(gathered), combined
        )
    for name, reduce in (("max", torch.amax), ("min", torch.amin)):
        if name in reductions:
            combined = torch.where(_mask(reductions, name, values), reduce(stacked, 0), combined)
    return combined


def _mask(reductions: Sequence[str], name: str, like: torch.Tensor) -> torch.Tensor:
    """Where ``reductions`` is ``name``, as a bool tensor on ``like``'s device."""
    return torch.tensor([reduction == name for reduction in reductions]).to(like.device)


def reduction_dtype(device: torch.device) -> torch.dtype:
    """The dtype to sum metrics in on ``device``: float64, or float32 on MPS (which has none)."""
    return torch.float32 if device.type == "mps" else torch.float64


def read_reduced(
    parts: Sequence[Any], reductions: Sequence[str], device: torch.device
) -> list[float]:
    """Stack ``parts`` on ``device``, combine them across processes and read them: once each."""
    dtype = reduction_dtype(device)
    packed = torch.stack([torch.as_tensor(part).to(device, dtype) for part in parts])
    return reduce_across_processes(packed, reductions).tolist()


def synchronise_replicas(model: torch.nn.Module) -> None:
    """Do a DDP model's synchronisation explicitly: average the gradients, broadcast buffers.

    For a run whose micro-batches all ran under ``no_sync`` (``skip_failing_batches`` with
    several processes): one all-reduce of every gradient, flattened, divided by the number of
    processes, as DDP's backward would, then the buffers broadcast from the main process, as
    DDP's next forward would (with ``broadcast_buffers``). A parameter without a gradient gets
    the average (zeros where no process has one). Every process must call it, at the same point.

    Args:
        model: The ``DistributedDataParallel`` model.
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    if parameters:
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in parameters]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
        offset = 0
        for parameter, grad in zip(parameters, grads, strict=True):
            size = grad.numel()
            averaged = flat[offset : offset + size].view_as(grad)
            offset += size
            if parameter.grad is None:
                parameter.grad = averaged.clone()
            else:
                parameter.grad.copy_(averaged)
    broadcast_buffers(model)


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Broadcast a DDP model's buffers from the main process, as DDP's next forward would.

    Nothing when the model was wrapped with ``broadcast_buffers=False``. Every process must
    call it, at the same point.
    """
    buffers = list(model.buffers()) if getattr(model, "broadcast_buffers", True) else []
    if buffers:
        with torch.no_grad():
            flat = torch.cat([buffer.reshape(-1).to(torch.float64) for buffer in buffers])
            dist.broadcast(flat, src=0)
            offset = 0
            for buffer in buffers:
                size = buffer.numel()
                buffer.copy_(flat[offset : offset + size].view_as(buffer))
                offset += size
