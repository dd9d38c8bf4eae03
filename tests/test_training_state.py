"""Saving and loading training states in one process: atomic writes, verification, errors."""

from __future__ import annotations

import functools
import json
import pickle
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SaveAtStep, clone_params, make_model, make_trainer
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel._checkpointing.store import write_manifest
from pytorch_accel.callbacks import (
    EarlyStoppingCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
)
from pytorch_accel.training_state import (
    MANIFEST_NAME,
    TrainingStateError,
    find_training_states,
    latest_training_state,
)

STEP_LR = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)


def saved_after_training(tmp_path: Path, dataset: TensorDataset, **train: Any) -> Trainer:
    trainer = make_trainer()
    trainer.train(dataset, num_epochs=1, per_device_batch_size=8, **train)
    trainer.save_training_state(tmp_path / "state")
    return trainer


def rewrite(state: Path, name: str, data: bytes) -> None:
    """Replace a file and re-write the manifest, as a deliberate forgery would."""
    (state / name).write_bytes(data)
    (state / MANIFEST_NAME).unlink()
    write_manifest(state, {"world_size": 1, "saved_at_ns": 0})


# ----------------------------------------------------------------------------- saving


def test_a_state_is_a_complete_directory_with_a_manifest(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    state = tmp_path / "state"
    manifest = json.loads((state / MANIFEST_NAME).read_text())
    assert manifest["world_size"] == 1
    assert manifest["num_updates"] == 8
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(manifest["files"])
    assert {"custom_checkpoint_0.pkl", "trainer_rank_0.pt"} <= set(manifest["files"])
    assert not list(tmp_path.glob(".*"))  # no temporary directory is left behind


def test_save_inside_an_event_other_than_step_or_epoch_end_is_refused(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    class SaveAtEpochStart(TrainerCallback):
        def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.save_training_state(tmp_path / "state")

    trainer = make_trainer(callbacks=(SaveAtEpochStart(),))
    with pytest.raises(RuntimeError, match="on_train_step_end or on_training_run_epoch_end"):
        trainer.train(regression_dataset, num_epochs=1)
    assert not (tmp_path / "state").exists()


def test_a_failed_save_leaves_the_previous_state_intact(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    class Unsafe(TrainerCallback):
        payload: Any = None

        def state_dict(self) -> dict[str, Any]:
            return {"payload": self.payload}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.payload = state["payload"]

    unsafe = Unsafe()
    trainer = make_trainer(callbacks=(unsafe,))
    trainer.train(regression_dataset, num_epochs=1)
    trainer.save_training_state(tmp_path / "state")
    before = (tmp_path / "state" / MANIFEST_NAME).read_text()
    unsafe.payload = functools.partial(print)  # not loadable with weights_only
    with pytest.raises(TypeError, match="cannot be loaded safely"):
        trainer.save_training_state(tmp_path / "state")
    assert (tmp_path / "state" / MANIFEST_NAME).read_text() == before
    assert not list(tmp_path.glob(".*"))


# ---------------------------------------------------------------------------- loading


def test_load_training_state_restores_weights_optimizer_and_history(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    trainer = saved_after_training(tmp_path, regression_dataset)
    fresh = make_trainer(make_model(seed=7))
    shared = fresh.load_training_state(tmp_path / "state")
    for mine, saved in zip(clone_params(fresh.model), clone_params(trainer.model), strict=True):
        assert torch.equal(mine, saved)
    assert fresh.optimizer.state_dict() == trainer.optimizer.state_dict()
    assert fresh.run_history.state_dict() == trainer.run_history.state_dict()
    assert shared["num_updates"] == 8


def test_loading_a_missing_directory_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no training state directory at .*nowhere"):
        make_trainer().load_training_state(tmp_path / "nowhere")


def test_a_directory_without_manifest_is_an_interrupted_save(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    (tmp_path / "state" / MANIFEST_NAME).unlink()
    with pytest.raises(TrainingStateError, match="not a complete training state"):
        make_trainer().load_training_state(tmp_path / "state")


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "trainer_rank_0.pt"])
def test_a_truncated_file_is_named(
    tmp_path: Path, regression_dataset: TensorDataset, name: str
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    path = tmp_path / "state" / name
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(TrainingStateError, match=rf"{name}' is truncated"):
        make_trainer().load_training_state(tmp_path / "state")


def test_a_corrupt_file_is_named(tmp_path: Path, regression_dataset: TensorDataset) -> None:
    saved_after_training(tmp_path, regression_dataset)
    path = tmp_path / "state" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(TrainingStateError, match=r"model.safetensors' is corrupt"):
        make_trainer().load_training_state(tmp_path / "state")


def test_a_record_of_another_algorithm_is_refused(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    """A manifest recording SHA-256 (earlier development versions) is refused, not passed."""
    saved_after_training(tmp_path, regression_dataset)
    manifest_path = tmp_path / "state" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["model.safetensors"] = {"size": 1, "sha256": "0" * 64}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        TrainingStateError,
        match=r"model.safetensors' has a record in the manifest that this version does not "
        r"verify: \['sha256', 'size'\], .* save the state again with this version",
    ):
        make_trainer().load_training_state(tmp_path / "state")


class Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(PAYLOAD_MARKER[0]),))


PAYLOAD_MARKER: list[str] = [""]


def test_a_forged_pickle_is_refused_without_running_it(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    marker = tmp_path / "payload-ran"
    PAYLOAD_MARKER[0] = str(marker)
    rewrite(tmp_path / "state", "custom_checkpoint_0.pkl", pickle.dumps({"x": Payload()}))
    with pytest.raises(
        TrainingStateError, match=r"could not read .*custom_checkpoint_0.pkl.* safely"
    ):
        make_trainer().load_training_state(tmp_path / "state")
    assert not marker.exists()


def test_a_different_model_is_refused_with_the_mismatch(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    wider = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    with pytest.raises(
        TrainingStateError, match=r"different model: 0.bias: saved \[8\], model \[16\]"
    ):
        make_trainer(wider).load_training_state(tmp_path / "state")


def test_a_different_world_size_is_refused_mid_epoch(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    manifest_path = tmp_path / "state" / MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text())
    manifest["world_size"] = 2
    manifest["position"]["batches_done"] = 3
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(
        TrainingStateError,
        match="saved by 2 processes in the middle of an epoch, but this run has 1",
    ):
        make_trainer().load_training_state(tmp_path / "state")


# ---------------------------------------------------------------------------- resuming


def test_resume_needs_the_same_scheduler(tmp_path: Path, regression_dataset: TensorDataset) -> None:
    saved_after_training(tmp_path, regression_dataset, create_scheduler_fn=STEP_LR)
    trainer = make_trainer()
    before = clone_params(trainer.model)
    with pytest.raises(TrainingStateError, match="create_scheduler_fn"):
        trainer.train(regression_dataset, num_epochs=2, resume_from=tmp_path / "state")
    for mine, original in zip(clone_params(trainer.model), before, strict=True):
        assert torch.equal(mine, original)  # refused before anything was loaded


def test_mid_epoch_resume_needs_the_same_batches(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    make_trainer(callbacks=(SaveAtStep(tmp_path / "state", 3),)).train(
        regression_dataset, num_epochs=1, per_device_batch_size=8
    )
    with pytest.raises(
        TrainingStateError, match="train_per_device_batch_size must be 8, as in the saved run"
    ):
        make_trainer().train(
            regression_dataset,
            num_epochs=1,
            per_device_batch_size=4,
            resume_from=tmp_path / "state",
        )


def test_resume_latest_needs_a_save_training_state_callback(
    regression_dataset: TensorDataset,
) -> None:
    with pytest.raises(ValueError, match="resume_from must be a directory, or 'latest' with"):
        make_trainer().train(regression_dataset, num_epochs=1, resume_from="latest")


def test_resume_latest_starts_afresh_when_there_is_no_state(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    callback = SaveTrainingStateCallback(tmp_path, preemption_signals=())
    trainer = make_trainer(callbacks=(callback,))
    trainer.train(regression_dataset, num_epochs=1, resume_from="latest")
    assert trainer.resumed_from is None
    assert trainer.num_updates == 8
    assert find_training_states(tmp_path) == [tmp_path / "final"]


def test_resuming_a_finished_run_trains_nothing_more(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    trainer = saved_after_training(tmp_path, regression_dataset)
    resumed = make_trainer(make_model(seed=3))
    resumed.train(
        regression_dataset, num_epochs=1, per_device_batch_size=8, resume_from=tmp_path / "state"
    )
    assert resumed.num_updates == 8
    for mine, saved in zip(clone_params(resumed.model), clone_params(trainer.model), strict=True):
        assert torch.equal(mine, saved)
    assert resumed.run_history.get_metric_values("train_loss_epoch") == (
        trainer.run_history.get_metric_values("train_loss_epoch")
    )


def test_callback_states_are_restored_and_missing_ones_reported(
    tmp_path: Path, regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    stopping = EarlyStoppingCallback(early_stopping_patience=5, early_stopping_threshold=100.0)
    trainer = make_trainer(
        callbacks=(stopping, SaveTrainingStateCallback(tmp_path, preemption_signals=()))
    )
    trainer.train(regression_dataset, num_epochs=2, eval_dataset=small_eval_dataset)
    assert stopping.early_stopping_patience_counter == 1
    restored = EarlyStoppingCallback(early_stopping_patience=5, early_stopping_threshold=100.0)
    more = dict(num_epochs=3, eval_dataset=small_eval_dataset, resume_from=tmp_path / "final")
    make_trainer(callbacks=(restored,)).train(regression_dataset, **more)
    assert restored.early_stopping_patience_counter == 2  # 1 saved, + the third epoch
    with pytest.warns(
        UserWarning, match="EarlyStoppingCallback callback that this trainer does not"
    ):
        make_trainer().train(regression_dataset, **more)


# ---------------------------------------------------------------------------- callback


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"save_every_n_steps": 0}, "save_every_n_steps must be a positive int"),
        ({"max_checkpoints": -1}, "max_checkpoints must be a positive int"),
        ({"preemption_signals": ("TERM",)}, "preemption_signals must be signal numbers"),
    ],
)
def test_callback_arguments_are_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SaveTrainingStateCallback(**kwargs)


def test_callback_keeps_the_newest_max_checkpoints(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    callback = SaveTrainingStateCallback(
        tmp_path, save_every_n_steps=3, max_checkpoints=2, save_at_end=False, preemption_signals=()
    )
    make_trainer(callbacks=(callback,)).train(regression_dataset, num_epochs=2)
    names = [state.name for state in find_training_states(tmp_path)]
    assert names == ["updates-00000012", "updates-00000015"]
    assert latest_training_state(tmp_path) == tmp_path / "updates-00000015"


def test_callback_restores_signal_handlers_after_the_run(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    callback = SaveTrainingStateCallback(tmp_path, save_at_end=False)
    make_trainer(callbacks=(callback,)).train(regression_dataset, num_epochs=1)
    assert signal.getsignal(signal.SIGTERM) is before


class CountingDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset, self.reads = dataset, 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads += 1
        return self.dataset[index]


def test_mid_epoch_resume_loads_no_sample_of_the_skipped_batches(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    make_trainer(callbacks=(SaveAtStep(tmp_path / "state", 6),)).train(
        regression_dataset, num_epochs=1, per_device_batch_size=8
    )
    counting = CountingDataset(regression_dataset)
    resumed = make_trainer()
    resumed.train(
        counting,
        num_epochs=1,
        per_device_batch_size=8,
        train_dataloader_kwargs={"num_workers": 0},
        resume_from=tmp_path / "state",
    )
    assert resumed.num_updates == 8
    assert counting.reads == 2 * 8  # the last 2 of 8 batches


def test_latest_is_the_last_saved_whatever_its_name(
    tmp_path: Path, regression_dataset: TensorDataset, small_eval_dataset: TensorDataset
) -> None:
    callback = SaveTrainingStateCallback(
        tmp_path,
        save_every_n_epochs=1,
        save_every_n_steps=3,
        max_checkpoints=2,
        preemption_signals=(),
    )
    trainer = make_trainer(callbacks=(callback,))
    trainer.train(regression_dataset, num_epochs=2, eval_dataset=small_eval_dataset)
    names = [state.name for state in find_training_states(tmp_path)]
    assert names == ["epoch-0002", "final"]
    assert latest_training_state(tmp_path) == tmp_path / "final"


# ------------------------------------------------------------- what kills and forgers leave


def test_a_file_not_in_the_manifest_is_refused_and_never_run(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saved_after_training(tmp_path, regression_dataset)
    marker = tmp_path / "payload-ran"
    PAYLOAD_MARKER[0] = str(marker)
    planted = tmp_path / "state" / "custom_checkpoint_1.pkl"
    torch.save({"x": Payload()}, planted)
    trainer = make_trainer()
    trainer.save_training_state(tmp_path / "own")  # the trainer's state is registered first
    trainer.accelerator.register_for_checkpointing(nn.Linear(1, 1))  # then a user's object
    with pytest.raises(TrainingStateError, match=r"custom_checkpoint_1.pkl' is not listed"):
        trainer.load_training_state(tmp_path / "state")
    with pytest.raises(TrainingStateError, match="is not listed in the manifest"):
        trainer.train(regression_dataset, num_epochs=2, resume_from=tmp_path / "state")
    assert not marker.exists()


def interrupted_between_renames(tmp_path: Path, dataset: TensorDataset) -> tuple[Path, Trainer]:
    """Leave the layout of a re-save of ``states/warm`` killed between its two renames."""
    states = tmp_path / "states"
    old = make_trainer()
    old.train(dataset, num_epochs=1, per_device_batch_size=8)
    old.save_training_state(states / "warm")
    new = make_trainer()
    new.train(dataset, num_epochs=2, per_device_batch_size=8)
    new.save_training_state(tmp_path / "newer")
    (states / "warm").rename(states / ".warm.previous")  # the first rename
    (tmp_path / "newer").rename(states / ".warm.incomplete")  # complete, not yet renamed
    return states, new


def test_a_save_killed_between_its_renames_is_still_found(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    states, new = interrupted_between_renames(tmp_path, regression_dataset)
    assert latest_training_state(states) == states / ".warm.incomplete"
    resumed = make_trainer(make_model(seed=4))
    resumed.train(
        regression_dataset, num_epochs=2, per_device_batch_size=8, resume_from=states / "warm"
    )
    assert resumed.num_updates == new.num_updates == 16
    for mine, saved in zip(clone_params(resumed.model), clone_params(new.model), strict=True):
        assert torch.equal(mine, saved)
    shutil.rmtree(states / ".warm.incomplete")  # the new one was not complete: the old one
    assert latest_training_state(states) == states / ".warm.previous"


def test_a_relaunch_after_a_kill_between_renames_continues_the_run(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    states, _ = interrupted_between_renames(tmp_path, regression_dataset)
    for name in (".warm.incomplete", ".warm.previous"):
        (states / name).rename(states / name.replace("warm", "final"))
    saver = SaveTrainingStateCallback(states, max_checkpoints=1, preemption_signals=())
    relaunched = make_trainer(make_model(seed=4), callbacks=(saver,))
    relaunched.train(
        regression_dataset, num_epochs=2, per_device_batch_size=8, resume_from="latest"
    )
    assert relaunched.resumed_from == states / ".final.incomplete"
    assert relaunched.num_updates == 16  # nothing retrained from scratch
    assert sorted(path.name for path in states.iterdir()) == ["final"]


def test_remains_of_killed_saves_and_deletions_are_cleared(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    half_deleted = tmp_path / "updates-00000003"
    half_deleted.mkdir(parents=True)
    (half_deleted / "optimizer.bin").write_bytes(b"left over")
    (tmp_path / ".epoch-0001.deleting").mkdir()
    (tmp_path / ".updates-00000009.incomplete").mkdir()
    (tmp_path / "my-notes").mkdir()  # not a name the callback gives: left alone
    saver = SaveTrainingStateCallback(
        tmp_path, save_every_n_steps=4, max_checkpoints=1, save_at_end=False, preemption_signals=()
    )
    make_trainer(callbacks=(saver,)).train(
        regression_dataset, num_epochs=1, per_device_batch_size=8
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["my-notes", "updates-00000008"]


# ------------------------------------------------------------- resuming with other settings


def test_an_epoch_end_resume_with_another_batch_size_is_refused(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    saver = SaveTrainingStateCallback(tmp_path, save_every_n_epochs=1, preemption_signals=())
    make_trainer(callbacks=(saver,)).train(
        regression_dataset, num_epochs=1, per_device_batch_size=8
    )
    with pytest.raises(
        TrainingStateError,
        match=r"train_per_device_batch_size must be 8, as in the saved run \(its update count",
    ):
        make_trainer().train(
            regression_dataset,
            num_epochs=3,
            per_device_batch_size=16,
            resume_from=tmp_path / "final",
        )


def test_resuming_past_num_epochs_is_refused_and_at_the_end_says_so(
    tmp_path: Path, regression_dataset: TensorDataset, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = make_trainer()
    trainer.train(regression_dataset, num_epochs=2, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "done")
    with pytest.raises(TrainingStateError, match=r"num_epochs must be at least 2.*got 1"):
        make_trainer().train(
            regression_dataset, num_epochs=1, per_device_batch_size=8, resume_from=tmp_path / "done"
        )
    make_trainer().train(
        regression_dataset, num_epochs=2, per_device_batch_size=8, resume_from=tmp_path / "done"
    )
    assert "nothing is left to train" in caplog.text


def swap_once_verified(trainer: Trainer, state: Path) -> None:
    """Replace the trainer's state file with a code-running pickle once it has been verified.

    As a process racing the load from a shared directory would: between the verification and
    accelerate's loading of the weights.
    """
    load_state = trainer.accelerator.load_state

    def swapping(*args: Any, **kwargs: Any) -> Any:
        forged = state / "forged.tmp"
        torch.save({"x": Payload()}, forged)
        forged.replace(state / "custom_checkpoint_0.pkl")
        return load_state(*args, **kwargs)

    trainer.accelerator.load_state = swapping  # type: ignore[method-assign]


@pytest.mark.parametrize("entry", ["load_training_state", "train"])
def test_a_file_swapped_after_its_verification_runs_no_code(
    tmp_path: Path, regression_dataset: TensorDataset, entry: str
) -> None:
    # issue 29: what is verified is what is loaded (read once), and nothing in a state is
    # unpickled with weights_only=False
    saved_after_training(tmp_path, regression_dataset)
    marker = tmp_path / "payload-ran"
    PAYLOAD_MARKER[0] = str(marker)
    trainer = make_trainer()
    swap_once_verified(trainer, tmp_path / "state")
    if entry == "load_training_state":
        assert trainer.load_training_state(tmp_path / "state")["num_updates"] == 8
    else:
        trainer.train(
            regression_dataset,
            num_epochs=2,
            per_device_batch_size=8,
            resume_from=tmp_path / "state",
        )
        assert trainer.num_updates == 16
    assert not marker.exists()


def test_a_state_without_a_file_every_state_has_is_refused(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    # issue 29: removing a file together with its manifest entry made the resume silently inexact
    saved_after_training(tmp_path, regression_dataset)
    state = tmp_path / "state"
    (state / "random_states_0.pkl").unlink()
    manifest = json.loads((state / MANIFEST_NAME).read_text())
    del manifest["files"]["random_states_0.pkl"]
    (state / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(TrainingStateError, match=r"is incomplete: .*'random_states_0.pkl'"):
        make_trainer().load_training_state(state)


def test_resume_from_latest_asks_the_callbacks_where_their_states_are(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    # issue 28: an explicit method, not the saves_training_states/save_dir attribute names
    class OwnSaver(TrainerCallback):
        def training_states_dir(self) -> Path:
            return tmp_path / "mine"

        def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.save_training_state(tmp_path / "mine" / "end")

    first = make_trainer(callbacks=(OwnSaver(),))
    first.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    resumed = make_trainer(callbacks=(OwnSaver(),))
    resumed.train(regression_dataset, num_epochs=2, per_device_batch_size=8, resume_from="latest")
    assert resumed.num_updates == 16


# ------------------------------------------------------------------ symbolic links (issue 29)


def listing(directory: Path) -> list[str]:
    """The entries of ``directory``, a symbolic link marked with ``@``."""
    return sorted(path.name + "@" * path.is_symlink() for path in directory.iterdir())


def move_and_link_back(states: Path, elsewhere: Path, name: str) -> None:
    """Move a state elsewhere and link it back, as a user short of space would."""
    elsewhere.mkdir(exist_ok=True)
    shutil.move(states / name, elsewhere / name)
    (states / name).symlink_to(elsewhere / name)


def test_rotating_a_symlinked_state_removes_the_link_and_keeps_its_target(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    states, elsewhere = tmp_path / "states", tmp_path / "elsewhere"
    saver = SaveTrainingStateCallback(
        states, save_every_n_steps=2, max_checkpoints=3, preemption_signals=()
    )
    make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
    assert listing(states) == ["final", "updates-00000006", "updates-00000008"]
    for name in ("updates-00000006", "final"):
        move_and_link_back(states, elsewhere, name)
    for _ in range(3):  # each run rotates both links out, then saves those names again
        make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
        assert listing(states) == ["final", "updates-00000006", "updates-00000008"]
    assert latest_training_state(states) == states / "final"
    for name in ("updates-00000006", "final"):  # the user's copies, untouched
        assert listing(elsewhere / name)[0] == "custom_checkpoint_0.pkl"
        assert MANIFEST_NAME in listing(elsewhere / name)


def test_replacing_a_symlinked_final_state_leaves_nothing_behind(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    states, elsewhere = tmp_path / "states", tmp_path / "elsewhere"
    saver = SaveTrainingStateCallback(states, preemption_signals=())
    make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
    move_and_link_back(states, elsewhere, "final")
    before = (elsewhere / "final" / MANIFEST_NAME).read_bytes()
    for _ in range(2):
        make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
        assert listing(states) == ["final"]  # a directory of its own now, no .final.previous
    assert (elsewhere / "final" / MANIFEST_NAME).read_bytes() == before
    (states / "final").rename(tmp_path / "gone")
    (states / "final").symlink_to(tmp_path / "nowhere")  # a broken link is replaced too
    make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
    assert listing(states) == ["final"]


def test_states_rotate_in_a_symlinked_save_dir_and_links_left_by_old_versions_go(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    real, states, elsewhere = tmp_path / "real", tmp_path / "states", tmp_path / "elsewhere"
    real.mkdir()
    states.symlink_to(real)
    elsewhere.mkdir()
    for name in (".final.previous", ".updates-00000002.deleting"):  # left by earlier versions
        (elsewhere / name).mkdir()
        (real / name).symlink_to(elsewhere / name)
    saver = SaveTrainingStateCallback(
        states, save_every_n_steps=2, max_checkpoints=2, preemption_signals=()
    )
    for _ in range(2):
        make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
        assert listing(real) == ["final", "updates-00000008"]
    assert listing(elsewhere) == [".final.previous", ".updates-00000002.deleting"]
    (real / "best").symlink_to("updates-00000008")  # an alias: not a state of its own
    assert find_training_states(states) == [states / "updates-00000008", states / "final"]


def test_a_save_before_the_first_update_leaves_the_optimizer_without_state(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    """torch's get_optimizer_state_dict creates a new optimizer's state by stepping it once."""
    trainer = make_trainer(optimizer_class=torch.optim.AdamW)
    trainer.save_training_state(tmp_path / "state")
    assert not trainer.optimizer.state_dict()["state"]
    torch.manual_seed(1)
    trainer.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    fresh = make_trainer(optimizer_class=torch.optim.AdamW)
    torch.manual_seed(1)
    fresh.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    pairs = zip(clone_params(trainer.model), clone_params(fresh.model), strict=True)
    assert all(torch.equal(saved, unsaved) for saved, unsaved in pairs)


def test_an_object_registered_for_checkpointing_is_saved_and_restored(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    trainer = saved_after_training(tmp_path, regression_dataset)
    registered = nn.Linear(2, 2)
    trainer.accelerator.register_for_checkpointing(registered)
    trainer.save_training_state(tmp_path / "registered")
    other = make_trainer()
    restored = nn.Linear(2, 2)
    other.accelerator.register_for_checkpointing(restored)
    other.load_training_state(tmp_path / "registered")
    assert torch.equal(restored.weight, registered.weight)
