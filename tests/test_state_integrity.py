"""What a resume reads (issue 40, defects 4-6): no links, only verified bytes, the loss module.

A link in a states directory is never picked by ``resume_from="latest"``; a manifest entry
outside the state (absolute, ``..``, through a link) is refused before anything is read; a
file replaced after verification has no effect; a loss module's parameters and buffers are
saved and restored.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_trainer
from torch import nn
from torch.utils.data import TensorDataset

import pytorch_accel._checkpointing.training_state as training_state_module
from pytorch_accel import Trainer
from pytorch_accel._checkpointing.store import write_manifest
from pytorch_accel.callbacks import SaveTrainingStateCallback
from pytorch_accel.training_state import (
    MANIFEST_NAME,
    TrainingStateError,
    latest_training_state,
)

SHUFFLED = {"shuffle": True}


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


# ----------------------------------------------------------------------- links (defect 4)


def test_latest_never_picks_a_link_to_another_runs_state(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    states, other = tmp_path / "states", tmp_path / "other"
    saver = SaveTrainingStateCallback(states, preemption_signals=())
    make_trainer(callbacks=(saver,)).train(regression_dataset, num_epochs=1)
    make_trainer(callbacks=(SaveTrainingStateCallback(other, preemption_signals=()),)).train(
        regression_dataset, num_epochs=2
    )  # saved later: the newest state anywhere
    (states / "zz-linked").symlink_to(other / "final")
    assert latest_training_state(states) == states / "final"
    resumed = make_trainer(callbacks=(saver,))
    resumed.train(regression_dataset, num_epochs=2, resume_from="latest")
    assert resumed.resumed_from == states / "final"


def saved(tmp_path: Path, dataset: TensorDataset, seed: int = 0, **train: Any) -> Path:
    trainer = make_trainer()
    torch.manual_seed(seed)  # the random states the state holds
    trainer.train(dataset, num_epochs=1, per_device_batch_size=8, **train)
    trainer.save_training_state(tmp_path / "state")
    return tmp_path / "state"


def relist(state: Path, name: str, record_of: Path) -> None:
    """List ``name`` in the manifest with the record of ``record_of`` (as a forgery would)."""
    (state / MANIFEST_NAME).unlink()
    write_manifest(state, {"world_size": 1, "saved_at_ns": 0})
    manifest = json.loads((state / MANIFEST_NAME).read_text())
    manifest["files"][name] = manifest["files"][record_of.name]
    (state / MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.bad_input
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "link"])
def test_a_manifest_entry_outside_the_state_is_refused_before_reading(
    tmp_path: Path, regression_dataset: TensorDataset, kind: str
) -> None:
    state = saved(tmp_path, regression_dataset)
    outside = tmp_path / "outside.pkl"
    shutil.copy(state / "custom_checkpoint_0.pkl", outside)
    outside.chmod(0)  # reading it would fail otherwise
    name = {"dotdot": "../outside.pkl", "absolute": str(outside), "link": "linked.pkl"}[kind]
    relist(state, name, state / "custom_checkpoint_0.pkl")
    if kind == "link":  # planted after the manifest (write_manifest refuses links)
        (state / "linked.pkl").symlink_to(outside)
    with pytest.raises(TrainingStateError, match=r"which is not a file inside the state"):
        make_trainer().load_training_state(state)


# ------------------------------------------------------------ verified bytes (defect 6)


PLANTED = [""]


class Planted:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {PLANTED[0]}",))


@pytest.mark.parametrize("replacement", ["another_state", "planted_pickle"])
def test_random_states_replaced_after_verification_have_no_effect(
    tmp_path: Path,
    regression_dataset: TensorDataset,
    monkeypatch: pytest.MonkeyPatch,
    replacement: str,
) -> None:
    """The file accelerate reads again is swapped right after the manifest check."""
    state = saved(tmp_path / "a", regression_dataset, 1, train_dataloader_kwargs=SHUFFLED)
    other = saved(tmp_path / "b", regression_dataset, 2, train_dataloader_kwargs=SHUFFLED)
    PLANTED[0] = str(tmp_path / "planted-ran")
    options: dict[str, Any] = {"per_device_batch_size": 8, "train_dataloader_kwargs": SHUFFLED}

    def resumed() -> torch.Tensor:
        trainer = make_trainer()
        torch.manual_seed(3)  # not the saved random state
        trainer.train(regression_dataset, num_epochs=2, resume_from=state, **options)
        return flat(trainer.model)

    expected = resumed()
    verify = training_state_module.verify_training_state

    def verify_then_replace(directory: Path, *args: Any) -> dict[str, Any]:
        manifest = verify(directory, *args)
        target = directory / "random_states_0.pkl"
        if replacement == "another_state":
            shutil.copy(other / "random_states_0.pkl", target)
        else:
            target.write_bytes(pickle.dumps({"torch_manual_seed": Planted()}))
        return manifest

    monkeypatch.setattr(training_state_module, "verify_training_state", verify_then_replace)
    assert torch.equal(resumed(), expected)
    assert not Path(PLANTED[0]).exists()


# ------------------------------------------------------------------ loss module (defect 5)


class WeightedLoss(nn.Module):
    """A loss with a learnt scale (a parameter) and a count of calls (a buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.scale * nn.functional.mse_loss(outputs, targets)


def test_a_loss_module_is_saved_in_the_training_state_and_restored(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    model, loss = make_model(), WeightedLoss()
    parameters = [*model.parameters(), *loss.parameters()]
    trainer = Trainer(model, loss, torch.optim.SGD(parameters, lr=0.05), ())
    trainer.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "state")
    assert loss.calls.item() == 8
    assert loss.scale.item() != 1.0
    restored = WeightedLoss()
    model = make_model()
    fresh = Trainer(
        model, restored, torch.optim.SGD([*model.parameters(), *restored.parameters()]), ()
    )
    fresh.load_training_state(tmp_path / "state")
    assert restored.calls.item() == 8
    assert restored.scale.item() == loss.scale.item()


# ------------------------------------------- sharded states: DCP's .metadata is a pickle


def as_sharded_state(state: Path) -> None:
    """Rewrite a state's model and optimizer as DCP's folders, as FSDP2 saves them sharded."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    model = load_file(state / "model.safetensors")
    optimizer = torch.load(state / "optimizer.bin", weights_only=True)
    dcp.save({"model": model}, checkpoint_id=state / "pytorch_model_fsdp_0")
    dcp.save({"optimizer": optimizer}, checkpoint_id=state / "optimizer_0")
    for name in ("model.safetensors", "optimizer.bin", MANIFEST_NAME):
        (state / name).unlink()
    write_manifest(state, {"world_size": 1, "saved_at_ns": 0})


def test_a_sharded_state_loads_its_model_and_optimizer_through_dcp(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    trainer = make_trainer(optimizer_class=torch.optim.AdamW)
    trainer.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "state")
    as_sharded_state(tmp_path / "state")
    loaded = make_trainer(make_model(seed=1), optimizer_class=torch.optim.AdamW)
    loaded.load_training_state(tmp_path / "state")
    assert torch.equal(flat(loaded.model), flat(trainer.model))
    saved, restored = trainer.optimizer.state_dict(), loaded.optimizer.state_dict()
    for key, value in saved["state"].items():
        assert torch.equal(restored["state"][key]["exp_avg_sq"], value["exp_avg_sq"])


@pytest.mark.bad_input
def test_a_planted_pickle_in_dcps_metadata_is_refused_without_running_it(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    state = saved(tmp_path, regression_dataset)
    as_sharded_state(state)
    PLANTED[0] = str(tmp_path / "planted-ran")
    (state / "pytorch_model_fsdp_0" / ".metadata").write_bytes(pickle.dumps(Planted()))
    (state / MANIFEST_NAME).unlink()
    write_manifest(state, {"world_size": 1, "saved_at_ns": 0})  # listed, as a forgery would
    with pytest.raises(TrainingStateError, match=r"which is not one of DCP's metadata classes"):
        make_trainer().load_training_state(state)
    assert not Path(PLANTED[0]).exists()


def test_dcps_metadata_changed_after_the_save_is_refused(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    state = saved(tmp_path, regression_dataset)
    as_sharded_state(state)
    with (state / "pytorch_model_fsdp_0" / ".metadata").open("ab") as handle:
        handle.write(b"\x00")
    with pytest.raises(TrainingStateError, match=r"\.metadata' is truncated or was changed"):
        make_trainer().load_training_state(state)
