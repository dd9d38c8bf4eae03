"""Schedulers, timm and fine-tuning in two real processes: one launch, several checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from launcher import launch
from timm.scheduler import CosineLRScheduler
from torch import nn

from pytorch_accel.schedulers import CosineLrScheduler, WSDLrScheduler

UPDATES = 20  # 5 epochs x 4 updates per process


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("schedules")


@pytest.fixture(scope="module")
def ranks(out_dir: Path) -> list[dict[str, Any]]:
    result = launch("schedules.py", out_dir=out_dir)
    assert result.returncode == 0, result.output[-4000:]
    assert len(result.ranks) == 2
    assert all(rank["num_processes"] == 2 for rank in result.ranks)
    return result.ranks


def by_hand(scheduler: Any, updates: int) -> list[float]:
    lrs = []
    for _ in range(updates):
        lrs.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.step()
    return lrs


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)


def test_cosine_ends_exactly_on_the_last_update_of_every_rank(ranks: list[dict[str, Any]]) -> None:
    expected = by_hand(
        CosineLrScheduler(
            optimizer(),
            5,
            4,
            num_warmup_epochs=1,
            num_cooldown_epochs=1,
            lr_min=1e-3,
            warmup_starting_lr=0.0,
        ),
        UPDATES,
    )
    for rank in ranks:
        cosine = rank["cosine"]
        assert cosine["per_epoch"] == 4
        assert cosine["updates"] == [UPDATES, UPDATES]
        assert cosine["lrs"] == expected
        assert cosine["lrs"][0] == 0.0
        assert cosine["lrs"][4] == 0.1
        assert cosine["lrs"][-1] == 1e-3


def test_wsd_decays_end_at_checkpoints_and_only_rank_zero_writes(
    ranks: list[dict[str, Any]], out_dir: Path
) -> None:
    expected = by_hand(
        WSDLrScheduler(
            optimizer(),
            total_steps=UPDATES,
            num_checkpoints=2,
            decay_phase_ratio=0.25,
            lr_min=0.01,
            num_warmup_steps=0,
        ),
        UPDATES,
    )
    names = [
        "checkpoint_8_wsd_pre_decay.pt",
        "checkpoint_10_wsd_post_decay.pt",
        "checkpoint_18_wsd_pre_decay.pt",
        "checkpoint_20_wsd_post_decay.pt",
    ]
    for rank in ranks:
        wsd = rank["wsd"]
        assert wsd["checkpoint_steps"] == [10, 20]
        assert wsd["lrs"] == expected
        assert wsd["lrs"][9] == wsd["lrs"][19] == 0.1 * 0.01
        assert wsd["saved"] == names
    assert sorted(path.name for path in (out_dir / "wsd").iterdir()) == sorted(names)
    final = torch.load(out_dir / "wsd" / names[-1], weights_only=True)
    params = torch.cat([value.flatten() for value in final["model_state_dict"].values()])
    assert params.tolist() == pytest.approx(ranks[0]["wsd"]["final_params"], abs=0)
    assert final["step"] == 20


def test_timm_scheduler_matches_timms_own_loop(ranks: list[dict[str, Any]]) -> None:
    scheduler = CosineLRScheduler(
        optimizer(),
        t_initial=UPDATES,
        warmup_t=4,
        warmup_lr_init=1e-3,
        lr_min=1e-4,
        t_in_epochs=False,
    )
    expected = []
    for update in range(1, UPDATES + 1):
        expected.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.step_update(num_updates=update)
        if update % 4 == 0:
            scheduler.step(update // 4)
    assert [rank["timm"] for rank in ranks] == [expected, expected]


def test_staged_fine_tuning_freezes_then_trains_everything(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert rank["staged"]["frozen_layer_unchanged"]
        assert rank["staged"]["changed_after_unfreezing"]


def test_every_rank_reports_the_same(ranks: list[dict[str, Any]]) -> None:
    assert ranks[0] == ranks[1]
