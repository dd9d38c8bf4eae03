"""A LoRA model (PEFT) under FSDP2 in a gloo process group, against the same run under DDP.

``python fsdp_lora.py OUT_DIR``: a LoRA-wrapped tiny GPT-2 trains under 2-process DDP and
under FSDP2 (``Trainer(accelerator_kwargs={"fsdp_plugin": ...})``) on the same batches; the
trained adapters are compared, the frozen base must not change, ``save_model`` writes the
adapter only, a training state saved after the first epoch (FSDP's own writer, with a file
per process written by ``on_save_training_state``) resumes to the same adapter as the run
straight through (so does a DDP state, which holds the adapter only); a callback failing in
that event on one process abandons the save on both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import peft
import torch
from accelerate import FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, GradientState, PartialState
from accelerate.utils import DistributedType
from common import report_and_exit
from helpers import VariableLengthTokens, make_tiny_gpt2
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback

OPTIONS: dict[str, Any] = {
    "num_epochs": 2,
    "per_device_batch_size": 4,
    "train_dataloader_kwargs": {"shuffle": False},
}


def reset_state() -> None:
    """Let a new accelerator choose its run type again (the process group stays)."""
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    if PartialState._shared_state:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU


class RankCard(TrainerCallback):
    def on_save_training_state(self, trainer: Any, directory: Path, **kwargs: Any) -> None:
        rank = trainer.accelerator.process_index
        (directory / f"card_rank{rank}.txt").write_text(str(trainer.global_num_updates))


class FailingOnRank1(TrainerCallback):
    def on_save_training_state(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.accelerator.process_index == 1:
            raise RuntimeError("no card on rank 1")


def lora_trainer(fsdp: bool, *callbacks: Any) -> Trainer:
    reset_state()
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    config = peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["c_attn"])
    model = peft.get_peft_model(make_tiny_gpt2(), config)
    kwargs = {"fsdp_plugin": FullyShardedDataParallelPlugin(fsdp_version=2)} if fsdp else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Trainer(model, None, optimizer, callbacks, accelerator_kwargs=kwargs)


def full_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The model's whole state, gathered where sharded, by name."""
    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(trainer.model, options=options)
    return {key.removeprefix("module."): value.detach().clone() for key, value in state.items()}


def difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())[:4]
    return max((first[key] - second[key]).abs().max().item() for key in first)


def main() -> None:
    out = Path(sys.argv[1])
    data = VariableLengthTokens(32)
    results: dict[str, Any] = {}

    ddp = lora_trainer(False)
    before = full_state(ddp)
    ddp.train(data, **OPTIONS)
    ddp_after = full_state(ddp)

    # under DDP a training state holds the adapter only (issue 42), and resumes to the same run
    half = lora_trainer(False)
    half.train(data, **{**OPTIONS, "num_epochs": 1})
    half.save_training_state(out / "ddp_state")
    results["ddp_state_keys"] = sorted(load_file(out / "ddp_state" / "model.safetensors"))
    ddp_resumed = lora_trainer(False)
    ddp_resumed.train(data, **OPTIONS, resume_from=out / "ddp_state")
    results["ddp_resumed_vs_straight"] = difference(full_state(ddp_resumed), ddp_after)

    fsdp = lora_trainer(True)
    results["type"] = str(fsdp.accelerator.distributed_type)
    fsdp.train(data, **OPTIONS)
    results["sharded"] = all(isinstance(p, DTensor) for p in fsdp.model.parameters())
    fsdp_after = full_state(fsdp)
    lora = {key for key in fsdp_after if "lora_" in key}
    results["lora_keys"] = len(lora)
    results["ddp_state_is_adapter"] = results.pop("ddp_state_keys") == sorted(lora)
    results["fsdp_vs_ddp"] = difference(fsdp_after, ddp_after)
    results["adapter_moved"] = max((fsdp_after[k] - before[k]).abs().max().item() for k in lora)
    frozen = {key for key in fsdp_after if key not in lora}
    results["base_moved"] = max((fsdp_after[k] - before[k]).abs().max().item() for k in frozen)
    results["loss"] = fsdp.run_history.get_latest_metric("train_loss_epoch")

    exported = fsdp.save_model(out / "adapter")
    results["exported"] = sorted(path.name for path in exported.iterdir())
    adapter = load_file(exported / "adapter_model.safetensors")
    trained = {key.replace(".default.", "."): fsdp_after[key] for key in lora}
    results["exported_equal"] = adapter.keys() == trained.keys() and all(
        torch.equal(adapter[key], trained[key]) for key in adapter
    )

    # a training state saved after the first epoch resumes to the run straight through
    first = lora_trainer(True, RankCard())
    first.train(data, **{**OPTIONS, "num_epochs": 1})
    first.save_training_state(out / "state")
    results["state_files"] = sorted(
        path.name for path in (out / "state").iterdir() if path.name.startswith("card_")
    )
    resumed = lora_trainer(True, RankCard())
    resumed.train(data, **OPTIONS, resume_from=out / "state")
    results["resumed_vs_straight"] = difference(full_state(resumed), fsdp_after)

    # a callback failing on one process abandons FSDP's save on every process, without a hang
    failing = lora_trainer(True, FailingOnRank1())
    try:
        failing.save_training_state(out / "failed")
        results["failed"] = "saved"
    except Exception as error:
        results["failed"] = f"{type(error).__name__}: {error}"
    failing.accelerator.wait_for_everyone()
    results["failed_left"] = sorted(path.name for path in out.iterdir() if "failed" in path.name)
    report_and_exit(results)


if __name__ == "__main__":
    main()
