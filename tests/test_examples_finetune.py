"""Real quick runs of examples/finetune_in_stages.py: the two-stage fine-tuning recipe."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "finetune_in_stages.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("finetune_in_stages_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_stages_from_a_pretraining_checkpoint(example: ModuleType, tmp_path: Path) -> None:
    results = example.main(["--quick", "--output_dir", str(tmp_path)])

    assert (tmp_path / "pretrained.pt").is_file()
    load_result = results["load_result"]
    assert load_result.mismatched_keys == ("head.weight", "head.bias")
    assert load_result.missing_keys == load_result.unexpected_keys == ()
    assert len(load_result.loaded_keys) == 14
    trainer = results["trainer"]
    num_parameters = len(list(trainer.get_model().parameters()))
    assert results["trainable"] == [2, num_parameters]
    assert all(math.isfinite(loss) for loss in results["eval_loss"])
    # reset_run_history=False: the epochs of both stages are in one history.
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 4
    # Each group's cosine schedule ended exactly at 1% of its own learning rate.
    lrs = [group["lr"] for group in trainer.optimizer.param_groups]
    assert lrs == [0.01 * 3e-3] + [0.01 * (3e-3 / 10)] * (len(lrs) - 1)


def test_stage_one_trains_only_the_head_and_keeps_batch_norm_statistics(
    example: ModuleType, tmp_path: Path
) -> None:
    torch.save(example.SmallConvNet(num_classes=4).state_dict(), tmp_path / "weights.pt")
    model = example.SmallConvNet(num_classes=3)
    result = example.load_pretrained_weights(model, tmp_path / "weights.pt", skip=["head."])
    assert result.skipped_keys == ("head.weight", "head.bias")
    backbone = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("head")}
    head = model.head.weight.detach().clone()

    trainer, freezer = example.stage_one(model, example.parse_args(["--quick"]))

    after = model.state_dict()
    assert all(torch.equal(value, after[key]) for key, value in backbone.items())
    assert not torch.equal(head, model.head.weight)
    assert [group.is_frozen for group in freezer.get_layer_groups()] == [True, True, False, False]
    assert trainer.num_updates == 2 * 4  # 2 epochs of 39 samples in batches of 16, rounded up
