"""torch.compile through accelerate's dynamo plugin: clean checkpoint keys, exact resume.

Compiling with inductor on the CPU takes tens of seconds, so one small model is compiled by
two trainers (the second reuses inductor's cache) and the file is marked ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import clone_params, make_model, make_regression_dataset, make_trainer
from safetensors import safe_open

from pytorch_accel.callbacks import SaveTrainingStateCallback

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    """Compile for real in each test: earlier tests may have used up dynamo's recompile limit."""
    torch._dynamo.reset()


KEYS = ["0.bias", "0.weight", "2.bias", "2.weight"]
SETTINGS = {"num_epochs": 2, "per_device_batch_size": 4}


def test_a_model_compiled_by_accelerate_saves_clean_keys_and_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "ACCELERATE_DYNAMO_BACKEND", "INDUCTOR"
    )  # accelerate launch --dynamo_backend
    data = make_regression_dataset(64)
    saver = SaveTrainingStateCallback(tmp_path / "states", save_every_n_epochs=1)
    compiled = make_trainer(callbacks=(saver,))
    compiled.train(data, **SETTINGS)
    assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
    compiled.save_checkpoint(tmp_path / "model.pt")
    checkpoint = torch.load(tmp_path / "model.pt", weights_only=True)
    assert sorted(checkpoint["model_state_dict"]) == KEYS
    state = tmp_path / "states" / "epoch-0001"
    with safe_open(str(state / "model.safetensors"), framework="pt") as handle:
        assert sorted(handle.keys()) == KEYS

    resumed = make_trainer()
    resumed.train(data, **SETTINGS, resume_from=state)
    assert isinstance(resumed.model, torch._dynamo.eval_frame.OptimizedModule)
    for a, b in zip(clone_params(resumed.model), clone_params(compiled.model), strict=True):
        assert torch.equal(a, b)

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "NO")
    eager = make_trainer(make_model(seed=5))
    eager.load_checkpoint(tmp_path / "model.pt")  # clean keys load into an uncompiled model
    for a, b in zip(clone_params(eager.model), clone_params(compiled.model), strict=True):
        assert torch.equal(a, b)
    eager.train(data, **SETTINGS, resume_from=state)  # and so does the training state
    assert eager.num_updates == 32


def test_a_model_compiled_by_hand_saves_clean_keys_both_ways(tmp_path: Path) -> None:
    data = make_regression_dataset(64)
    by_hand = make_trainer(torch.compile(make_model()))  # type: ignore[arg-type]
    by_hand.train(data, num_epochs=1, per_device_batch_size=4)
    by_hand.save_training_state(tmp_path / "state")
    with safe_open(str(tmp_path / "state" / "model.safetensors"), framework="pt") as handle:
        assert sorted(handle.keys()) == KEYS
    eager = make_trainer(make_model(seed=5))
    eager.train(data, **SETTINGS, resume_from=tmp_path / "state")
    eager.save_training_state(tmp_path / "eager-state")
    again = make_trainer(torch.compile(make_model(seed=6)))  # type: ignore[arg-type]
    again.train(data, **SETTINGS, resume_from=tmp_path / "state")
    for a, b in zip(clone_params(again.model), clone_params(eager.model), strict=True):
        assert torch.allclose(a, b, atol=1e-6)  # eager and inductor kernels may round apart
    compiled_from_eager = make_trainer(torch.compile(make_model(seed=7)))  # type: ignore[arg-type]
    compiled_from_eager.train(
        data, num_epochs=3, per_device_batch_size=4, resume_from=tmp_path / "eager-state"
    )
    assert compiled_from_eager.num_updates == 48
