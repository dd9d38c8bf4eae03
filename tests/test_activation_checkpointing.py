"""``pytorch_accel.memory.enable_activation_checkpointing``: same gradients, less memory.

A Hugging Face model through its own method (tiny GPT-2) and a plain model by block class
give the gradients they give without checkpointing (1e-6; dropout's random states are
replayed), with each block run twice; a trainer trains the checkpointed model to the same
weights; and the peak memory of a forward and backward pass, measured as the growth of the
process's peak resident set size in a fresh process (``VmHWM`` of ``/proc/self/status``, reset
through ``/proc/self/clear_refs`` before the pass), is lower.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import VariableLengthTokens, make_tiny_gpt2
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.memory import enable_activation_checkpointing

ROOT = Path(__file__).resolve().parent.parent


class Block(nn.Module):
    """A residual MLP block with dropout: its activations are what checkpointing drops."""

    def __init__(self, dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.down(nn.functional.gelu(self.up(x))))


def make_stack(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), Block(), Block(), nn.Linear(8, 1))


def count_forwards(modules: list[nn.Module]) -> list[int]:
    """Count the calls of ``modules`` (started: a recomputation stops once it has what it needs)."""
    calls = [0]

    def hook(*_: object) -> None:
        calls[0] += 1

    for module in modules:
        module.register_forward_pre_hook(hook)
    return calls


def gradients(model: nn.Module, loss_of: object) -> dict[str, torch.Tensor]:
    model.train()
    torch.manual_seed(1)  # the same dropout masks with and without
    loss_of(model).backward()  # type: ignore[operator]
    return {name: param.grad.clone() for name, param in model.named_parameters()}  # type: ignore[union-attr]


def test_a_hugging_face_model_checkpoints_through_its_own_method_with_the_same_gradients() -> None:
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    batch = VariableLengthTokens(4)[:4]
    batch = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    plain, checkpointed = make_tiny_gpt2(), make_tiny_gpt2()
    assert enable_activation_checkpointing(checkpointed) == []
    calls = count_forwards([m for m in checkpointed.modules() if isinstance(m, GPT2Attention)])

    expected = gradients(plain, lambda model: model(**batch).loss)
    got = gradients(checkpointed, lambda model: model(**batch).loss)

    assert calls[0] == 2  # one block: run forward, then again in the backward pass
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=1e-6, msg=name)


def test_a_plain_model_checkpoints_by_block_class_with_the_same_gradients() -> None:
    inputs = torch.randn(6, 4)
    plain, checkpointed = make_stack(), make_stack()
    names = [name for name, _ in checkpointed.named_parameters()]

    assert enable_activation_checkpointing(checkpointed, modules=Block) == ["1", "2"]
    assert enable_activation_checkpointing(checkpointed, modules=[Block]) == ["1", "2"]  # once
    calls = count_forwards([checkpointed[1].up, checkpointed[2].up])
    expected = gradients(plain, lambda model: model(inputs).square().mean())
    got = gradients(checkpointed, lambda model: model(inputs).square().mean())

    assert calls[0] == 4  # two blocks, each run twice
    assert [name for name, _ in checkpointed.named_parameters()] == names
    assert isinstance(checkpointed[1], Block)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=1e-6, msg=name)
    with torch.no_grad():  # evaluation runs each block once
        checkpointed(inputs)
    assert calls[0] == 6


def test_a_trainer_trains_a_checkpointed_model_to_the_same_weights() -> None:
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    weights = []
    for enable in (False, True):
        model = make_stack()
        if enable:
            enable_activation_checkpointing(model, modules=(Block,))
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
        torch.manual_seed(3)
        trainer.train(data, num_epochs=2, per_device_batch_size=4)
        weights.append(dict(model.named_parameters()))
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=0, atol=1e-6, msg=name)


@pytest.mark.bad_input
def test_bad_arguments_are_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"modules=.*must be nn.Module subclasses"):
        enable_activation_checkpointing(make_stack(), modules=(int,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"no module of the model is a Embedding.*pass the"):
        enable_activation_checkpointing(make_stack(), modules=nn.Embedding)
    with pytest.raises(ValueError, match=r"Sequential has no checkpointing method.*modules="):
        enable_activation_checkpointing(make_stack())


PEAK_MEMORY = """
import sys, torch
from torch import nn
from pytorch_accel.memory import enable_activation_checkpointing

def status(field):  # kB
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(field))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 1024), nn.Linear(1024, 256)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))

torch.manual_seed(0)
model = nn.Sequential(*[Block() for _ in range(16)])
inputs = torch.randn(1024, 256)
if sys.argv[1] == "on":
    enable_activation_checkpointing(model, modules=Block)
model(inputs[:8]).sum().backward()  # first calls load code and allocate the gradients
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # the peak resident set size starts again from the current one
before = status("VmRSS:")
model(inputs).square().mean().backward()
print((status("VmHWM:") - before) / 1024)  # MiB
"""


def peak_growth_mib(mode: str) -> float:
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
        "MALLOC_MMAP_THRESHOLD_": "65536",  # large blocks back to the system when freed
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEAK_MEMORY), mode],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's /proc only")
def test_checkpointing_lowers_the_peak_memory_of_a_forward_and_backward_pass() -> None:
    # 16 blocks, batch 1024: each keeps ~9 MiB of activations without checkpointing, ~1 MiB
    # (its input) with (measured here: ~150 MiB without, ~35 MiB with)
    without, with_checkpointing = peak_growth_mib("off"), peak_growth_mib("on")
    assert with_checkpointing < 0.5 * without, (with_checkpointing, without)
