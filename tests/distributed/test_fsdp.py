"""FSDP in 2 gloo processes: asked for on the CPU, sharded, trained like DDP, refused early."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_model, make_regression_dataset
from launcher import launch
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ModelEmaCallback, SaveBestModelCallback

TOLERANCE = 1e-6
UNSHUFFLED = {"shuffle": False}


def max_difference(model: nn.Module, reference: nn.Module) -> float:
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    return max((a.detach() - b.detach()).abs().max().item() for a, b in pairs)


@pytest.fixture(scope="module")
def parity(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    outcome = launch("fsdp.py", "parity", out_dir=tmp_path_factory.mktemp("fsdp"), timeout=150)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    return outcome.ranks


def test_an_fsdp_plugin_on_the_cpu_shards_the_model(parity: list[dict[str, Any]]) -> None:
    for rank in parity:
        assert rank["parity"]["ddp_type"] == "DistributedType.MULTI_CPU"
        assert rank["parity"]["fsdp_type"] == "DistributedType.FSDP"
        assert rank["parity"]["dtensors"]


def test_fsdp2_trains_evaluates_and_predicts_like_ddp(parity: list[dict[str, Any]]) -> None:
    for rank in parity:
        result = rank["parity"]
        assert result["moved"] > 0.01  # it trained
        assert result["parameters"] <= TOLERANCE
        assert result["loss"] <= TOLERANCE
        assert result["predictions"] <= TOLERANCE
        assert result["num_predictions"] == 14
    assert parity[0] == parity[1]


def test_fsdp1_with_the_original_parameters_trains_like_ddp(
    parity: list[dict[str, Any]],
) -> None:
    for rank in parity:
        result = rank["parity"]
        assert result["fsdp1_type"] == "DistributedType.FSDP"
        assert result["fsdp1_parameters"] <= TOLERANCE
        assert result["fsdp1_loss"] <= TOLERANCE
        assert result["fsdp1_predictions"] <= TOLERANCE


def test_gradient_clip_value_under_fsdp_is_refused_at_train(
    parity: list[dict[str, Any]],
) -> None:
    message = parity[0]["parity"]["clip_value_refusal"]
    assert "Trainer.train: gradient_clip_value must be None under FSDP" in message
    assert "max_grad_norm=1.0" in message


def test_fsdp_asked_for_by_the_launcher_shards_and_fsdp1_needs_original_parameters(
    tmp_path: Path,
) -> None:
    outcome = launch("fsdp.py", "env", out_dir=tmp_path, timeout=120)
    assert outcome.returncode == 0, outcome.output[-4000:]
    for rank in outcome.ranks:
        assert rank["env"]["type"] == "DistributedType.FSDP"
        assert rank["env"]["dtensors"]
        refusal = rank["env"]["fsdp1_refusal"]
        assert "use_orig_params=...) must be True under FSDP version 1" in refusal
        assert "accelerate issue 3256" in refusal


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out_dir = tmp_path_factory.mktemp("fsdp_checkpoints")
    outcome = launch("fsdp.py", "checkpoints", out_dir=out_dir, timeout=150)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 2
    ranks = [rank["checkpoints"] for rank in outcome.ranks]
    for rank in ranks:  # the FSDP2 trainers that saved, loaded and checked were sharded
        assert rank["sharded"] == ["DistributedType.FSDP"] * 3
    return ranks


def test_save_checkpoint_under_fsdp2_gathers_the_full_optimizer_state(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["saved_like_ddp"] == 0.0  # the same file as a DDP run's, bit for bit
        assert rank["optimizer_keys"] == [0, 1, 2, 3]  # numbered as unsharded


def test_load_checkpoint_into_a_sharded_model_restores_model_and_optimizer(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["round_trip"] == 0.0


def test_the_fit_check_of_a_training_state_runs_under_fsdp(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["misfit"].startswith("TrainingStateError: Trainer.load_training_state: ")
        assert "holds a different model: 0.bias: saved [8], model [6]" in rank["misfit"]


def test_a_training_state_inside_an_accumulation_window_is_refused_under_fsdp(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["saves_before_refusal"] == 1  # after the update
        assert rank["mid_window_refusal"].startswith(
            "Trainer.save_training_state: under FSDP a training state can only be saved where "
            "an accumulation window ends, but 3 batches of this epoch are done"
        )


def test_fsdp1_under_save_checkpoint_and_load_checkpoint(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["fsdp1_saved_like_ddp"] == 0.0
        assert rank["fsdp1_round_trip"] == 0.0


def test_fsdp2_resumes_bitwise_from_a_state_saved_after_an_update(
    checkpoints: list[dict[str, Any]],
) -> None:
    for rank in checkpoints:
        assert rank["resumed"] == 0.0
        assert rank["ema_resumed"] == 0.0  # ModelEmaCallback's average of this process's shards


def test_training_states_under_fsdp1_are_refused(checkpoints: list[dict[str, Any]]) -> None:
    for rank in checkpoints:
        assert rank["fsdp1_state_refusal"].startswith(
            "Trainer.save_training_state: training states are not supported under FSDP version 1"
        )


@pytest.mark.parametrize("saved_by", ["elastic_state", "fsdp_state", "fsdp_dcp_state"])
def test_a_state_of_2_processes_resumes_in_1_between_epochs(
    checkpoints: list[dict[str, Any]], saved_by: str
) -> None:
    """2 processes x batch 4 saved after epoch 1; 1 process x batch 8 trains epoch 2.

    Saved by DDP, by FSDP2 (a full state: ``pytorch_model_fsdp.bin``) and by FSDP2 with
    ``torch.distributed.checkpoint`` (``SHARDED_STATE_DICT``).
    """
    if saved_by == "fsdp_dcp_state":  # the weights and optimizer in DCP's sharded folders
        assert {"pytorch_model_fsdp_0", "optimizer_0"} <= set(checkpoints[0]["dcp_files"])
    dataset = make_regression_dataset(24)
    options: dict[str, Any] = {"per_device_batch_size": 8, "train_dataloader_kwargs": UNSHUFFLED}
    model = make_model()
    whole = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
    whole.train(dataset, num_epochs=2, **options)
    model = make_model(seed=1)  # the saved weights replace these
    resumed = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
    resumed.train(dataset, num_epochs=2, resume_from=checkpoints[0][saved_by], **options)
    assert resumed.run_history.current_epoch == whole.run_history.current_epoch
    assert max_difference(resumed.model, whole.model) <= TOLERANCE
    assert max_difference(resumed.model, make_model(seed=1)) > 0.01


@pytest.mark.parametrize("sharded", [False, True])
def test_a_state_of_1_process_resumes_in_2_between_epochs(tmp_path: Path, sharded: bool) -> None:
    """1 process x batch 8 saved after epoch 1; 2 processes x batch 4 (DDP or FSDP2) train on."""
    dataset = make_regression_dataset(24)
    options: dict[str, Any] = {"per_device_batch_size": 8, "train_dataloader_kwargs": UNSHUFFLED}
    model = make_model()
    whole = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
    whole.train(dataset, num_epochs=2, **options)
    model = make_model()
    first = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
    first.train(dataset, num_epochs=1, **options)
    first.save_training_state(tmp_path / "state")
    layout = ["fsdp"] if sharded else []
    outcome = launch(
        "fsdp.py", "grow", str(tmp_path / "state"), *layout, out_dir=tmp_path, timeout=120
    )
    assert outcome.returncode == 0, outcome.output[-4000:]
    state = whole.model.state_dict()  # in the script's order: by key
    expected = torch.cat([state[key].detach().flatten() for key in sorted(state)])
    for rank in outcome.ranks:
        assert rank["grow"]["dtensors"] == sharded
        resumed = torch.tensor(rank["grow"]["parameters"])
        assert (resumed - expected).abs().max().item() <= TOLERANCE


@pytest.fixture(scope="module")
def callbacks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    outcome = launch("fsdp.py", "callbacks", out_dir=tmp_path_factory.mktemp("cb"), timeout=150)
    assert outcome.returncode == 0, outcome.output[-4000:]  # no process hung or failed
    assert len(outcome.ranks) == 2
    ranks = [rank["callbacks"] for rank in outcome.ranks]
    for rank in ranks:
        assert rank["sharded"] == {"type": "DistributedType.FSDP", "dtensors": True}
    return ranks


def test_save_best_model_under_fsdp2_writes_the_gathered_weights_once(
    callbacks: list[dict[str, Any]],
) -> None:
    for rank in callbacks:
        assert rank["files"] == ["best.pt", "ema.pt"]  # one file each, no per-process copies
        assert rank["best_epoch"] == 1  # not the last: loading it at the end changes weights
        assert rank["best_like_ddp"] <= TOLERANCE  # model and optimizer, loaded in 1 process
        assert rank["ends_with_best"] == 0.0  # load_checkpoint put it into the sharded model
        assert rank["predictions_with_best"] <= TOLERANCE  # and the next forward uses it


def test_model_ema_under_fsdp2_averages_the_shards_like_ddp(
    callbacks: list[dict[str, Any]],
) -> None:
    for rank in callbacks:
        assert rank["ema_like_ddp"] <= TOLERANCE  # the gathered EMA weights
        assert rank["ema_is_not_the_best"] > 1e-3
        assert rank["num_ema_losses"] == 3
        assert rank["ema_losses"] <= TOLERANCE  # the EMA weights evaluated each epoch
        assert rank["ema_loaded"] == 0.0  # load_checkpoint of the EMA file, sharded
        assert rank["predictions_with_ema"] <= TOLERANCE
        assert rank["ema_predicts_otherwise"] > 1e-3


def test_model_ema_under_fsdp1_is_refused_at_train(callbacks: list[dict[str, Any]]) -> None:
    for rank in callbacks:
        refusal = rank["ema_fsdp1_refusal"]
        assert refusal.startswith("ModelEmaCallback: distributed_type must be a setup where")
        assert "(FSDP version 1)" in refusal
        assert "FullyShardedDataParallelPlugin(fsdp_version=2)" in refusal


def test_an_ema_of_fsdp2_shards_is_refused_on_another_number_of_processes(
    callbacks: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The EMA's training state holds each process's shards: 1 process cannot continue it."""
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=0.01),
        (
            SaveBestModelCallback(tmp_path / "best.pt", greater_is_better=True),
            ModelEmaCallback(decay=0.8, save_path=None),
        ),
    )
    with pytest.raises(ValueError, match="the EMA holds the shards of 2 FSDP processes, but "):
        trainer.train(
            make_regression_dataset(24),
            num_epochs=4,
            eval_dataset=make_regression_dataset(12, seed=1),
            per_device_batch_size=8,
            resume_from=callbacks[0]["ema_state"],
        )


def test_fsdp2_states_of_2_processes_resume_under_fsdp2_in_4(
    checkpoints: list[dict[str, Any]], tmp_path: Path
) -> None:
    """2 processes x batch 4 saved after epoch 1 (full and DCP); 4 x batch 2 train epoch 2."""
    dataset = make_regression_dataset(24)
    model = make_model()
    whole = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.01), ())
    whole.train(dataset, num_epochs=2, per_device_batch_size=8, train_dataloader_kwargs=UNSHUFFLED)
    state = whole.model.state_dict()
    expected = torch.cat([state[key].detach().flatten() for key in sorted(state)])
    saved = [checkpoints[0]["fsdp_state"], checkpoints[0]["fsdp_dcp_state"]]
    outcome = launch("fsdp.py", "reshard", *saved, out_dir=tmp_path, nproc=4, timeout=150)
    assert outcome.returncode == 0, outcome.output[-4000:]
    assert len(outcome.ranks) == 4
    for rank in outcome.ranks:
        for path in saved:
            assert rank["reshard"][path]["dtensors"]
            resumed = torch.tensor(rank["reshard"][path]["parameters"])
            assert (resumed - expected).abs().max().item() <= TOLERANCE
