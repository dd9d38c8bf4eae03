"""Events around saves and loads: a callback adds files to training states, entries to checkpoints.

``on_save_training_state`` fires before the manifest is written, so a file a callback writes
into the state (a model card) is covered by its digests, blocking or in the background;
``on_load_training_state`` fires after a load or a resume; ``on_save_checkpoint`` and
``on_load_checkpoint`` see the checkpoint dict. The 2-process behaviour is in
``tests/distributed/test_checkpoint_events_2proc.py``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch
from helpers import clone_params, make_trainer
from torch import nn
from torch.utils.data import TensorDataset

import pytorch_accel.events
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.events import BUILTIN_EVENTS
from pytorch_accel.training_state import MANIFEST_NAME, TrainingStateError, find_training_states

SAVE_LOAD_EVENTS = (
    "on_save_training_state",
    "on_load_training_state",
    "on_save_checkpoint",
    "on_load_checkpoint",
)


class ModelCard(TrainerCallback):
    """Writes README.md into every training state; records the save and load events.

    It draws random numbers in both events: the run's random states must not change (the
    state was saved before, and a resumed run continues from it).
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_save_training_state(
        self, trainer: Any, directory: Path, output_dir: Path, **kwargs: Any
    ) -> None:
        assert directory.is_dir()
        assert directory.name == f".{output_dir.name}.incomplete"
        torch.rand(3), random.random(), numpy.random.rand()
        card = f"# {output_dir.name}\n\nupdates: {trainer.global_num_updates}\n"
        (directory / "README.md").write_text(card, encoding="utf-8")
        self.events.append(("on_save_training_state", output_dir.name))

    def on_load_training_state(self, trainer: Any, directory: Path, **kwargs: Any) -> None:
        torch.rand(5), random.random(), numpy.random.rand()  # not what the save drew
        card = (directory / "README.md").read_text(encoding="utf-8")
        self.events.append(("on_load_training_state", card.splitlines()[0]))

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.events.append(("on_training_run_start", None))


def train(
    save_dir: Path, dataset: TensorDataset, *callbacks: Any, async_save: bool = False, **kw: Any
) -> Any:
    saver = SaveTrainingStateCallback(
        save_dir, save_every_n_steps=4, save_at_end=False, async_save=async_save
    )
    torch.manual_seed(0)  # dropout: the run draws from the global random state
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Tanh(), nn.Linear(8, 1))
    trainer = make_trainer(model, (saver, *callbacks), optimizer_class=torch.optim.AdamW)
    trainer.train(dataset, num_epochs=2, per_device_batch_size=8, **kw)
    return trainer


def test_the_events_are_declared_and_documented() -> None:
    doc = pytorch_accel.events.__doc__ or ""
    listing = doc.split("Saving and loading fire", 1)[1].split("\n\n", 2)[1]
    fired = [*SAVE_LOAD_EVENTS[:2], "on_load_training_state", "on_training_run_start"]
    assert re.findall(r"\bon_\w+", listing) == [*fired, *SAVE_LOAD_EVENTS[2:]]
    for event in SAVE_LOAD_EVENTS:
        assert event in BUILTIN_EVENTS
        assert f"``{event}`` receives" in doc


@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "background"])
def test_a_model_card_is_written_into_every_state_covered_by_its_manifest(
    tmp_path: Path, regression_dataset: TensorDataset, async_save: bool
) -> None:
    card = ModelCard()
    straight = train(tmp_path / "states", regression_dataset, card, async_save=async_save)
    states = find_training_states(tmp_path / "states")
    names = [f"updates-{n:08d}" for n in (4, 8, 12, 16)]
    assert [state.name for state in states] == names
    assert card.events == [
        ("on_training_run_start", None),
        *(("on_save_training_state", name) for name in names),
    ]
    for state, updates in zip(states, (4, 8, 12, 16), strict=True):
        text = (state / "README.md").read_text(encoding="utf-8")
        assert text == f"# {state.name}\n\nupdates: {updates}\n"
        listed = json.loads((state / MANIFEST_NAME).read_text())["files"]
        assert "README.md" in listed
    assert not list((tmp_path / "states").glob(".*"))

    # resumed mid-epoch with the card callback: the same weights as the run straight through
    resumed_card = ModelCard()
    resumed = train(
        tmp_path / "resumed",
        regression_dataset,
        resumed_card,
        resume_from=states[0],
        async_save=async_save,
    )
    assert resumed_card.events[:2] == [
        ("on_load_training_state", f"# {names[0]}"),
        ("on_training_run_start", None),
    ]
    for own, reference in zip(
        clone_params(resumed.model), clone_params(straight.model), strict=True
    ):
        assert torch.equal(own, reference)


def test_a_changed_card_makes_the_state_refused_on_resume(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    train(tmp_path / "states", regression_dataset, ModelCard())
    state = find_training_states(tmp_path / "states")[-1]
    (state / "README.md").write_text("# tampered\n", encoding="utf-8")
    with pytest.raises(TrainingStateError, match=r"README\.md' is (truncated|corrupt)"):
        make_trainer(callbacks=(ModelCard(),)).train(
            regression_dataset, num_epochs=3, per_device_batch_size=8, resume_from=state
        )


def test_load_training_state_fires_the_load_event(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    card = ModelCard()
    trainer = make_trainer(callbacks=(card,))
    trainer.save_training_state(tmp_path / "state")  # outside train(): blocking
    assert (tmp_path / "state" / "README.md").read_text().startswith("# state\n")
    trainer.load_training_state(tmp_path / "state")
    assert card.events == [
        ("on_save_training_state", "state"),
        ("on_load_training_state", "# state"),
    ]


class FailingCard(TrainerCallback):
    def on_save_training_state(self, trainer: Any, directory: Path, **kwargs: Any) -> None:
        (directory / "partial.txt").write_text("half")
        raise RuntimeError("the model card could not be written")


def test_an_error_in_the_save_event_abandons_the_save_and_keeps_the_old_state(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    trainer = make_trainer()
    trainer.save_training_state(tmp_path / "state")
    before = (tmp_path / "state" / MANIFEST_NAME).read_bytes()
    trainer.callback_handler.add_callback(FailingCard())
    with pytest.raises(RuntimeError, match="the model card could not be written"):
        trainer.save_training_state(tmp_path / "state")
    assert (tmp_path / "state" / MANIFEST_NAME).read_bytes() == before
    assert not (tmp_path / "state" / "partial.txt").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["state"]


def test_an_error_in_the_save_event_of_a_background_save_is_raised_by_train(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    with pytest.raises(RuntimeError, match="the model card could not be written"):
        train(tmp_path / "states", regression_dataset, FailingCard(), async_save=True)
    assert find_training_states(tmp_path / "states") == []
    assert not list((tmp_path / "states").glob(".*"))


class CheckpointCard(TrainerCallback):
    """Adds an entry to every checkpoint and reads it back after a load."""

    def __init__(self) -> None:
        self.loaded: list[tuple[Any, str]] = []

    def on_save_checkpoint(
        self, trainer: Any, checkpoint: dict[str, Any], path: Path, **kwargs: Any
    ) -> None:
        assert "model_state_dict" in checkpoint
        assert checkpoint["note"] == "mine"
        checkpoint["card"] = {"file": path.name, "updates": trainer.global_num_updates}

    def on_load_checkpoint(
        self, trainer: Any, checkpoint: dict[str, Any], path: Path, **kwargs: Any
    ) -> None:
        self.loaded.append((checkpoint["card"], path.name))


def test_a_callback_adds_an_entry_to_a_checkpoint_and_reads_it_back(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    card = CheckpointCard()
    trainer = make_trainer(callbacks=(card,))
    trainer.train(regression_dataset, num_epochs=1, per_device_batch_size=8)
    trainer.save_checkpoint(tmp_path / "model.pt", {"note": "mine"})
    saved = torch.load(tmp_path / "model.pt", weights_only=True)
    assert saved["card"] == {"file": "model.pt", "updates": 8}
    assert saved["note"] == "mine"

    other = CheckpointCard()
    fresh = make_trainer(callbacks=(other,))
    loaded = fresh.load_checkpoint(tmp_path / "model.pt")
    assert other.loaded == [({"file": "model.pt", "updates": 8}, "model.pt")]
    assert loaded["card"] == saved["card"]
    for own, reference in zip(fresh.model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(own, reference)


class UnsafeEntry(TrainerCallback):
    def on_save_checkpoint(self, trainer: Any, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        checkpoint["where"] = Path("somewhere")


@pytest.mark.bad_input
def test_an_entry_a_callback_adds_that_would_not_load_safely_is_refused(tmp_path: Path) -> None:
    trainer = make_trainer(callbacks=(UnsafeEntry(),))
    with pytest.raises(
        TypeError,
        match=r"save_checkpoint: the entry 'where' a callback's on_save_checkpoint added is a "
        r"PosixPath, which load_checkpoint could not read back safely .*str\(path\)",
    ):
        trainer.save_checkpoint(tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()


class LinkingCard(TrainerCallback):
    def __init__(self, target: Path) -> None:
        self.target = target

    def on_save_training_state(self, trainer: Any, directory: Path, **kwargs: Any) -> None:
        (directory / "README.md").symlink_to(self.target)


@pytest.mark.bad_input
def test_a_link_written_into_a_state_is_refused_at_the_save(tmp_path: Path) -> None:
    outside = tmp_path / "card.md"
    outside.write_text("# elsewhere\n")
    trainer = make_trainer(callbacks=(LinkingCard(outside),))
    with pytest.raises(
        TrainingStateError,
        match=r"save_training_state: '.*README\.md' is a symbolic link, and a training state "
        r"holds files only .* Write the file itself",
    ):
        trainer.save_training_state(tmp_path / "state")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["card.md"]
    assert outside.read_text() == "# elsewhere\n"
