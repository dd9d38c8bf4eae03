"""Saving, loading and resuming a trainer's training states.

``TrainingStateIO`` writes a training state (``store``) atomically, verifies it before anything
is loaded, and turns it into the ``ResumePoint`` a resumed ``train()`` continues from. The model
and optimizer go through ``torch.distributed.checkpoint`` (``sharded``), the rest through small
files of the trainer's own; everything is loaded from the verified bytes, pickles with
``weights_only=True``: nothing in a state can run code.
"""

from __future__ import annotations

import functools
import os
import random
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy
import torch
from accelerate.utils import DistributedType

from pytorch_accel._checkpointing.files import disk_full_error
from pytorch_accel._checkpointing.fit import model_misfit, trainable_parameters
from pytorch_accel._checkpointing.resume import (
    PER_PROCESS,
    Position,
    ResumePoint,
    callback_states,
    gradients,
)
from pytorch_accel._checkpointing.sharded import (
    DCP_MODEL,
    is_sharded,
    load_states,
    optimizer_owner,
    read_dcp_metadata,
    read_sharded,
    saves_sharded,
    sharded_model_tensors,
    states_to_save,
    write_sharded,
)
from pytorch_accel._checkpointing.staging import HostCopies, PendingSave, StagedFile
from pytorch_accel._checkpointing.store import (
    TrainingStateError,
    complete_state,
    discard,
    hidden,
    newest_resumable,
    rank_state_name,
    refuse_fsdp1,
    verify_training_state,
)
from pytorch_accel._checkpointing.streams import stream_position
from pytorch_accel._checks import fail
from pytorch_accel._loop import training_rng_preserved
from pytorch_accel._resumable import RandomStates
from pytorch_accel._state import Preparation
from pytorch_accel._stored_items import _random_states_kept
from pytorch_accel.callback import TrainerCallback
from pytorch_accel.distributed import AgreedFlag
from pytorch_accel.run_config import TrainerRunConfig, recorded
from pytorch_accel.tracking import setup_logging

if TYPE_CHECKING:
    from pytorch_accel._state import TrainerState
    from pytorch_accel.protocols import TrainerLike as Trainer

__all__ = ["TrainingStateIO"]


class TrainingStateIO:
    """Saves and loads the training states of one trainer."""

    def __init__(self, trainer: Trainer, preparation: Preparation, loop: TrainerState) -> None:
        self._trainer, self._preparation, self._loop = trainer, preparation, loop
        self._saving: Position | None = None
        self._copies = HostCopies()
        self._flag: AgreedFlag | None = None

    # -------------------------------------------------------------------------------- save

    def save(self, output_dir: str | os.PathLike[str], blocking: bool = True) -> Path:
        """Write a training state to ``output_dir`` (see ``Trainer.save_training_state``).

        With ``blocking=False`` inside ``train()``, it is staged in host memory, written in the
        background and published at a later step boundary (``TrainerState.poll_save``).
        """
        final = Path(output_dir)
        self._loop.end_save()  # at most one save in flight: the previous one completes
        self._saving = self._loop.position("Trainer.save_training_state")
        self._refuse_open_window(self._saving)
        try:
            self._write(final, hidden(final), blocking or not self._loop.running, self._saving)
        finally:
            self._saving = None
        return final

    def _refuse_open_window(self, position: Position) -> None:
        """Refuse FSDP1, and a save inside an accumulation window under FSDP.

        FSDP keeps a window's gradients out of reach of the ``.grad`` a training state saves.
        """
        refuse_fsdp1(self._trainer.accelerator, "Trainer.save_training_state")
        config = self._trainer.run_config
        if not position.in_run or config is None or not is_sharded(self._trainer.accelerator):
            return
        steps, done = config.gradient_accumulation_steps, position.batches_done
        if steps > 1 and done % steps and done != config.train_dataloader_len:
            raise RuntimeError(
                f"Trainer.save_training_state: under FSDP a training state can only be saved "
                f"where an accumulation window ends, but {done} batches of this epoch are "
                f"done with gradient_accumulation_steps={steps}: FSDP keeps the window's "
                "gradients where a training state cannot save them. Save after an optimizer "
                f"update (after a multiple of {steps} steps, as SaveTrainingStateCallback's "
                "save_every_n_steps does) or at the end of an epoch."
            )

    def _write(self, final: Path, temporary: Path, blocking: bool, position: Position) -> None:
        self._prepare_model()
        trainer = self._trainer
        accelerator, model, optimizer = trainer.accelerator, trainer.model, trainer.optimizer
        owner = optimizer_owner(model, trainer.loss_func)
        _refuse_engine(accelerator, "Trainer.save_training_state")
        main, rank = accelerator.is_main_process, accelerator.process_index
        if main:
            discard(temporary)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        info, files = self._manifest_info(position), []
        if saves_sharded(accelerator):  # every process writes its shards with DCP, blocking
            blocking = True
            try:
                write_sharded(temporary, model, optimizer, owner)
            except BaseException as error:
                if main:
                    discard(temporary)
                full = disk_full_error(error, final, "training state")
                if full is None:
                    raise
                raise full from error
        with self._copies.session(copy=not blocking) as copy:
            if not saves_sharded(accelerator):  # gathered whole under FSDP (a collective)
                model_state, optimizer_state = states_to_save(
                    model, optimizer, is_sharded(accelerator), owner, saving=True
                )
                adapter = None if is_sharded(accelerator) else trainable_parameters(model)
                if adapter is not None:  # a PEFT model: its adapter, not its frozen base
                    model_state = {k: v for k, v in model_state.items() if k in adapter}
                    info["model_state"] = _TRAINABLE_ONLY
                if main:
                    files.append(StagedFile(_MODEL, copy(model_state), safetensors=True))
                    if optimizer_state is not None:
                        files.append(StagedFile(_OPTIMIZER, copy(optimizer_state)))
            if main:
                files.append(StagedFile(_SHARED, copy(self.state_dict()), checked=True))
                for index, obj in enumerate(_registered(accelerator), start=1):
                    name = f"custom_checkpoint_{index}.pkl"
                    files.append(StagedFile(name, copy(obj.state_dict()), checked=True))
            files.append(StagedFile(f"random_states_{rank}.pkl", _random_states(accelerator)))
            rank_state = copy(self._rank_state(position))
            files.append(StagedFile(rank_state_name(rank), rank_state, checked=True))
        pending = PendingSave(files, temporary, final, info, accelerator, self._agreement())
        if blocking:
            pending.run()
            announced = self._announce_save(temporary, final)  # on every process, even so
            pending.error = pending.error or announced
            pending.wait()  # a callback's error abandons the save on every process
            accelerator.wait_for_everyone()  # the state is published for every process
        else:  # announced at once: a callback's files are there before the manifest
            pending.error = self._announce_save(temporary, final)
            pending.start()
            self._loop.pending_save = pending

    def _agreement(self) -> AgreedFlag | None:
        """The flag the processes agree on a save's completion with (``None``: one process)."""
        if self._trainer.accelerator.num_processes == 1:
            return None
        if self._flag is None:
            self._flag = AgreedFlag()
        return self._flag

    def _announce_save(self, directory: Path, final: Path) -> Exception | None:
        """Fire ``on_save_training_state``; return what a callback raised, if anything.

        Before the manifest is written: what the callbacks write into ``directory`` is covered.
        """
        try:
            self._fire("on_save_training_state", directory=directory, output_dir=final)
        except Exception as error:  # the save is abandoned on every process, then raised
            return error
        return None

    def _fire(self, event: str, **kwargs: Any) -> None:
        """Fire a save or load event, keeping the random states (saved, or just loaded)."""
        trainer = self._trainer
        with training_rng_preserved(trainer.accelerator.device), _random_states_kept():
            trainer.callback_handler.call_event(event, trainer, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The trainer state that is the same on every process, saved by the main process."""
        trainer = self._trainer
        position = self._saving or self._loop.position("Trainer.save_training_state")
        history = trainer.run_history.state_dict()
        if self._loop.savable == "epoch":  # the trainer counts the epoch right after this event
            history["current_epoch"] += 1
        config, scaler = trainer.run_config, trainer.accelerator.scaler
        return {
            "position": position.to_dict(),
            "num_updates": self._loop.num_updates,
            "updates_before": self._loop.updates_before,
            "run": {} if config is None else _resume_relevant(config),
            "history": history,
            "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
            "callbacks": callback_states(trainer.callback_handler.callbacks),
            "run_setup": recorded(config),
            "loss_func": _loss_state(trainer.loss_func),
            "scaler": None if scaler is None else scaler.state_dict(),
        }

    def _rank_state(self, position: Position) -> dict[str, Any]:
        """The trainer state that differs between processes."""
        resumable, dataloader = self._loop.resumable, self._loop.train_dataloader
        mid_epoch = position.in_run and position.batches_done > 0
        stream = None
        if resumable is not None:
            epoch_states = resumable.randomness.epoch_states if mid_epoch else None
            generators = list(resumable.randomness.current_states().generators)
            dataloader = resumable.dataloader
        else:  # a stream: its saved position, or replayed (see resume.enter_epoch)
            pass_state = self._loop.pass_random_state if mid_epoch else None
            epoch_states = None if pass_state is None else RandomStates(pass_state, ())
            generators, stream = [], stream_position(dataloader)
        loader: dict[str, Any] = {
            "epoch_states": None if epoch_states is None else epoch_states.to_dict(),
            "generators": generators,
            "iteration": int(getattr(dataloader, "iteration", 0)),
        }
        if stream is not None and mid_epoch:
            loader["stream"] = {"state": stream.state_at(position.batches_done)}
        return {
            "loss_tracker": self._loop.train_loss_tracker.state_dict() if mid_epoch else None,
            "item_weighting": self._loop.item_weighting.state_dict() if mid_epoch else None,
            "logged": self._loop.logged.state_dict() if mid_epoch else None,
            "callbacks": callback_states(self._trainer.callback_handler.callbacks, PER_PROCESS),
            "gradients": gradients(self._trainer.model),
            "loader": loader,
        }

    def _manifest_info(self, position: Position) -> dict[str, Any]:
        return {
            "world_size": self._trainer.accelerator.num_processes,
            "saved_at_ns": time.time_ns(),
            "num_updates": self._loop.num_updates,
            "epoch": self._trainer.run_history.current_epoch,
            "position": position.to_dict(),
        }

    # -------------------------------------------------------------------------------- load

    def load(
        self,
        directory: Path,
        where: str,
        check: Callable[[dict[str, Any]], None] | None = None,
        optimizer: bool = True,
    ) -> tuple[dict[str, Any], dict[str, Any], int]:
        """Verify a training state, then load it from the verified bytes (history and counts too).

        Returns its shared state, this process's state and the number of processes that saved
        it. Then fires ``on_load_training_state``.

        ``where`` is the entry point, for messages; ``check`` sees the shared state before
        anything is loaded; ``optimizer``: load the optimizer's state.

        Raises:
            FileNotFoundError: If there is no such directory.
            TrainingStateError: If it is incomplete, corrupt or does not fit this trainer.
        """
        trainer = self._trainer
        accelerator = trainer.accelerator
        refuse_fsdp1(accelerator, where)
        _refuse_engine(accelerator, where)
        self._loop.end_save()
        directory = complete_state(directory)
        manifest = verify_training_state(directory, accelerator.num_processes, where)
        saved_world, loaded, records = (
            int(manifest["world_size"]),
            manifest["loaded"],
            manifest["files"],
        )
        self._prepare_model()
        model = trainer.model
        sharded = f"{DCP_MODEL}/.metadata" in records
        adapter = manifest.get("model_state") == _TRAINABLE_ONLY
        _check_model_fits(accelerator, model, directory, loaded, records, sharded, where, adapter)
        shared = loaded.get(_SHARED)
        if not isinstance(shared, dict) or "position" not in shared:
            raise TrainingStateError(f"{where}: {str(directory)!r} holds no trainer state.")
        if check is not None:
            check(shared)
        target = trainer.optimizer if optimizer else None
        owner = optimizer_owner(model, trainer.loss_func)
        try:
            if sharded:
                read_sharded(directory, records, model, target, where, owner)
            else:
                saved = loaded.get(_OPTIMIZER) if target is not None else None
                full = is_sharded(accelerator)
                load_states(model, loaded[_MODEL], target, saved, full, owner, strict=not adapter)
        except TrainingStateError:
            raise
        except (RuntimeError, ValueError, KeyError) as error:
            raise TrainingStateError(
                f"{where}: {str(directory)!r} does not fit this trainer's model or optimizer: "
                f"{error}"
            ) from error
        for index, obj in enumerate(_registered(accelerator), start=1):
            if f"custom_checkpoint_{index}.pkl" in loaded:
                obj.load_state_dict(loaded[f"custom_checkpoint_{index}.pkl"])
        if accelerator.scaler is not None and shared.get("scaler") is not None:
            accelerator.scaler.load_state_dict(shared["scaler"])
        rank = accelerator.process_index
        if rank < saved_world:
            _restore_random_states(accelerator, loaded[f"random_states_{rank}.pkl"])
        loss_state, loss_func = shared.get("loss_func"), trainer.loss_func
        if loss_state is not None and isinstance(loss_func, torch.nn.Module):
            loss_func.load_state_dict(loss_state)
        trainer.run_history.load_state_dict(shared["history"])
        self._loop.restore_counts(shared)  # a later call continues them
        self._fire("on_load_training_state", directory=directory)
        # another number of processes (between epochs): process i takes saved process i's
        # own state, or (beyond them) process i modulo their number's
        return shared, loaded[rank_state_name(rank % saved_world)], saved_world

    def resume_point(
        self,
        resume_from: str | os.PathLike[str] | None,
        *,
        optimizer: bool = True,
        scheduler: bool = True,
    ) -> ResumePoint | None:
        """Load the state to resume from (if any); check that it fits this run.

        ``optimizer``, ``scheduler``: load their saved states (``train(resume_optimizer=...,
        resume_scheduler=...)``).
        """
        directory = None if resume_from is None else self._resume_directory(resume_from)
        if directory is None:
            return None
        check = functools.partial(self._check_resumable, directory, scheduler)
        shared, rank_state, saved_world = self.load(directory, "Trainer.train", check, optimizer)
        # the samplers' generators of another number of processes are others: not replayed
        same_world = saved_world == self._trainer.accelerator.num_processes
        generators = tuple(rank_state["loader"]["generators"]) if same_world else ()
        random_states = RandomStates(torch.get_rng_state(), generators)
        trainer = self._trainer
        if trainer.scheduler is not None and scheduler:
            kept = getattr(trainer.scheduler, "base_lrs", None)
            trainer.scheduler.load_state_dict(shared["scheduler"])
            if kept is not None and not optimizer:
                _rebase_schedule(trainer.scheduler, trainer.optimizer, kept)
        epoch = trainer.run_history.current_epoch
        # said before any callback's run start sets the logger up, so set it up here
        setup_logging().info(f"Resuming from {str(directory)!r} (epoch {epoch}).")
        if trainer.scheduler is not None and scheduler:
            self._lengthen_schedule(directory, int(shared["num_updates"]))
        position = Position.from_dict(shared["position"])
        return ResumePoint(directory, position, shared["callbacks"], rank_state, random_states)

    def _lengthen_schedule(self, directory: Path, updates: int) -> None:
        """Replace a loaded schedule too short for the resumed run by one built for its length.

        A scheduler with ``total_steps`` (``OneCycleLR``) fails past its end; the run gets the
        one ``create_scheduler_fn`` builds for its new length, stepped to the saved count.
        """
        trainer = self._trainer
        saved_length = getattr(trainer.scheduler, "total_steps", None)
        assert trainer.run_config is not None
        needed = trainer.run_config.total_num_update_steps
        if not isinstance(saved_length, int) or saved_length >= needed:
            return
        scheduler = trainer.create_scheduler()
        with warnings.catch_warnings():  # stepped before any optimizer step, on purpose
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            for _ in range(updates):
                scheduler.step()
        trainer.scheduler = scheduler
        setup_logging().info(
            f"The scheduler saved in {str(directory)!r} ({type(scheduler).__name__}) was built "
            f"for {saved_length} updates; this run has {needed}: it continues with the one "
            f"create_scheduler_fn builds for {needed} updates, at update {updates}."
        )

    def _resume_directory(self, resume_from: str | os.PathLike[str]) -> Path | None:
        if os.fspath(resume_from) != "latest":
            return complete_state(Path(resume_from))
        trainer = self._trainer
        save_dirs = [
            save_dir
            for callback in trainer.callback_handler.callbacks
            if isinstance(callback, TrainerCallback)
            and (save_dir := callback.training_states_dir()) is not None
        ]
        if not save_dirs:
            fail(
                ValueError,
                "Trainer.train",
                "resume_from",
                "latest",
                "a directory, or 'latest' with a SaveTrainingStateCallback",
                "Add SaveTrainingStateCallback(save_dir=...) (its save_dir is searched), or pass "
                "the directory of a training state.",
            )
        world_size = trainer.accelerator.num_processes
        latest, passed = newest_resumable(save_dirs[0], world_size)
        if passed:
            names = ", ".join(repr(path.name) for path in passed)
            message = (
                f'resume_from="latest": passed over {names} in {str(save_dirs[0])!r}, saved '
                f"in the middle of an epoch by another number of processes than this run's "
                f"{world_size}; only a state saved between epochs resumes on another number."
            )
            warnings.warn(message, stacklevel=4)
        if latest is None:
            setup_logging().info(
                f"No training state in {str(save_dirs[0])!r} that resumes on {world_size} "
                "process(es) yet: starting afresh."
            )
        return latest

    def _check_resumable(
        self, directory: Path, with_scheduler: bool, shared: Mapping[str, Any]
    ) -> None:
        """Raise if the saved run cannot continue as this ``train()`` call is set up."""
        trainer = self._trainer
        assert trainer.run_config is not None
        position = Position.from_dict(shared["position"])
        saved_scheduler = shared["scheduler"] is not None
        if with_scheduler and saved_scheduler != (trainer.scheduler is not None):
            fail(
                TrainingStateError,
                "Trainer.train",
                "create_scheduler_fn",
                trainer.create_scheduler_fn,
                "the same scheduler as the saved run" if saved_scheduler else "None, as saved",
                f"{str(directory)!r} was saved {'with' if saved_scheduler else 'without'} a "
                "scheduler; resume with the same create_scheduler_fn.",
            )
        done, num_epochs = position.epoch_index, trainer.run_config.num_epochs
        if num_epochs is not None and done > num_epochs:
            fail(
                TrainingStateError,
                "Trainer.train",
                "num_epochs",
                num_epochs,
                f"at least {done}, the epochs the saved run already trained",
                f"{str(directory)!r} is past the end of this run; pass num_epochs={done} or "
                "more to continue it.",
            )
        if done == num_epochs:
            setup_logging().info(
                f"{str(directory)!r} is the end of a run of {num_epochs} epochs: nothing is left "
                "to train (pass a larger num_epochs to continue it)."
            )
        mid_epoch = position.batches_done > 0
        in_run = num_epochs is None or done < num_epochs
        if not mid_epoch and not (int(shared["num_updates"]) > 0 and in_run):
            return  # else this call's batches per epoch must be the saved run's
        why = "it stopped mid-epoch" if mid_epoch else "its update count continues"
        saved, now = shared["run"], _resume_relevant(trainer.run_config)
        if saved.get("num_processes") != now["num_processes"] and not mid_epoch:
            # the updates per epoch matter, not how they split
            now = {k: v for k, v in now.items() if k in _UPDATES_PER_EPOCH}
        for name, value in now.items():
            if name in saved and saved[name] != value:
                fail(
                    TrainingStateError,
                    "Trainer.train",
                    name,
                    value,
                    f"{saved[name]}, as in the saved run ({why})",
                    f"Resume {str(directory)!r} with the same train() arguments and dataset.",
                )

    # ------------------------------------------------------------------------------ shared

    def _prepare_model(self) -> None:
        """Prepare the model and optimizer if no run has yet (accelerate saves the prepared)."""
        if not self._preparation.has_model:
            self._preparation.prepare_model_and_optimizer(self._trainer)


_OTHER_ENGINES = (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM, DistributedType.XLA)
"""Engines whose model and optimizer states ``torch.distributed.checkpoint`` does not hold."""

_MODEL, _OPTIMIZER = "model.safetensors", "optimizer.bin"
"""A full state's model (safetensors) and optimizer (keyed by parameter name) files."""
_TRAINABLE_ONLY = "trainable parameters only"
"""The manifest's ``model_state`` of a PEFT model's state: its adapter, not its frozen base."""
_SHARED = "custom_checkpoint_0.pkl"
"""The trainer's shared state (``TrainingStateIO.state_dict``), written by the main process."""

_UPDATES_PER_EPOCH = ("gradient_accumulation_steps", "train_dataloader_len")
"""The settings that fix a run's updates per epoch, which its count of updates continues."""


def _resume_relevant(config: TrainerRunConfig) -> dict[str, Any]:
    """The run settings a mid-epoch resume needs unchanged to see the same batches."""
    return {  # the arguments first, then what they and the dataset give
        "train_per_device_batch_size": config.train_per_device_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "num_processes": config.num_processes,
        "train_dataloader_len": config.train_dataloader_len,
    }


def _registered(accelerator: Any) -> list[Any]:
    """The objects the user registered with ``accelerator.register_for_checkpointing``."""
    return list(getattr(accelerator, "_custom_objects", []))


def _random_states(accelerator: Any) -> dict[str, Any]:
    """This process's random states (``random_states_<rank>.pkl``), and accelerate's step."""
    states = {
        "random_state": random.getstate(),
        "numpy_random_seed": numpy.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
        "step": accelerator.step,
    }
    if torch.cuda.is_available():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    return states


def _restore_random_states(accelerator: Any, states: Mapping[str, Any]) -> None:
    """Set the random states of ``_random_states``, as verified."""
    random.setstate(states["random_state"])
    numpy.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if "torch_cuda_manual_seed" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])
    if "step" in states:
        accelerator.step = states["step"]


def _loss_state(loss_func: Any) -> dict[str, Any] | None:
    """The parameters and buffers of a loss module (``None``: not a module, or none)."""
    if not isinstance(loss_func, torch.nn.Module):
        return None
    return loss_func.state_dict() or None


def _check_model_fits(
    accelerator: Any,
    model: torch.nn.Module,
    directory: Path,
    loaded: Mapping[str, Any],
    records: Mapping[str, Any],
    sharded: bool,
    where: str,
    adapter: bool = False,
) -> None:
    """Compare the saved parameter names and shapes with the model's, before loading.

    ``adapter``: the state holds a PEFT model's trainable parameters only, which must be this
    model's trainable parameters, with the same shapes (its frozen base stays as it is).
    """
    if sharded:
        metadata = read_dcp_metadata(directory, records, where).state_dict_metadata
        path = directory / DCP_MODEL
        shapes = {
            key.removeprefix("model."): tuple(item.size)
            for key, item in metadata.items()
            if hasattr(item, "size")
        }
    elif isinstance(loaded.get(_MODEL), Mapping):
        path, shapes = directory / _MODEL, {k: tuple(v.shape) for k, v in loaded[_MODEL].items()}
    else:
        raise TrainingStateError(f"{where}: {str(directory)!r} holds no model state.")
    tensors = sharded_model_tensors(model) if is_sharded(accelerator) else None
    if adapter:
        tensors = {key: p for key, p in model.named_parameters() if p.requires_grad}
        problems = model_misfit(model, shapes, tensors)
        if problems:
            raise TrainingStateError(
                f"{where}: {str(path)!r} holds the trainable (adapter) parameters of a PEFT "
                f"model only (its manifest's model_state is {_TRAINABLE_ONLY!r}), and they are "
                f"not this model's trainable parameters: {problems}. Resume with the same base "
                "model wrapped in the same adapter (peft.get_peft_model with the same config)."
            )
        return
    problems = model_misfit(model, shapes, tensors)
    if problems:
        raise TrainingStateError(
            f"{where}: {str(path)!r} holds a different model: {problems}. Resume with the "
            "model it was saved from."
        )


def _refuse_engine(accelerator: Any, where: str) -> None:
    """Refuse engines that hold the model's state outside ``torch.distributed.checkpoint``."""
    if accelerator.distributed_type in _OTHER_ENGINES:
        raise RuntimeError(
            f"{where}: training states are saved on one process, DDP and FSDP version 2, not "
            f"under {accelerator.distributed_type}; save_checkpoint and load_checkpoint work "
            "under it."
        )


def _rebase_schedule(scheduler: Any, optimizer: torch.optim.Optimizer, kept: list[float]) -> None:
    """Put a resumed schedule on the kept optimizer's rates (``resume_optimizer=False``).

    Only the position resumes: each group's rate is the saved one scaled by new base over old
    base (exact for every schedule proportional to its base rate).
    """
    saved_bases, saved_rates = list(scheduler.base_lrs), scheduler.get_last_lr()
    scheduler.base_lrs = list(kept)
    for group, rate, old, new in zip(
        optimizer.param_groups, saved_rates, saved_bases, kept, strict=True
    ):
        group["lr"] = rate * new / old if old else new
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
