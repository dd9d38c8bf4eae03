"""PEFT (LoRA) models through the default steps, exported as an adapter only.

A LoRA-wrapped tiny BERT (sequence classification) and tiny GPT-2 (causal language model),
built from configs, train with no subclass: only the adapter (and the modules PEFT saves with
it) changes. ``Trainer.save_model`` writes the adapter only (``PeftModel.save_pretrained``),
which ``PeftModel.from_pretrained`` loads back onto the base model in a fresh process, giving
the trained model's logits (1e-6).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import TokenDataset, VariableLengthTokens, make_tiny_bert, make_tiny_gpt2
from torch import nn

from pytorch_accel import Trainer

peft = pytest.importorskip("peft")
pytest.importorskip("transformers")

LOAD_ADAPTER = """
import sys, torch
import transformers
from peft import PeftModel
auto = getattr(transformers, sys.argv[1])
base = auto.from_pretrained(sys.argv[2])
model = PeftModel.from_pretrained(base, sys.argv[3]).eval()
saved = torch.load(sys.argv[4])
with torch.no_grad():
    logits = model(input_ids=saved["inputs"], attention_mask=saved["mask"]).logits
torch.testing.assert_close(logits, saved["expected"], rtol=0, atol=1e-6)
print("same logits")
"""

CASES = {
    # name: (make the base model, LoRA task type, target modules, dataset, Auto class)
    "bert": (
        make_tiny_bert,
        "SEQ_CLS",
        ["query", "value"],
        lambda: TokenDataset(16),
        "AutoModelForSequenceClassification",
    ),
    "gpt2": (
        make_tiny_gpt2,
        "CAUSAL_LM",
        ["c_attn"],
        lambda: VariableLengthTokens(16),
        "AutoModelForCausalLM",
    ),
}


def lora(base: nn.Module, task_type: str, targets: list[str]) -> nn.Module:
    config = peft.LoraConfig(task_type=task_type, r=4, lora_alpha=8, target_modules=targets)
    return peft.get_peft_model(base, config)  # type: ignore[no-any-return]


def file_sizes(directory: Path) -> dict[str, int]:
    return {path.name: path.stat().st_size for path in directory.iterdir()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_lora_model_trains_its_adapter_and_exports_it_for_peft_from_pretrained(
    tmp_path: Path, name: str
) -> None:
    make_base, task_type, targets, make_data, auto_class = CASES[name]
    base = make_base()
    base.save_pretrained(tmp_path / "base")  # type: ignore[operator]
    model = lora(base, task_type, targets)
    before = {key: value.clone() for key, value in model.named_parameters()}
    trainer = Trainer(model, None, torch.optim.AdamW(model.parameters(), lr=1e-2), ())

    trainer.train(make_data(), num_epochs=2, per_device_batch_size=8)

    params = dict(model.named_parameters())
    changed = {key for key, value in params.items() if not torch.equal(value, before[key])}
    assert changed == {key for key, value in params.items() if value.requires_grad}
    assert any("lora_" in key for key in changed)
    data = make_data()
    inputs, mask = data.input_ids[:6], torch.ones_like(data.input_ids[:6])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=inputs, attention_mask=mask).logits
    torch.save({"inputs": inputs, "mask": mask, "expected": expected}, tmp_path / "expected.pt")

    trainer.save_model(tmp_path / "adapter")

    adapter = file_sizes(tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(adapter)
    assert "model.safetensors" not in adapter
    full = file_sizes(tmp_path / "base")["model.safetensors"]
    assert adapter["adapter_model.safetensors"] < full / 2
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(LOAD_ADAPTER),
            auto_class,
            str(tmp_path / "base"),
            str(tmp_path / "adapter"),
            str(tmp_path / "expected.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "same logits" in done.stdout, done.stdout + done.stderr
