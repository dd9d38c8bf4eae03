"""Training states of a PEFT (LoRA) model hold its adapter and optimizer state only (issue 42).

A LoRA model's frozen base is the one the user builds again: a training state of it holds the
trainable parameters (``model.safetensors``) and the optimizer's state, its manifest says so
(``model_state``), and resuming from it mid-run gives the uninterrupted run's weights bitwise.
A plain model's state still holds the whole model, and a state whose adapter is not the
model's is refused before anything is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import TokenDataset, VariableLengthTokens, make_tiny_bert, make_tiny_gpt2
from safetensors.torch import load_file, save_model
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import SaveTrainingStateCallback
from pytorch_accel.training_state import MANIFEST_NAME, TrainingStateError

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

CASES = {  # name: (make the base model, LoRA task type, target modules, dataset)
    "bert": (make_tiny_bert, "SEQ_CLS", ["query", "value"], lambda: TokenDataset(16)),
    "gpt2": (make_tiny_gpt2, "CAUSAL_LM", ["c_attn"], lambda: VariableLengthTokens(16)),
}


def lora_model(name: str, r: int = 4, targets: list[str] | None = None) -> nn.Module:
    make_base, task_type, default_targets, _ = CASES[name]
    base = make_base()
    config = peft.LoraConfig(
        task_type=task_type, r=r, lora_alpha=8, target_modules=targets or default_targets
    )
    torch.manual_seed(1)  # the adapter's initialisation
    return peft.get_peft_model(base, config)  # type: ignore[no-any-return]


def trainer_of(model: nn.Module, *callbacks: object) -> Trainer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Trainer(model, None, optimizer, callbacks)  # type: ignore[arg-type]


def manifest(directory: Path) -> dict[str, object]:
    return json.loads((directory / MANIFEST_NAME).read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lora_state_holds_the_adapter_only_and_resumes_mid_run_bitwise(
    tmp_path: Path, name: str
) -> None:
    data = CASES[name][3]
    states = tmp_path / "states"
    saver = SaveTrainingStateCallback(
        states, save_every_n_steps=3, max_checkpoints=10, preemption_signals=()
    )
    model = lora_model(name)
    trainer_of(model, saver).train(data(), num_epochs=2, per_device_batch_size=4)
    uninterrupted = {key: value.detach().clone() for key, value in model.state_dict().items()}

    state = states / "updates-00000003"  # mid-epoch 1 (4 batches an epoch)
    saved = load_file(state / "model.safetensors")
    trainable = {key for key, value in model.named_parameters() if value.requires_grad}
    assert set(saved) == trainable
    assert any("lora_" in key for key in saved)
    assert manifest(state)["model_state"] == "trainable parameters only"
    optimizer_state = torch.load(state / "optimizer.bin", weights_only=True)
    assert set(optimizer_state["state"]) == trainable
    full = tmp_path / "full.safetensors"
    save_model(model, str(full))  # the whole model, as its state held it before
    adapter_size = (state / "model.safetensors").stat().st_size
    print(f"{name}: adapter state {adapter_size} bytes, full model {full.stat().st_size} bytes")
    assert adapter_size < full.stat().st_size / 4

    resumed = lora_model(name)  # the same base, built again
    trainer_of(resumed).train(data(), num_epochs=2, per_device_batch_size=4, resume_from=state)
    for key, value in resumed.state_dict().items():
        assert torch.equal(value, uninterrupted[key]), key


def test_a_plain_models_state_still_holds_the_whole_model(tmp_path: Path) -> None:
    model = make_tiny_gpt2()
    for parameter in model.transformer.h.parameters():  # type: ignore[union-attr]
        parameter.requires_grad_(False)  # frozen, but no PEFT model: saved all the same
    trainer = trainer_of(model)
    trainer.train(VariableLengthTokens(16), num_epochs=1, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "state")
    saved = load_file(tmp_path / "state" / "model.safetensors")
    tied = {"lm_head.weight", "transformer.wte.weight"}  # saved once
    assert set(saved) - tied == set(model.state_dict()) - tied
    assert set(saved) & tied
    assert "model_state" not in manifest(tmp_path / "state")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("other", "problem"),
    [
        (lambda: lora_model("gpt2", r=8), r"lora_A.default.weight: saved \[4, 16\], model \[8"),
        (lambda: lora_model("gpt2", targets=["c_proj"]), "unexpected .*c_attn.lora_A"),
        (make_tiny_gpt2, "unexpected .*lora_A"),
    ],
)
def test_an_adapter_state_into_a_model_without_that_adapter_is_refused(
    tmp_path: Path, other: object, problem: str
) -> None:
    model = lora_model("gpt2")
    trainer = trainer_of(model)
    trainer.train(VariableLengthTokens(16), num_epochs=1, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "state")
    target = other()  # type: ignore[operator]
    before = {key: value.clone() for key, value in target.state_dict().items()}
    with pytest.raises(TrainingStateError, match="trainable \\(adapter\\) parameters of a PEFT"):
        trainer_of(target).load_training_state(tmp_path / "state")
    with pytest.raises(TrainingStateError, match=problem):
        trainer_of(target).load_training_state(tmp_path / "state")
    for key, value in target.state_dict().items():
        assert torch.equal(value, before[key]), key  # nothing loaded
