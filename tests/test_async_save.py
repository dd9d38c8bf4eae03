"""Training states written in the background: the same states, published, errors raised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_trainer
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel._checkpointing.store import verify_training_state
from pytorch_accel.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accel.training_state import MANIFEST_NAME, find_training_states


def run(save_dir: Path, dataset: TensorDataset, async_save: bool, *extra: Any) -> Trainer:
    saver = SaveTrainingStateCallback(
        save_dir, save_every_n_steps=2, save_at_end=False, async_save=async_save
    )
    trainer = make_trainer(
        make_model(), callbacks=(saver, *extra), optimizer_class=torch.optim.AdamW
    )
    trainer.train(dataset, num_epochs=2, per_device_batch_size=8)
    return trainer


def digests(state: Path) -> dict[str, Any]:
    """The weights', optimizer's and random states' digests (the same bytes, the same digest)."""
    files = json.loads((state / MANIFEST_NAME).read_text())["files"]
    return {name: files[name] for name in files if not name.startswith(("custom", "trainer"))}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def test_background_saves_write_the_states_blocking_saves_write(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    """Byte for byte (same digests), though training changed the weights while they were
    written: the state is the one of the step it was saved at, and every save completed
    before train() returned."""
    blocking = run(tmp_path / "blocking", regression_dataset, False)
    background = run(tmp_path / "background", regression_dataset, True)
    names = [state.name for state in find_training_states(tmp_path / "blocking")]
    assert names == [f"updates-{n:08d}" for n in range(2, 17, 2)]
    assert [state.name for state in find_training_states(tmp_path / "background")] == names
    for name in names:
        verify_training_state(tmp_path / "background" / name, 1, "test")
        assert digests(tmp_path / "background" / name) == digests(tmp_path / "blocking" / name)
        for part in ("trainer_rank_0.pt", "custom_checkpoint_0.pkl"):
            saved = [
                torch.load(tmp_path / kind / name / part) for kind in ("background", "blocking")
            ]
            assert same(*saved), part
    assert not list((tmp_path / "background").glob(".*"))  # nothing left half-written
    for own, reference in zip(
        background.model.parameters(), blocking.model.parameters(), strict=True
    ):
        assert torch.equal(own, reference)


def test_a_background_save_is_published_at_a_later_step_boundary(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    seen: list[tuple[int, list[str]]] = []

    class Watch(TrainerCallback):
        order = 2000  # after the saver

        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            states = find_training_states(tmp_path / "states")
            seen.append((trainer.num_updates, [state.name for state in states]))

    run(tmp_path / "states", regression_dataset, True, Watch())
    assert seen[1] == (2, [])  # saved at update 2, not yet published at its step's end
    # published after a later step (once written), at the latest when the next save waits
    assert seen[3] == (4, ["updates-00000002"])


class Unsafe:
    """An object a training state cannot hold (it would not load with weights_only)."""


class UnsafeState(TrainerCallback):
    def state_dict(self) -> dict[str, Any]:
        return {"thing": Unsafe()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


def test_an_error_of_a_background_write_is_raised_in_the_training_thread(
    tmp_path: Path, regression_dataset: TensorDataset
) -> None:
    with pytest.raises(TypeError, match="cannot be loaded safely"):
        run(tmp_path / "states", regression_dataset, True, UnsafeState())
    assert find_training_states(tmp_path / "states") == []
    assert not list((tmp_path / "states").glob(".*"))  # the partial save was removed


def test_weights_are_streamed_in_the_bytes_safetensors_writes() -> None:
    """The streamed writer gives safetensors' own bytes (its order and header), so the
    weights load with safetensors and accelerate as before."""
    import io

    from safetensors.torch import save

    from pytorch_accel._checkpointing.staging import write_safetensors

    tensors = {
        "b.weight": torch.randn(3, 2),
        "a.half": torch.randn(5).half(),
        "c.bf16": torch.randn(2, 2).bfloat16(),
        "d.steps": torch.tensor(7),
        "e.empty": torch.zeros(0, 4),
        "f.mask": torch.tensor([True, False]),
    }
    handle = io.BytesIO()
    write_safetensors(tensors, handle)
    assert handle.getvalue() == save(tensors, metadata={"format": "pt"})
